"""A worker cut from Kafka but not from the coordinator (issue 33's ``cut-data``): its
heartbeats go on, so nothing used to replace it and its partitions' requests waited in Kafka
for as long as the cut lasted. Each heartbeat now says how long the worker's Kafka clients
have heard nothing from any broker; the coordinator's watchdog loses a worker silent past
the limit while another worker hears Kafka (``coordinator.watchdog``), and its standby
takes over. Without a cluster: the decision on fake members, and the worker's probes
(``sfaas.runtime.kafka.Reachability``: a TCP connection to each broker in turn — the
clients' own traffic was tried first, and a worker whose traffic all waited on one cut
broker looked cut: the nemesis and the failover benchmark saw workers replaced for a
broker's cut)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.membership import Membership
from coordinator.state import ClusterState, Member
from coordinator.watchdog import Watchdog
from launcher.cluster import free_port
from sfaas.runtime import wire
from sfaas.runtime.kafka import LATE_PROBE, Reachability, silence_limit

T = 1.0  # heartbeat_timeout
LIMIT = 1.5


class _State:
    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.joined = False
        self.lost: list[int] = []

    def mark_lost(self, m: Member) -> None:
        m.alive = False
        m.ready.clear()
        self.lost.append(m.index)

    async def kafka_silence_news(self, timeout: float) -> None:
        await asyncio.sleep(timeout)


class _Heard(ClusterState):
    """The coordinator's real state over ``members``, its losses noted, and each time the
    members were looked at (a watchdog tick)."""

    def __init__(self, members: list[Member]) -> None:
        self.looked = 0
        super().__init__(len(members))
        self._all = members
        self.lost: list[int] = []

    @property  # type: ignore[override]
    def members(self) -> list[Member]:
        self.looked += 1
        return self._all

    @members.setter
    def members(self, value: list[Member]) -> None:
        self._all = value

    def mark_lost(self, m: Member) -> None:
        m.alive = False
        m.ready.clear()
        self.lost.append(m.index)


class _Channel:
    def close(self) -> None:
        pass


def _members(*silences: float | None) -> list[Member]:
    """Ready members whose last beat (just now) said ``silences`` (None: no beat yet)."""
    out = []
    for i, silent in enumerate(silences):
        m = Member(i, f"worker-{i}", "h", 1, 100 + i, _Channel())  # type: ignore[arg-type]
        m.ready.set()
        if silent is not None:
            m.kafka_silent, m.kafka_heard = silent, time.monotonic()
        out.append(m)
    return out


def _watchdog(state: _State, limit: float = LIMIT) -> Watchdog:
    """The watchdog over ``state``, losing members through a membership of fakes."""
    rescale = SimpleNamespace(is_joiner=lambda m: False, abandon=lambda why: None)
    inbox = SimpleNamespace(interrupt=lambda: None)
    standbys = SimpleNamespace(feed=lambda index: None)
    events = SimpleNamespace(member_lost=lambda why: None, changed=lambda: None)
    membership = Membership(state, inbox, standbys, rescale, events,  # type: ignore[arg-type]
                            topics=("in", "out", "group"))
    return Watchdog(state, standbys, membership, heartbeat_timeout=T,  # type: ignore[arg-type]
                    kafka_silence_limit=limit)


def test_a_worker_silent_past_the_limit_while_another_hears_kafka_is_cut() -> None:
    members = _members(2.0, 0.3, 0.2)
    why = _watchdog(_State(members)).cut_from_kafka(members[0], time.monotonic())
    assert why.startswith("cut from Kafka: no answer from any broker for 2.0 s while worker 1 "
                          "has them (limit 1.5 s)"), why
    # the others are not
    assert not _watchdog(_State(members)).cut_from_kafka(members[1], time.monotonic())


@pytest.mark.parametrize("silences,limit", [
    ((1.4, 0.2), LIMIT),        # under the limit: a slow metadata refresh
    ((5.0, 4.0, 3.0), LIMIT),   # every worker silent: Kafka is down, a replacement won't help
    ((5.0,), LIMIT),            # alone: nobody to compare with
    ((5.0, 0.2), 0.0),          # the check is off
    ((5.0, None), LIMIT),       # the other one never said (an old worker's beats)
])
def test_no_replacement_when_kafka_itself_is_down_or_the_silence_is_short(
        silences: tuple[float | None, ...], limit: float) -> None:
    members = _members(*silences)
    assert _watchdog(_State(members), limit).cut_from_kafka(
        members[0], time.monotonic()) == ""


def test_the_watchdog_loses_the_cut_worker_and_only_it() -> None:
    async def go() -> list[int]:
        members = _members(0.2, 3.0, 0.1)
        for m in members:
            m.last_seen = time.monotonic() + 60  # (heartbeats on time)
        state = _State(members)
        dog = _watchdog(state)
        await dog.start()
        await asyncio.sleep(0.6)
        await dog.stop()
        return state.lost
    assert asyncio.run(go()) == [1]


def test_a_beat_that_says_its_worker_is_cut_is_judged_at_once_not_at_the_next_tick() -> None:
    """The watchdog ticks every heartbeat_timeout / 4 (0.25 s here); a beat whose worker
    hears no Kafka wakes it at once: a cut worker is replaced a tick sooner."""
    async def go() -> tuple[list[int], float]:
        members = _members(0.2, 0.1)
        for m in members:
            m.last_seen = time.monotonic() + 60  # (heartbeats on time)
        state = _Heard(members)
        dog = _watchdog(state)  # type: ignore[arg-type]
        await dog.start()
        await asyncio.sleep(0.3)
        assert state.lost == []
        looked = state.looked
        while state.looked == looked:  # a tick just ended: the next is 0.25 s away
            await asyncio.sleep(0)
        t0 = time.monotonic()
        state.heard(members[1], wire.Heartbeat(1, 0, [], 0.0, 3.0))
        while not state.lost and time.monotonic() - t0 < 1.0:
            await asyncio.sleep(0.005)
        took = time.monotonic() - t0
        await dog.stop()
        return state.lost, took
    lost, took = asyncio.run(go())
    assert lost == [1] and took < 0.1, (lost, took)


def test_heartbeats_carry_the_silence() -> None:
    [back] = wire.decode_frame(wire.encode_frame([wire.Heartbeat(2, 10, [1, 2], 5.0, 1.75)]))
    assert isinstance(back, wire.Heartbeat) and back.kafka_silent == 1.75
    with pytest.raises(wire.ProtocolError, match="Heartbeat.kafka_silent has the wrong type"):
        wire.decode_frame(wire.encode_frame([wire.Heartbeat(2, 10, [], 5.0, "x")]))  # type: ignore[arg-type]


def test_the_limit_allows_three_metadata_refreshes_of_several_brokers() -> None:
    assert silence_limit("k1:9092,k2:9092", 1.0) == 1.5   # refreshes every 0.5 s
    assert silence_limit("k1:9092,k2:9092", 0.75) == 1.5
    assert silence_limit("k1:9092,k2:9092", 2.0) == 3.0   # at least 1.5 heartbeat timeouts
    # one broker: its probes alone say (three of its 2 s refreshes held a cut worker 6 s)
    assert silence_limit("k1:9092", 0.75) == 1.125
    assert silence_limit("k1:9092", 2.0) == 3.0


class _Clock:
    """A monotonic clock that reads what the test sets."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class _Hanging:
    """A Kafka port whose probes never answer; ``clock`` moves by ``step`` on each one (the
    time a probe took, as the process saw it)."""

    def __init__(self, clock: _Clock, step: float) -> None:
        self.clock, self.step = clock, step

    async def probe(self, host: str, port: int) -> None:
        self.clock.now += self.step
        await asyncio.sleep(10)


def test_a_probe_that_timed_out_late_is_not_silence() -> None:
    """A probe whose timeout fired well after it was due (the process did not run: a busy
    core, a long turn of the loop) says nothing of Kafka; one on time is silence."""
    async def silence_after(step: float) -> float:
        clock = _Clock()
        r = Reachability("k1:9092", timeout=0.05, kafka=_Hanging(clock, 0.0),  # type: ignore[arg-type]
                         clock=clock)  # type: ignore[arg-type]
        r._last_ok = clock.now - 0.5  # (answered 0.5 s ago)
        r._kafka = _Hanging(clock, step)  # type: ignore[assignment]
        await r.probe()
        return r.silence()
    assert asyncio.run(silence_after(0.05)) == pytest.approx(0.55)  # on time: 0.55 s silent
    assert asyncio.run(silence_after(0.05 * LATE_PROBE + 0.3)) == 0.0  # late: unknown


def test_reachability_is_silent_only_when_no_broker_answers(kafka: Any) -> None:
    """Probes take the brokers in turn: one dead broker of three leaves the others' answers
    (a broker cut off is not a worker cut off); all dead, the silence grows."""
    dead = [f"127.0.0.1:{free_port('127.0.0.1')}" for _ in range(2)]

    async def go() -> tuple[float, float, float]:
        live = Reachability(f"{dead[0]},{kafka.kafka_bootstrap},{dead[1]}", timeout=0.2)
        for _ in range(9):  # three turns each, 0.1 s apart
            await live.probe()
            await asyncio.sleep(0.1)
        live_silence = live.silence()
        cut = Reachability(",".join(dead), timeout=0.2)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            await cut.probe()
            await asyncio.sleep(0.1)
        unresolvable = Reachability("no-such-broker.invalid:9092", timeout=0.2)
        for _ in range(4):
            await unresolvable.probe()
            await asyncio.sleep(0.1)
        # probes that never ran are not silence (a standby promoted after a minute)
        idle = Reachability(",".join(dead), timeout=0.2)
        await asyncio.sleep(0.5)
        assert idle.silence() == 0.0
        return live_silence, cut.silence(), unresolvable.silence()
    live, cut, unresolvable = asyncio.run(asyncio.wait_for(go(), 30))
    assert live < 0.5 and cut >= 0.9 and unresolvable >= 0.3, (live, cut, unresolvable)


async def _after_losing_the_coordinator(tmp_path: Any, silent: float) -> tuple[list[str], int]:
    """A bare worker (rounds on) whose coordinator channel closed, its Kafka probes silent
    for ``silent`` s: what it fenced itself for, and how often it tried to rejoin."""
    from tests.fuzz.harness import bare_worker

    w = bare_worker(str(tmp_path), snapshot_interval=1.0)
    fenced: list[str] = []
    rejoins = [0]

    async def follow() -> bool:
        return True  # (the coordinator closed the channel)

    async def quiesce(replies: bool = True) -> None:
        pass

    async def rejoin(_port: int, _repl: int) -> bool:
        rejoins[0] += 1
        return False  # (leave the loop: the test is over)

    w.inbox.follow = follow  # type: ignore[method-assign]
    w.quiet.quiesce = quiesce  # type: ignore[method-assign]
    w.membership.rejoin = rejoin  # type: ignore[method-assign]
    w.lease.check = lambda: True  # type: ignore[method-assign]  (it ran throughout)
    w.lease.fence = lambda why="": fenced.append(why)  # type: ignore[method-assign]
    w.heartbeat._reach._silent = silent
    try:
        await asyncio.wait_for(w._follow(), 10)
    finally:
        assert w.state.engine is not None
        w.state.engine.close()
    return fenced, rejoins[0]


def test_a_worker_dropped_while_cut_from_kafka_leaves_instead_of_taking_its_slot_back(
        tmp_path: Any) -> None:
    """Taking the slot back while still cut, it was lost again every 1.1 s until the cut
    healed (the cuts series: recoveries of 6-16 s); leaving, a fresh process takes the slot
    (on a local cluster the supervisor's restart: gaps of 2.1-2.5 s)."""
    fenced, rejoins = asyncio.run(_after_losing_the_coordinator(tmp_path / "cut", 5.0))
    assert rejoins == 0
    assert len(fenced) == 1 and "cut from Kafka (no Kafka broker answered for 5.0 s)" in fenced[0]
    # hearing Kafka, it keeps its stores and rejoins (a coordinator restarted)
    fenced, rejoins = asyncio.run(_after_losing_the_coordinator(tmp_path / "ok", 0.0))
    assert rejoins == 1 and fenced == ["could not rejoin the coordinator"]


def test_a_probe_that_finds_its_worker_cut_tells_the_coordinator_at_once_and_once(
        tmp_path: Any) -> None:
    """Not at the next beat, a quarter of the heartbeat timeout later: each step of the
    wait is a gap in the cut worker's replies."""
    from tests.fuzz.harness import bare_worker

    w = bare_worker(str(tmp_path), snapshot_interval=1.0)
    sent: list[Any] = []
    w.uplink.send = sent.append  # type: ignore[method-assign]
    w.uplink.channel = SimpleNamespace(closed=False)  # type: ignore[assignment]  (connected)

    async def go() -> list[float]:
        silences = []
        for silent in (0.5, 3.0, 3.2, 0.0, 3.0):  # (under the limit, cut, still, heard, cut)
            w.heartbeat._reach._silent = silent
            probe = asyncio.get_running_loop().create_future()
            probe.set_result(None)
            w.heartbeat._probed(probe)
            silences.append(sent[-1].kafka_silent if sent else -1.0)
            sent.clear()
        return silences
    try:
        assert asyncio.run(go()) == [-1.0, 3.0, -1.0, -1.0, 3.0]
    finally:
        assert w.state.engine is not None
        w.state.engine.close()


class _StuckLookup:
    """A Kafka port whose probes of ``stuck`` hang in a name lookup that a cancel does not
    end (uvloop's ``getaddrinfo``: a stopped broker's name, 5 s in the nemesis), then fail;
    every other broker answers at once."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lookup_done = asyncio.Event()

    async def probe(self, host: str, port: int) -> None:
        self.calls[host] = self.calls.get(host, 0) + 1
        if host != "stuck":
            return
        deadline = asyncio.get_running_loop().time() + 2.0
        while asyncio.get_running_loop().time() < deadline:
            try:
                await asyncio.sleep(deadline - asyncio.get_running_loop().time())
            except asyncio.CancelledError:
                continue  # (the lookup goes on)
        self.lookup_done.set()
        raise OSError(-2, "Name or service not known")


def test_a_probe_stuck_in_a_name_lookup_holds_neither_the_other_brokers_nor_the_silence() -> None:
    """The nemesis (seed 101): a coordinator cut, then a broker stopped; the worker back from
    the cut was replaced at once as "cut from Kafka: no answer from any broker for 5.1 s"
    while two brokers of three were up — its one probe sat in the stopped broker's name
    lookup, which ``wait_for`` could not cancel, and its failure counted the whole wait."""
    async def go() -> None:
        port = _StuckLookup()
        r = Reachability("stuck:9092,k2:9092,k3:9092", timeout=0.05,
                         kafka=port)  # type: ignore[arg-type]
        await asyncio.wait_for(r.probe(), 1.0)  # (stuck: given up after its timeout)
        assert not port.lookup_done.is_set() and 0.0 < r.silence() < 1.0
        await r.probe()  # k2
        assert r.silence() == 0.0
        await r.probe()  # k3
        await asyncio.wait_for(r.probe(), 1.0)  # stuck again: its lookup still hangs
        assert port.calls == {"stuck": 1, "k2": 1, "k3": 1}, "a second lookup was started"
        await r.probe()  # k2
        assert r.silence() == 0.0
        await asyncio.wait_for(port.lookup_done.wait(), 5.0)
        await asyncio.sleep(0)
        await r.probe()  # k3
        await r.probe()  # stuck: its lookup ended, so it is asked again
        assert port.calls["stuck"] == 2
    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_probe_whose_connection_hangs_is_cancelled_and_its_broker_asked_again() -> None:
    """A probe whose connection attempt goes unanswered (a cut: the SYN dropped) is cancelled
    when given up, so the broker's next turn asks again — kept running, it would hold the
    broker's turns for the kernel's SYN retries (~2 min) after the cut healed."""
    class _Cut:
        def __init__(self) -> None:
            self.calls = 0
            self.healed = False

        async def probe(self, host: str, port: int) -> None:
            self.calls += 1
            if not self.healed:
                await asyncio.sleep(3600)  # (a SYN nobody answers)

    async def go() -> None:
        port = _Cut()
        r = Reachability("k1:9092", timeout=0.05, kafka=port)  # type: ignore[arg-type]
        await r.probe()
        await asyncio.sleep(0)
        await r.probe()
        assert port.calls == 2 and r.silence() > 0.0
        port.healed = True
        await asyncio.sleep(0)  # (probes run a beat apart)
        await r.probe()
        assert port.calls == 3 and r.silence() == 0.0
    asyncio.run(asyncio.wait_for(go(), 30))
