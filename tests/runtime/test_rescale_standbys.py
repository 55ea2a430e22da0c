"""Rescaling a cluster that runs standbys, under load on the real cluster (Kafka, MinIO,
``sfaas up --standbys 1`` + ``sfaas scale``).

A 2-worker cluster with a standby each is rescaled to 3 workers while clients send
transfers and counter bumps: the supervisor starts two processes (the new worker and its
standby), the standbys of the slots whose partitions changed follow the new ones. Then a
primary whose partitions changed is SIGKILLed: its standby takes over from its own files
(nothing downloaded), with exactly the partitions the map gives the slot. Then the cluster
is scaled down to 2 (the retired slot's standby retires with it, not restarted) and a
primary that gained a partition is SIGKILLed again, same checks. The chaos test's
invariants hold throughout (``tests.runtime.test_recovery._scenario``).
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import random
import re
import signal
import sys
import threading
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from coordinator.protocols.standby import Standbys
from coordinator.state import ClusterState, Member
from launcher import cluster
from sfaas.errors import ChannelClosed, ClusterError
from sfaas.runtime import wire
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote
from tests.runtime import test_recovery
from tests.runtime.test_recovery import SEED, chaos_settings, log_tails
from tests.runtime.test_rescale import _maps
from worker.protocols.standby import _Standby

APP = "tests.runtime.apps.ledger:app"
#: seconds of load at most: the load stops TAIL_SECONDS after the rescales and failovers
#: (and the waits between them) are done, typically 30-40 s in
LOAD_SECONDS = 75.0
TAIL_SECONDS = 3.0


def _current_map(s: Settings) -> list[int]:
    maps = _maps(s)
    assert maps, "no rescale switched yet"
    return maps[-1][1]


def _followed(log_path: str) -> list[int] | None:
    """The partitions a standby's log says it follows now (None: none yet)."""
    found = re.findall(r"following \d+ stores of partitions \[([\d, ]*)\]", Path(log_path).read_text())
    return [int(x) for x in found[-1].split(",") if x.strip()] if found else None


def _wait(what: str, cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.25)


def _ready_doc(s: Settings) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((cluster.state_dir(s) / "ready").read_text())
        return doc
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _standbys_follow(s: Settings, workers: int) -> bool:
    """Every slot of ``workers`` has a primary and a standby that follows its partitions
    by the map in force (the coordinator's ready file, and the standby's own log)."""
    owners = _current_map(s)
    doc = _ready_doc(s)
    if doc.get("recovering") or sorted(w["index"] for w in doc.get("workers", []) if w["alive"]) != list(range(workers)):
        return False
    procs = [p for p in cluster.ps(s) if p.alive]
    for slot in range(workers):
        sbs = [p for p in procs if p.role == "standby" and p.index == slot]
        if not any(_followed(p.log) == owned(owners, slot) for p in sbs):
            return False
    return all(sb.get("following") for sb in doc.get("standbys", []))


def _standby_gauge(s: Settings) -> dict[int, float]:
    """The coordinator's ``sfaas_standbys{worker}`` gauge: standbys per slot."""
    (coord,) = [p for p in cluster.ps(s) if p.role == "coordinator" and p.alive]
    with urllib.request.urlopen(coord.metrics, timeout=10) as r:
        text = r.read().decode()
    return {int(w): float(v) for w, v in re.findall(r'^sfaas_standbys\{worker="(\d+)"\} (\S+)$', text, re.M)}


def _rounds_after(s: Settings, n: int) -> None:
    """Wait until ``n`` more snapshot rounds completed (each one's report waited for the
    standbys to hold it: a promotion then needs no download)."""
    first = Rounds(rounds_remote(s, "ledger")).latest()
    base = first.round if first else 0

    def done() -> bool:
        latest = Rounds(rounds_remote(s, "ledger")).latest()
        return latest is not None and latest.round >= base + n

    _wait(f"{n} more snapshot rounds", done, 60)


def _fail_over(s: Settings, slot: int, report: dict[str, Any], what: str) -> None:
    """SIGKILL primary ``slot``; wait until its standby took over (the coordinator's
    membership names the standby's process in the slot)."""
    doc = _ready_doc(s)  # (``ps`` shows a process the coordinator does not list by its supervisor slot)
    (victim,) = [w["pid"] for w in doc["workers"] if w["index"] == slot and w["alive"]]
    logs = {p.pid: p.log for p in cluster.ps(s)}
    standbys = [sb["pid"] for sb in doc["standbys"] if sb["of"] == slot and sb["pid"] in logs]
    assert standbys, f"worker {slot} has no standby: {doc}"
    # (a log file is its supervisor slot's: earlier processes of the slot wrote above here)
    offsets = {pid: len(Path(logs[pid]).read_text()) for pid in standbys}
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()

    def promoted() -> list[int]:
        return [w["pid"] for w in _ready_doc(s).get("workers", [])
                if w["index"] == slot and w["alive"] and w["pid"] in offsets]

    _wait(f"a standby of worker {slot} promoted", promoted, 60)
    (new,) = promoted()
    report.setdefault("failovers", []).append({"what": what, "slot": slot, "killed": victim,
                                               "promoted": new, "log": logs[new],
                                               "offset": offsets[new],
                                               "owned": owned(_current_map(s), slot),
                                               "seconds": round(time.monotonic() - t0, 2)})


def _orchestrate(s: Settings, rnd: random.Random, report: dict[str, Any], errors: list[BaseException]) -> threading.Thread:
    """2 → 3, a failover of a changed slot, 3 → 2, a failover of a slot that gained a partition."""

    def go() -> None:
        try:
            time.sleep(2.0)
            before = _current_map(s) if _maps(s) else [p % 2 for p in range(test_recovery.PARTITIONS)]
            report["scaled"] = [(3, cluster.scale(s, 3, timeout=120))]
            _wait("every slot's standby following its partitions after 2 → 3", lambda: _standbys_follow(s, 3), 90)
            report["gauge"] = [_standby_gauge(s)]
            assert report["gauge"][0] == {0: 1.0, 1: 1.0, 2: 1.0}, report["gauge"]
            after = _current_map(s)
            changed = [i for i in range(3) if owned(before, i) != owned(after, i)]
            report["maps"] = [before, after]
            _rounds_after(s, 2)
            _fail_over(s, rnd.choice(changed), report, "after 2 → 3")
            _wait("every slot's standby following again", lambda: _standbys_follow(s, 3), 90)
            report["scaled"].append((2, cluster.scale(s, 2, timeout=120)))
            _wait("every slot's standby following its partitions after 3 → 2", lambda: _standbys_follow(s, 2), 90)
            report["gauge"].append(_standby_gauge(s))
            assert report["gauge"][1] == {0: 1.0, 1: 1.0}, report["gauge"]
            final = _current_map(s)
            report["maps"].append(final)
            gained = [i for i in range(2) if set(owned(final, i)) - set(owned(after, i))]
            assert gained, (after, final)
            _rounds_after(s, 2)
            _fail_over(s, rnd.choice(gained), report, "after 3 → 2")
            _wait("every slot's standby following at the end", lambda: _standbys_follow(s, 2), 90)
            report["orchestrated"] = True
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=go, name="orchestrate", daemon=True)
    t.start()
    return t


@pytest.mark.timeout(900)
def test_rescale_with_standbys_then_failover_without_a_download(kafka: Any, minio: Any, tmp_path: Path,
                                                                  monkeypatch: Any) -> None:
    s = chaos_settings(kafka, minio, tmp_path)
    print(f"rescale-with-standbys test: seed {SEED}")
    faulthandler.dump_traceback_later(840, exit=False, file=sys.stderr)
    monkeypatch.setattr(test_recovery, "KILLS", 0)
    monkeypatch.setattr(test_recovery, "COORDINATOR_KILLS", 0)
    errors: list[BaseException] = []
    report: dict[str, Any] = {"seed": SEED}
    cluster.up(s, APP, 2, timeout=90, standbys=1)
    try:
        _wait("a standby following each worker", lambda: _standbys_follow_initial(s), 60)
        cs = cluster.cluster_settings(s)[1]
        steps = _orchestrate(s, random.Random(SEED), report, errors)
        finished: list[float] = []

        def done() -> bool:  # (the steps over, or failed: the load goes on a little longer)
            if not finished and not steps.is_alive():
                finished.append(time.monotonic())
            return bool(finished) and time.monotonic() - finished[0] > TAIL_SECONDS

        asyncio.run(test_recovery._scenario(s, cs, random.Random(SEED), report, tmp_path / "replay",
                                            lambda: _maps(s), seconds=LOAD_SECONDS, done=done))
        steps.join(300)
        assert not errors, errors
        assert report.get("orchestrated"), report
        assert [w for w, _ in report["scaled"]] == [3, 2], report
        coord_log = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert "promoting standby" in coord_log
        for f in report["failovers"]:
            text = Path(f["log"]).read_text()[f["offset"]:]
            # the promoted standby held exactly the slot's partitions by the map in force ...
            promoted = sorted({int(p) for p in re.findall(r"promoted \w+/p(\d+) to snapshot", text)})
            assert promoted == f["owned"], (f, promoted)
            assert "the promoted stores are not this slot's" not in text, f
            # ... and restored the round from its own files
            restored = re.findall(r"restored (\S+) to round (\d+): (\d+) of (\d+) files downloaded", text)
            assert restored, f"the promoted standby never restored a round: {f}"
            assert all(int(n) == 0 for _s, _r, n, _t in restored), f"the promoted standby downloaded files: {restored}"
            f["restored"] = len(restored)
        # two workers with a standby each; the retired primary and standby were not restarted
        procs = cluster.ps(s)
        assert sorted((p.role, p.index) for p in procs if p.alive and p.role != "coordinator") == \
            [("standby", 0), ("standby", 1), ("worker", 0), ("worker", 1)], procs
        assert not any(p.gave_up for p in procs), procs
        sup_log = (cluster.state_dir(s) / "supervisor.log").read_text()
        assert sup_log.count("retired by a rescale; not restarted") == 2, sup_log[-3000:]
        print(f"rescale-with-standbys report: {report}")
    except BaseException:
        print(f"rescale-with-standbys test (seed {SEED}) failed; report {report}\n{log_tails(s)}")
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()
        cluster.down(s)


def _standbys_follow_initial(s: Settings) -> bool:
    doc = _ready_doc(s)
    return sorted(sb["of"] for sb in doc.get("standbys", []) if sb.get("following")) == [0, 1]


# -- the coordinator's side alone (no processes) ----------------------------------------------

class _Chan:
    """A channel that keeps what is sent on it."""

    def __init__(self) -> None:
        self.sent: list[wire.Message] = []
        self.closed = False
        self.peer = "test"

    def send(self, msg: wire.Message) -> None:
        if self.closed:
            raise ChannelClosed("closed")
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True


def _follows(chan: _Chan) -> list[list[int]]:
    return [m.owned for m in chan.sent if isinstance(m, wire.Follow)]


def test_standbys_follow_their_primarys_partitions_across_a_rescale() -> None:
    """2 → 3 → 2 workers with a standby each: each standby is told its primary's partitions
    by the map in force (not round robin), again only when they change; a registrant during
    the scale-up stands by for the new slot; the retired slot's standby gets a Follow naming
    no partition (it exits with EXIT_RETIRED)."""
    state = ClusterState(2)
    state.configure(4, 2, [0, 1, 0, 1])

    def member(i: int) -> Member:
        m = Member.of(i, wire.Register(f"w{i}", "127.0.0.1", 7000 + i, 100 + i, repl_port=8000 + i),
                      _Chan())  # type: ignore[arg-type]
        m.ready.set()
        return m

    for i in range(2):
        state.add_member(member(i))

    async def newest() -> int:
        return 0

    sbs = Standbys(state, 2, 1, types.SimpleNamespace(newest_complete=newest),  # type: ignore[arg-type]
                   types.SimpleNamespace(changed=lambda: None))
    chans = {}
    for i in range(2):
        reg = wire.Register(f"sb{i}", "127.0.0.1", 7100 + i, 200 + i)
        slot = sbs.slot_for(reg)
        assert slot == i
        chans[i] = _Chan()
        sbs.add(reg, chans[i], slot)  # type: ignore[arg-type]
    assert _follows(chans[0]) == [[0, 2]] and _follows(chans[1]) == [[1, 3]]
    late = wire.Register("sb2", "127.0.0.1", 7102, 202)
    assert sbs.slot_for(late) is None, "every slot has its standby: no role before a rescale"
    sbs.expect(3)  # a scale-up to 3 is under way: the next registrant stands by for slot 2
    assert sbs.slot_for(late) == 2
    chans[2] = _Chan()
    sbs.add(late, chans[2], 2)  # type: ignore[arg-type]
    assert _follows(chans[2]) == [], "slot 2 has no primary yet"
    state.adopt([0, 1, 0, 2], [*state.members, member(2)])
    sbs.rescaled()
    assert _follows(chans[0]) == [[0, 2]], "slot 0 kept its partitions: not told again"
    assert _follows(chans[1]) == [[1, 3], [1]]
    assert _follows(chans[2]) == [[3]]
    sbs.expect(None)
    sbs.expect(2)  # and back to 2: slot 2 retires, its standby with it
    state.adopt([0, 1, 0, 1], state.members[:2])
    sbs.rescaled()
    assert _follows(chans[1]) == [[1, 3], [1], [1, 3]]
    assert _follows(chans[2]) == [[3], []]
    assert sorted(sbs.by_slot) == [0, 1] and all(len(v) == 1 for v in sbs.by_slot.values())

    async def lose_one() -> None:  # a promotion names the slot's partitions by the map in force
        state.adopt([0, 1, 1, 1], state.members[:2])
        state.mark_lost(state.members[1])
        assert sbs.promote(1)
        await asyncio.sleep(0.05)

    asyncio.run(lose_one())
    (promote,) = [m for m in chans[1].sent if isinstance(m, wire.Promote)]
    assert (promote.index, promote.owned) == (1, [1, 2, 3]), promote


def test_a_follow_naming_partitions_outside_the_topic_is_refused() -> None:
    f = wire.Follow(1, 2, 4, [1, 7], "127.0.0.1", 1)
    with pytest.raises(ClusterError, match=r"owned partitions \[1, 7\] must be distinct and in \[0, 4\)"):
        _Standby._mine(f)
    assert _Standby._mine(wire.Follow(1, 3, 4, [3, 1], "127.0.0.1", 1)) == [1, 3]


def _two_ready_primaries() -> ClusterState:
    """Two slots over four partitions, each with a ready primary shipping on a port."""
    state = ClusterState(2)
    state.configure(4, 2, [0, 1, 0, 1])
    for i in range(2):
        m = Member.of(i, wire.Register(f"w{i}", "127.0.0.1", 7000 + i, 100 + i, repl_port=8000 + i),
                      _Chan())  # type: ignore[arg-type]
        m.ready.set()
        state.add_member(m)
    return state


def test_a_promotion_that_never_comes_back_frees_the_slot_and_recruits_an_idle_standby() -> None:
    """A slot lost while its promoted standby was cut off too (the nemesis: the coordinator
    partitioned from everyone): the reservation ends GONE_SECONDS after the standby went
    silent, not after RESERVE_SECONDS; the restarted primary, standing by without holding
    anything, is told to register again; a registrant asking to stand by for a lost slot
    nobody is coming for takes it instead; a silent standby is never promoted."""
    from coordinator.protocols import standby as sbmod

    now = [1000.0]  # (the standbys' clock only: the event loop keeps the real one)
    state = _two_ready_primaries()

    async def newest() -> int:
        return 0

    async def scenario() -> None:
        sbs = Standbys(state, 2, 1, types.SimpleNamespace(newest_complete=newest),  # type: ignore[arg-type]
                       types.SimpleNamespace(changed=lambda: None), silent_after=1.0,
                       clock=lambda: now[0])
        chans = {i: _Chan() for i in range(2)}
        for i in range(2):
            sbs.add(wire.Register(f"sb{i}", "127.0.0.1", 7100 + i, 200 + i), chans[i], i)  # type: ignore[arg-type]
        state.mark_lost(state.members[0])
        now[0] += 0.5  # sb0 heard from 0.5 s ago: promoted
        assert sbs.promote(0) and sbs.reserved_for(0) == "sb0"
        await asyncio.sleep(0.01)
        # the restarted primary stands by for its lost slot, holding nothing
        idle = _Chan()
        sbs.add(wire.Register("w0", "127.0.0.1", 7000, 300, standby_of=0), idle, 0)  # type: ignore[arg-type]
        now[0] += 1.2  # sb0 silent past the timeout: gone, but it may still register...
        assert sbs.reserved_for(0) == "sb0"
        now[0] += sbmod.GONE_SECONDS + 0.1  # ...not any more: the slot is free
        assert sbs.reserved_for(0) is None
        assert [m for m in idle.sent if isinstance(m, wire.Stop)], "the idle standby is recruited"
        assert idle.closed and not sbs.by_slot[0]
        # the recruit registers again asking to stand by: it takes the orphaned slot
        assert sbs.slot_for(wire.Register("w0", "127.0.0.1", 7000, 301, standby_of=0)) is None
        # slot 1 lost while its standby is silent: no promotion
        state.mark_lost(state.members[1])
        assert not sbs.promote(1)
        assert not [m for m in chans[1].sent if isinstance(m, wire.Promote)]

    asyncio.run(scenario())


def test_a_standby_registering_again_with_its_replicas_keeps_its_slot_and_is_promoted() -> None:
    """After the coordinator's cut heals (the nemesis, seed 7) every slot is lost. A standby
    registering again says it holds its slot's replicas (``Register.replicas``): it stands
    by for that slot, not handed it (or another) as a replacement, which it would leave —
    and the slot is lost with no promotion under way, so it is promoted at once. A new
    process asking for the same slot still takes it as a replacement; once the slot is
    back, a registrant with replicas is told to follow."""
    state = _two_ready_primaries()
    for m in state.members:
        state.mark_lost(m)

    async def newest() -> int:
        return 3

    async def scenario() -> None:
        sbs = Standbys(state, 2, 1, types.SimpleNamespace(newest_complete=newest),  # type: ignore[arg-type]
                       types.SimpleNamespace(changed=lambda: None))
        fresh = wire.Register("new", "127.0.0.1", 7200, 300, standby_of=1)
        assert sbs.slot_for(fresh) is None, "a new process takes the orphaned slot"
        back = wire.Register("sb1", "127.0.0.1", 7101, 201, standby_of=1, replicas=True)
        assert sbs.slot_for(back) == 1
        chan = _Chan()
        sbs.add(back, chan, 1)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert [(m.index, m.round) for m in chan.sent if isinstance(m, wire.Promote)] == [(1, 3)]
        assert sbs.reserved_for(1) == "sb1"
        # slot 0's primary is back: its standby, registering again, follows it
        state.members[0].alive = True
        state.members[0].ready.set()
        back0 = wire.Register("sb0", "127.0.0.1", 7100, 200, standby_of=0, replicas=True)
        assert sbs.slot_for(back0) == 0
        chan0 = _Chan()
        sbs.add(back0, chan0, 0)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert _follows(chan0) == [[0, 2]] and not [m for m in chan0.sent
                                                    if isinstance(m, wire.Promote)]

    asyncio.run(scenario())
