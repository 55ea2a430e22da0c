"""A whole cluster in one process (``sfaas.sim.cluster``): the real coordinator and workers
on the simulated Kafka, object store, network and clock, a bank workload, its invariants,
and a seed that gives the same trace twice — in one process and in two."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys

import pytest

from examples.bank import app
from sfaas.app import App
from sfaas.runtime import ports
from sfaas.runtime.settings import Settings
from sfaas.sim.__main__ import ROLES
from sfaas.sim.cluster import Bank, Process, Roles, simulate

SEEDS = range(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_request_is_answered_once_and_money_is_conserved(seed: int) -> None:
    print(f"seed {seed}")
    o = simulate(app, ROLES, seed, workers=2, bank=Bank(accounts=6, transfers=60))
    assert o.violations == []
    assert o.sent == 6 + 60 + 6 == len(o.replies) and not o.duplicates
    assert sum(o.balances.values()) == 6 * 100 and len(o.balances) == 6
    assert o.committed >= 6 + 6 and o.aborted == o.sent - o.committed


@pytest.mark.parametrize("seed", [3, 4])
def test_a_seed_gives_the_same_trace_twice(seed: int) -> None:
    print(f"seed {seed}")
    runs = [simulate(app, ROLES, seed, workers=3, bank=Bank(transfers=80)) for _ in range(2)]
    assert runs[0].trace == runs[1].trace and len(runs[0].trace) > 300
    other = simulate(app, ROLES, seed + 100, workers=3, bank=Bank(transfers=80))
    assert other.trace != runs[0].trace  # (the seed matters)


def test_the_command_prints_the_same_trace_twice_in_two_processes() -> None:
    """Across processes too: string hashing (``PYTHONHASHSEED``) differs between them."""
    print("seed 5")
    outs = []
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        run = subprocess.run([sys.executable, "-m", "sfaas.sim", "--app", "examples.bank:app",
                              "--seed", "5", "--transfers", "40", "--trace"],
                             capture_output=True, text=True, env=env, check=True)
        outs.append(run.stdout)
    assert outs[0] == outs[1]
    assert outs[0].startswith("seed 5\n") and "sent 56, answered 56" in outs[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_crashed_worker_is_replaced_and_nothing_is_lost_or_answered_twice(seed: int) -> None:
    """Worker 1 dies mid-load (its connections break, its task is cancelled) and a fresh
    process takes its slot: the cluster recovers (from round 0, replaying the epoch log),
    every request is answered once and the money is all there."""
    print(f"seed {seed}")
    o = simulate(app, ROLES, seed, workers=2, bank=Bank(transfers=300), crash=(0.6, 0.4))
    assert o.violations == []
    assert o.sent == len(o.replies) == 8 + 300 + 8 and not o.duplicates
    assert sum(o.balances.values()) == 800
    assert any("fault crash worker-1" in line for line in o.trace)
    # the new process's producers fenced the dead one's (its slot: whichever it had)
    assert [line for line in o.trace if " init sim.bank.out.slot-" in line
            and line.endswith(" epoch 1")]


def test_a_crash_run_gives_the_same_trace_twice() -> None:
    print("seed 8")
    runs = [simulate(app, ROLES, 8, bank=Bank(transfers=300), crash=(0.6, 0.4))
            for _ in range(2)]
    assert runs[0].trace == runs[1].trace


@pytest.mark.parametrize("store", ["memonly", "hybridlog"])
@pytest.mark.parametrize("seed", [2, 8])
def test_a_crash_after_rounds_restores_the_newest_round_the_same_way_twice(
        seed: int, store: str, caplog: pytest.LogCaptureFixture) -> None:
    """Rounds come due on virtual time and upload on the loop (``statestores.bgloop``): a
    crash after a few recovers from the newest (not round 0) and replays the epoch log
    after it — the path of the old restore bugs, hybridlog's tail among them (its
    regions flush and its WALs seal in a run: ``SMALL_STORES``) — and a seed runs the
    same way twice."""
    print(f"seed {seed}")
    caplog.set_level(logging.INFO, logger="sfaas.coordinator.recovery")
    runs = [simulate(app, ROLES, seed, bank=Bank(transfers=300), crash=(1.2, 0.4), rounds=0.2,
                     store=store) for _ in range(2)]
    o = runs[0]
    assert o.violations == [] and o.sent == len(o.replies) == 8 + 300 + 8
    crash = next(i for i, line in enumerate(o.trace) if "fault crash worker-1" in line)
    published = [line for line in o.trace[:crash] if "object put sim/bank/_rounds/blobs/round-" in line]
    assert len(published) >= 3
    rolled = [int(m.group(1)) for r in caplog.records
              if (m := re.search(r"rolled back to round (\d+)", r.getMessage()))]
    assert rolled and min(rolled) >= 3
    assert runs[0].trace == runs[1].trace


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_worker_cut_from_the_coordinator_for_a_second_recovers(seed: int) -> None:
    """Found by the simulator (issue 51): worker 1, cut from the coordinator for 1 s,
    rejoins it (``worker/membership.py:Membership.rejoin``, a new generation) but kept its
    channel to worker 0 opened under the old one, which worker 0 refuses after the
    recovery (``worker/calls.py:stale_generation``): no request was answered again. Fixed
    in ``worker/links.py:PeerLinks.connect`` (``tests/runtime/test_peer_links.py``)."""
    print(f"seed {seed}")
    o = simulate(app, ROLES, seed, bank=Bank(transfers=600), cut=(1.0, 1.0))
    assert o.violations == []


async def _refused() -> None:
    raise ConnectionRefusedError("the network is dead")


class _ExitsAndGoesOn:
    """Worker 1's first process: the real worker, and a task of it that calls the process's
    exit (as a fenced worker does) and then goes on awaiting, as code after a real
    ``os._exit`` never would."""

    def __init__(self, real: Process, its: ports.Ports) -> None:
        self._real, self._its = real, its

    async def run(self) -> None:
        async def exit_and_go_on() -> None:
            await asyncio.sleep(0.5)
            self._its.process.exit(77)
            while True:  # (the rejoin a fenced worker's follow task went on to: a connect
                try:     # on a dead network fails at once, and wait_for drops a cancel)
                    await asyncio.wait_for(_refused(), 1.0)
                except OSError:
                    pass
                await asyncio.sleep(0.1)

        side = asyncio.ensure_future(exit_and_go_on())
        try:
            await self._real.run()
        finally:
            await asyncio.gather(side, return_exceptions=True)


def test_a_process_that_exits_ends_though_the_caller_goes_on() -> None:
    """The process port's exit never returns and ends every task of the process: the
    supervisor restarts it and the cluster serves every request (seed 133: a fenced
    worker's rejoin went on for ever on a dead network, its cancellation dropped by
    ``asyncio.wait_for``, and its slot was never restarted)."""
    made: list[str] = []

    def worker(s: Settings, a: App, name: str, its: ports.Ports) -> Process:
        real = ROLES.worker(s, a, name, its)
        made.append(name)
        return _ExitsAndGoesOn(real, its) if made.count(name) == 1 and name == "worker-1" \
            else real

    o = simulate(app, Roles(ROLES.coordinator, worker), 7, workers=2,
                 bank=Bank(accounts=6, transfers=60))
    assert any("process worker-1 exits with 77" in line for line in o.trace)
    assert made.count("worker-1") >= 2  # (restarted)
    assert o.violations == [] and o.sent == len(o.replies)


class _FailsAndLeavesATask:
    """Worker 1's first process: a task of it notes the virtual time every 0.1 s, and its
    main task fails on its own 0.5 s in (no process exit called: as a ``ClusterError``
    ending ``worker.service.run_worker``)."""

    def __init__(self, its: ports.Ports, notes: list[float]) -> None:
        self._its, self._notes = its, notes
        self._side: asyncio.Future[None] | None = None

    async def _note(self) -> None:
        while True:
            self._notes.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.1)

    async def run(self) -> None:
        self._side = asyncio.ensure_future(self._note())  # (never awaited nor cancelled here)
        await asyncio.sleep(0.5)
        raise RuntimeError("the process fails on its own")


def test_a_process_whose_main_task_fails_ends_whole() -> None:
    """An OS process whose main returns or raises is gone with every task and socket: the
    simulator's supervisor ends the others too before it restarts the process. (They went
    on: a coordinator failing its startup left the handler of a connection in its
    handshake behind, which took a worker's registration for the dead coordinator, and the
    new one waited for that worker for ever — seed 96, ``--cut 0.2,1.8 --slow
    0.03,2.32,worker-0,coordinator,0.95``.)"""
    notes: list[float] = []
    first: list[ports.Ports] = []

    def worker(s: Settings, a: App, name: str, its: ports.Ports) -> Process:
        if name == "worker-1" and not first:
            first.append(its)
            return _FailsAndLeavesATask(its, notes)
        return ROLES.worker(s, a, name, its)

    o = simulate(app, Roles(ROLES.coordinator, worker), 7, workers=2,
                 bank=Bank(accounts=6, transfers=60))
    assert any("exit worker-1: RuntimeError" in line for line in o.trace)
    assert notes and max(notes) < 0.5 + 1e-9  # (nothing of it ran after its exit)
    assert getattr(first[0].network, "dead", False)
    assert o.violations == [] and o.sent == len(o.replies)
