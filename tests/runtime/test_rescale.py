"""Rescaling under load on the real cluster (Kafka, MinIO, ``sfaas up`` + ``sfaas scale``).

While clients send transfers and counter bumps, the cluster is rescaled 2 → 3 → 2
workers: each moving partition's stores are shipped to the receiving worker (which follows
them, never merging), and it takes them over at an epoch boundary after a snapshot round,
exactly once. The chaos test's invariants hold throughout (``tests.runtime.test_recovery
._scenario``: every request answered exactly once, money conserved, counters exact, the
epoch log re-executes to the same replies), the moved stores were taken over from the
shipped files with nothing downloaded, and the retired worker is not restarted.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.runtime.settings import Settings
from tests.runtime import test_recovery
from tests.runtime.test_recovery import SEED, chaos_settings, log_tails

APP = "tests.runtime.apps.ledger:app"


def _rescales(s: Settings, steps: list[int], done: list[tuple[int, str]], errors: list[BaseException],
              start: float = 3.0, pause: float = 3.0) -> threading.Thread:
    """Rescale to each of ``steps`` in turn while the load runs: ``start`` seconds in, then
    ``pause`` seconds after each rescale finished (``cluster.scale`` waits for the coordinator)."""

    def go() -> None:
        try:
            time.sleep(start)
            for workers in steps:
                done.append((workers, cluster.scale(s, workers, timeout=120)))
                time.sleep(pause)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=go, name="rescales", daemon=True)
    t.start()
    return t


def _maps(s: Settings) -> list[tuple[int, list[int]]]:
    """The partition maps the coordinator switched to: ``(last epoch under the old map, new map)``."""
    log = (cluster.state_dir(s) / "coordinator.log").read_text()
    return [(int(e), [int(x) for x in m.split(",")])
            for e, m in re.findall(r"epochs after (\d+) run under the map \[([\d, ]+)\]", log)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lease", [0, 8], ids=["coordinator-driven", "leased"])
def test_rescale_two_three_two_under_load_loses_and_duplicates_nothing(kafka, minio, tmp_path: Path,
                                                                     monkeypatch: Any, lease: int) -> None:
    """``lease``: a switch under leased epochs ends the run at the switch's epoch and begins
    a new one under the new membership (``coordinator.protocols.lease``)."""
    s = chaos_settings(kafka, minio, tmp_path, epoch_lease=lease)
    done: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    monkeypatch.setattr(test_recovery, "KILLS", 0)
    monkeypatch.setattr(test_recovery, "COORDINATOR_KILLS", 0)
    monkeypatch.setattr(test_recovery, "SECONDS", 16.0)
    cluster.up(s, APP, 2, timeout=90)
    report: dict[str, object] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]
        rescales = _rescales(s, [3, 2], done, errors)
        asyncio.run(test_recovery._scenario(s, cs, random.Random(SEED), report, tmp_path / "replay",
                                            lambda: _maps(s)))
        rescales.join(120)
        assert not errors, errors
        assert [w for w, _ in done] == [3, 2], (done, report)
        report["rescales"] = done
        coord_log = (cluster.state_dir(s) / "coordinator.log").read_text()
        switches = re.findall(r"rescaled to (\d) workers at round (\d+): moved (\d+) partitions; epochs paused ([\d.]+) s",
                              coord_log)
        assert [w for w, *_ in switches] == ["3", "2"], switches
        assert all(int(n) > 0 for _w, _r, n, _p in switches), switches
        report["switches"] = switches
        # the moved stores came from the shipped files: nothing downloaded at any takeover
        takeovers = [m for f in cluster.state_dir(s).glob("worker-*.log")
                     for m in re.findall(r"took over (\d+) stores at round \d+: (\d+) bytes shipped, \d+ bytes in their files, "
                                         r"(\d+) bytes downloaded",
                                         f.read_text())]
        assert len(takeovers) == 2 and all(int(d) == 0 for _n, _s, d in takeovers), takeovers
        report["takeovers"] = takeovers
        # two workers again; the retired one was not restarted
        procs = cluster.ps(s)
        workers = sorted(p.index for p in procs if p.role == "worker" and p.alive)
        assert workers == [0, 1], procs
        assert not any(p.gave_up for p in procs), procs
        assert "recovery" not in coord_log.split("rescale requested")[1], "a rescale caused a recovery"
        # under leases, each switch ended a run and the new membership began another
        assert coord_log.count("leased run from epoch") == (3 if lease else 0), "not the epochs asked for"
        print(f"rescale report: {report}")
    except BaseException:
        print(f"rescale test (seed {SEED}) failed; report {report}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)


@pytest.mark.timeout(600)
def test_a_coordinator_restarted_after_a_rescale_keeps_the_new_size_and_map(kafka, minio, tmp_path: Path,
                                                                         monkeypatch: Any) -> None:
    """The coordinator is SIGKILLed after a 2 → 3 rescale: restarted by the supervisor, it
    takes the membership size and partition map from the newest round (which names them),
    the three workers rejoin, and the chaos invariants hold across both."""
    s = chaos_settings(kafka, minio, tmp_path)
    done: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    kill = test_recovery._kill

    def act(_s: Settings, role: str, rnd: random.Random) -> int | None:
        return kill(_s, role, rnd) if done else None  # the coordinator dies once the rescale finished

    monkeypatch.setattr(test_recovery, "_kill", act)
    monkeypatch.setattr(test_recovery, "KILLS", 0)
    monkeypatch.setattr(test_recovery, "COORDINATOR_KILLS", 1)
    monkeypatch.setattr(test_recovery, "SECONDS", 16.0)
    cluster.up(s, APP, 2, timeout=90)
    report: dict[str, object] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]
        rescales = _rescales(s, [3], done, errors, start=2.0)
        asyncio.run(test_recovery._scenario(s, cs, random.Random(SEED), report, tmp_path / "replay",
                                            lambda: _maps(s)))
        rescales.join(120)
        assert not errors, errors
        assert [w for w, _ in done] == [3], (done, report)
        assert [k[1] for k in report["killed"]] == ["coordinator"], report  # type: ignore[index]
        coord_log = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert re.search(r"was taken with 3 workers \(a rescale\); waiting for 3", coord_log), coord_log[-3000:]
        procs = cluster.ps(s)
        workers = sorted(p.index for p in procs if p.role == "worker" and p.alive)
        assert workers == [0, 1, 2], procs
        assert not any(p.gave_up for p in procs), procs
        print(f"rescale + coordinator restart report: {report}")
    except BaseException:
        print(f"rescale test (seed {SEED}) failed; report {report}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
