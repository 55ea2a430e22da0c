"""A cut between two workers — not between a worker and the coordinator — while both stay
members (``wire.PeerBroken``, ``tests/runtime/test_peer_broken.py``).

The calls, results and reports the broken channels held are lost; before the workers told
the coordinator, the epoch waiting for them waited for ever with both workers heartbeating:
13 of the first 30 seeds of the budget, with such a cut in place of their drawn one, left
36–153 requests unanswered. Now the coordinator recovers, the rollback connects the
workers again (once the cut heals), and every request is answered once."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from examples.bank import app
from sfaas.sim import cluster
from sfaas.sim.budget import run_seed
from sfaas.sim.faults import Schedule, draw
from tests.sim.test_budget import ROLES


async def _cut_the_workers(self: cluster.SimCluster, at: float, seconds: float) -> None:
    """The run's cut between worker 0 and worker 1, in place of worker 1 and the coordinator."""
    await asyncio.sleep(at)
    self._trace("fault cut worker-0 worker-1")
    self.net.cut("worker-0", "worker-1")
    await asyncio.sleep(seconds)
    self._trace("fault heal worker-0 worker-1")
    self.net.heal("worker-0", "worker-1")


@pytest.fixture
def peer_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.SimCluster, "_cut", _cut_the_workers)


@pytest.mark.parametrize("at,seconds", [(0.3, 0.1), (0.5, 0.5), (0.05, 1.2)])
def test_a_cut_between_two_workers_alone(peer_cuts: None, at: float, seconds: float) -> None:
    o = run_seed(app, ROLES, 1, Schedule(cut=(at, seconds)))
    print(f"seed 1, workers cut apart at {at} s for {seconds} s: {len(o.replies)} of "
          f"{o.sent} answered")
    assert o.violations == []
    assert len(o.replies) == o.sent and not o.duplicates
    assert any("cut worker-0 worker-1" in line for line in o.trace)


@pytest.mark.parametrize("seed", range(0, 30, 3))
def test_a_cut_between_two_workers_among_a_seeds_faults(peer_cuts: None, seed: int) -> None:
    r = random.Random(seed)
    schedule = dataclasses.replace(
        draw(seed), cut=(round(r.uniform(0.1, 1.0), 2), round(r.uniform(0.05, 1.0), 2)))
    print(f"seed {seed}: {' '.join(schedule.args())} (the cut between worker 0 and 1)")
    o = run_seed(app, ROLES, seed, schedule)
    assert o.violations == []
