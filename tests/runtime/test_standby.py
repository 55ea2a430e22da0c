"""Standby workers on the real cluster (Kafka, MinIO, ``sfaas up --standbys 1``).

A primary is SIGKILLed and its data directory deleted (a lost machine) while clients send
transfers and counter bumps; its standby — which followed the primary's stores from the
shipped files — is promoted, restores the round from its own files (zero bytes
downloaded), and the cluster goes on; the dead primary's restarted process becomes the
slot's new standby. The chaos test's invariants hold throughout: every request answered
exactly once, money conserved, counters exact, and the epoch log re-executes to the same
replies (``tests.runtime.test_recovery._scenario``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from launcher import cluster
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote, stores_root
from tests.runtime import test_recovery
from tests.runtime.test_recovery import SEED, chaos_settings, log_tails

APP = "tests.runtime.apps.ledger:app"


def _roles(s: Settings) -> list[tuple[str, int]]:
    return sorted((p.role, p.index) for p in cluster.ps(s) if p.alive)


def _wait_roles(s: Settings, want: list[tuple[str, int]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _roles(s) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster roles {_roles(s)} did not become {want} within {timeout} s")
        time.sleep(0.2)


def _lose_machine(s: Settings, victims: list[tuple[int, int, str]], slot: int | None = None,  # type: ignore[no-untyped-def]
                  after_round: int = 0):
    """A replacement for the chaos test's kill: delete a primary's (``slot``'s, or a random
    one's) data directory, SIGKILL it — once round ``after_round`` is complete (before that
    it returns None: the scenario asks again half a second later)."""

    def kill(_s: Settings, role: str, rnd: random.Random) -> int | None:
        if after_round:
            latest = Rounds(rounds_remote(s, "ledger")).latest()
            if latest is None or latest.round < after_round:
                return None
        procs = [p for p in cluster.ps(s) if p.role == "worker" and p.alive and slot in (None, p.index)]
        standbys = [p for p in cluster.ps(s) if p.role == "standby" and p.alive]
        if not procs or not standbys:
            return None
        victim = rnd.choice([p for p in procs if any(sb.index == p.index for sb in standbys)] or procs)
        root = stores_root(s, "ledger")
        for op in os.listdir(root):
            for d in os.listdir(os.path.join(root, op)):
                if not d[:1] == "p":  # (LAYOUT.json: how the stores were written)
                    continue
                if int(d[1:].split(".")[0]) % 2 == victim.index:
                    shutil.rmtree(os.path.join(root, op, d), ignore_errors=True)
        os.kill(victim.pid, signal.SIGKILL)
        sb = next(p for p in standbys if p.index == victim.index)
        victims.append((victim.index, victim.pid, sb.log))
        return victim.pid

    return kill


@pytest.mark.timeout(600)
@pytest.mark.parametrize("standby_dies_first", [False, True], ids=["standby", "replaced-standby"])
def test_a_standby_takes_over_a_lost_machine_without_a_download(kafka, minio, tmp_path: Path, monkeypatch,
                                                                standby_dies_first: bool) -> None:
    """With ``standby_dies_first`` a standby is SIGKILLed before the load: the supervisor
    restarts it, it stands by again and catches up from its primary, and it is the one
    promoted when that primary's machine is lost."""
    s = chaos_settings(kafka, minio, tmp_path)
    victims: list[tuple[int, int, str]] = []
    monkeypatch.setattr(test_recovery, "_kill", _lose_machine(s, victims))
    monkeypatch.setattr(test_recovery, "KILLS", 1)
    monkeypatch.setattr(test_recovery, "COORDINATOR_KILLS", 0)
    monkeypatch.setattr(test_recovery, "SECONDS", 12.0)
    cluster.up(s, APP, 2, timeout=90, standbys=1)
    report: dict[str, object] = {"seed": SEED}
    try:
        _wait_roles(s, [("coordinator", 0), ("standby", 0), ("standby", 1), ("worker", 0), ("worker", 1)], 60)
        if standby_dies_first:
            (dead,) = [p for p in cluster.ps(s) if p.role == "standby" and p.index == 1]
            os.kill(dead.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not any(p.role == "standby" and p.index == 1 and p.alive and p.pid != dead.pid for p in cluster.ps(s)):
                assert time.monotonic() < deadline, f"the killed standby was not replaced: {cluster.ps(s)}"
                time.sleep(0.2)
            # once it follows, every round's report waits for its acknowledgement: the machine
            # is lost only after two more rounds completed under the load (so it holds the newest)
            first = Rounds(rounds_remote(s, "ledger")).latest()
            monkeypatch.setattr(test_recovery, "_kill",
                                _lose_machine(s, victims, slot=1, after_round=(first.round if first else 0) + 2))
        cs = cluster.cluster_settings(s)[1]
        asyncio.run(test_recovery._scenario(s, cs, random.Random(SEED), report, tmp_path / "replay"))
        assert len(victims) == 1, report
        slot, _pid, standby_log = victims[0]
        coord_log = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert "promoting standby" in coord_log and f"to worker {slot}" in coord_log
        restored = re.findall(r"restored (\S+) to round (\d+): (\d+) of (\d+) files downloaded", Path(standby_log).read_text())
        assert restored, "the promoted standby never restored a round"
        report["promoted_restores"] = restored
        downloaded = [int(n) for _s, _r, n, _t in restored]
        assert downloaded == [0] * len(downloaded), f"the promoted standby downloaded files: {restored}"
        # the dead primary's restarted process is the slot's new standby
        _wait_roles(s, [("coordinator", 0), ("standby", 0), ("standby", 1), ("worker", 0), ("worker", 1)], 60)
        ready = json.loads((cluster.state_dir(s) / "ready").read_text())
        assert ready["promotions"] == 1
        # the new standby looked for the newest round's files in MinIO before asking its
        # primary (this app's small stores hold only WALs there, which are never seeded)
        (fresh,) = [p for p in cluster.ps(s) if p.role == "standby" and p.index == slot]
        deadline = time.monotonic() + 30
        while not re.search(r"seeded with \d+ files \(\d+ bytes\) of snapshot [1-9]", Path(fresh.log).read_text()):
            assert time.monotonic() < deadline, f"the new standby of worker {slot} did not seed from MinIO"
            time.sleep(0.2)
        print(f"standby report: {report}")
    except BaseException:
        print(f"standby test (seed {SEED}) failed; report {report}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
