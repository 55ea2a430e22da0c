"""The worker's side of direct calls without a cluster (``worker.direct``): one run per
request id however many copies arrive, each copy answered; a reply kept until its
client acknowledges it, through a round's cut and a recovery, and no longer than the
retention; a rescale's new owner answers what the old one committed and re-runs what
it kept waiting; a rollback closes the clients' channels and turns requests away; a full
worker stops reading its clients; and the epoch log's records of direct requests and
of a round's cut (``sfaas.runtime.epochlog``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from sfaas.runtime import wire
from sfaas.runtime.epochlog import CutRecord, EpochLogError, EpochRecord, decode_record
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.reads import NOT_HERE
from worker.direct import DirectIngress
from worker.state import Pending, WorkerState

PARTITIONS = 4


class _Chan:
    """A client's channel: what the worker sent, and the frames the client sends."""

    def __init__(self, frames: list[list[wire.Message]] | None = None) -> None:
        self.sent: list[wire.Reply] = []
        self.reads: list[wire.ReadReply] = []
        self.closed = False
        self.peer = "test-client"
        self.frames: asyncio.Queue[list[wire.Message]] = asyncio.Queue()
        for f in frames or []:
            self.frames.put_nowait(f)

    def send(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.ReadReply):
            self.reads.append(msg)
            return
        assert isinstance(msg, wire.Answer)
        self.sent.append(wire.Reply.decode(msg.reply))

    def close(self) -> None:
        self.closed = True

    async def wait_room(self) -> None:
        pass

    async def recv(self) -> list[wire.Message]:
        return await self.frames.get()


@dataclass
class _Seq:
    waiting: list[tuple[int, Pending]] = field(default_factory=list)

    def retries(self) -> list[tuple[int, Pending]]:
        return list(self.waiting)

    def requeue(self, tid: int, item: Pending) -> None:
        self.waiting.append((tid, item))


@dataclass
class _Loop:
    queue: list[Pending] = field(default_factory=list)
    sequencer: _Seq = field(default_factory=_Seq)
    parked: dict[int, Pending] = field(default_factory=dict)


def _state(index: int = 0, log_topic: str = "ns.app.epochs") -> WorkerState:
    st = WorkerState(10, False, log_topic)
    st.index, st.partitions, st.owners = index, PARTITIONS, [0] * PARTITIONS
    st.loop = _Loop()  # type: ignore[assignment]
    return st


def _direct(st: WorkerState, limit: int = 100, retention: float = 300.0,
            clock: Callable[[], float] | None = None) -> DirectIngress:
    arrived: list[int] = []
    d = DirectIngress(st, SimpleNamespace(work_arrived=lambda: arrived.append(1)), limit, retention,
                      read=lambda m: wire.ReadReply(m.id, True, None, "", ""), clock=clock)
    return d


def _record(rid: str, key: str = "k1") -> bytes:
    return wire.Request(rid, "counters", key, "bump", [], 0, 1.0).encode()


def _decide(d: DirectIngress, st: WorkerState, value: Any = 7) -> Pending:
    item = st.loop.queue.pop(0)  # type: ignore[union-attr]
    d.replied(item, wire.Reply(item.request.rid, True, value))
    return item


def test_copies_share_one_run_and_each_gets_the_reply() -> None:
    st = _state()
    d = _direct(st)
    a, b = _Chan(), _Chan()
    assert d.submit(a, _record("r1")) is True
    assert d.submit(b, _record("r1")) is False and d.submit(a, _record("r1")) is False
    assert len(st.loop.queue) == 1 and d.pending == 1  # type: ignore[union-attr]
    item = st.loop.queue[0]  # type: ignore[union-attr]
    assert (item.partition, item.offset, item.direct) == (
        partition_of("counters", "k1", PARTITIONS), -1, True)
    assert item.direct_record() == _record("r1")
    _decide(d, st)
    assert [r.value for r in a.sent] == [7, 7] and [r.value for r in b.sent] == [7]
    assert d.pending == 0
    late = _Chan()
    assert d.submit(late, _record("r1")) is False and late.sent[0].value == 7
    d.acked(["r1"])  # the client got it: forgotten (a client never resends an answered call)
    assert d.submit(late, _record("r1")) is True and d.pending == 1


def test_requests_it_must_not_take_are_turned_away_or_named() -> None:
    st = _state(index=1)
    st.owners = [0, 1, 0, 1]
    d = _direct(st)
    chan = _Chan()
    key = next(k for k in (f"k{i}" for i in range(100))
               if partition_of("counters", k, PARTITIONS) in (0, 2))
    d.submit(chan, _record("elsewhere", key))
    d.submit(chan, msgpack.packb(["bad", 5, "k", "bump", [], 0, 0.0]))
    d.submit(chan, wire.Request("rd", "counters", "k", "\x00get", [], 0, 0.0).encode())
    got = {r.rid: r for r in chan.sent}
    assert got["elsewhere"].error_type == NOT_HERE and "does not own partition" in str(
        got["elsewhere"].reason)
    assert got["bad"].error_type == "BadRequest" and "operator must be a str" in str(got["bad"].reason)
    assert st.loop.queue == []  # type: ignore[union-attr]
    no_rounds = _direct(_state(log_topic=""))
    c2 = _Chan()
    no_rounds.submit(c2, _record("r"))
    assert c2.sent[0].error_type == NOT_HERE and "snapshot rounds" in str(c2.sent[0].reason)


def test_an_unacknowledged_reply_lives_through_a_cut_and_a_recovery_but_not_past_retention() -> None:
    st = _state()
    d = _direct(st, retention=60.0)
    chan = _Chan()
    for rid in ("r1", "r2", "r3"):
        d.submit(chan, _record(rid))
    _decide(d, st, 1)
    _decide(d, st, 2)
    d.acked(["r2"])
    waiting = st.loop.queue.pop(0)  # type: ignore[union-attr]
    waiting.now, waiting.journal = 5.5, {"e:1": [True, 3]}
    st.loop.sequencer.waiting.append((42, waiting))  # type: ignore[union-attr]
    cut = CutRecord.decode(d.cut(7, 30)[0].encode())
    assert (cut.round, cut.epoch, cut.worker) == (7, 30, 0)
    assert [wire.Reply.decode(r).rid for _, r, _ in cut.replies] == ["r1"]
    assert cut.retries == ((42, waiting.partition, 5.5, {"e:1": [True, 3]}, _record("r3")),)
    assert isinstance(decode_record(d.cut(7, 30)[0].encode()), CutRecord)
    # a recovery: channels closed, requests turned away, then the round's replies back
    d.rollback()
    assert chan.closed and not d.accepting
    again = _Chan()
    d.submit(again, _record("r1"))
    assert again.sent[0].error_type == NOT_HERE
    mine = {partition_of("counters", "k1", PARTITIONS)}
    d.restore([cut], mine)
    again = _Chan()
    assert d.submit(again, _record("r1")) is False and again.sent[0].value == 1
    # past the retention, a reply is forgotten
    d2 = _direct(_state(), retention=60.0)
    d2.restore([CutRecord(7, 30, 0, ((min(mine), _reply_record("old"), 61.0),), ())], mine)
    fresh = _Chan()
    assert d2.submit(fresh, _record("old")) is True


def _reply_record(rid: str) -> bytes:
    return wire.Reply(rid, True, 1).encode()


def test_replies_expire_in_the_order_they_were_made() -> None:
    st = _state()
    now = [1000.0]
    d = _direct(st, retention=10.0, clock=lambda: now[0])
    chan = _Chan()
    d.submit(chan, _record("a"))
    _decide(d, st)
    now[0] += 6
    d.submit(chan, _record("b"))
    _decide(d, st)
    now[0] += 5  # a is 11 s old, b 5 s: a new reply expires a
    d.submit(chan, _record("c"))
    _decide(d, st)
    assert [wire.Reply.decode(r).rid for _, r, _ in d.cut(1, 1)[0].replies] == ["b", "c"]


def test_a_cut_of_many_replies_is_several_records_under_kafkas_limit() -> None:
    st = _state()
    d = _direct(st)
    chan = _Chan()
    for i in range(3000):
        d.submit(chan, _record(f"r{i}"))
        _decide(d, st, "x" * 300)
    cuts = d.cut(2, 9)
    assert len(cuts) >= 3 and all(len(c.encode()) < 1 << 20 for c in cuts)
    assert sum(len(c.replies) for c in cuts) == 3000
    rebuilt = _direct(_state())
    rebuilt.restore(cuts, set(range(PARTITIONS)))
    copy = _Chan()
    assert rebuilt.submit(copy, _record("r2999")) is False and copy.sent[0].value == "x" * 300


def test_a_dropped_request_sends_its_client_elsewhere() -> None:
    st = _state()
    d = _direct(st)
    chan = _Chan()
    d.submit(chan, _record("moving"))
    d.dropped(["moving"])
    assert chan.sent[0].error_type == NOT_HERE and d.pending == 0


async def test_a_full_worker_stops_reading_its_clients_until_requests_are_decided() -> None:
    st = _state()
    d = _direct(st, limit=2)
    chan = _Chan([[wire.Submit(_record(f"r{i}")) for i in range(2)],
                  [wire.Submit(_record("r9")), wire.Read(5, "counters", 0, "k", "", 0)]])
    serving = asyncio.create_task(d.serve(chan, await chan.recv()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert len(st.loop.queue) == 2 and chan.frames.qsize() == 1  # (the second frame waits)
    _decide(d, st)
    await asyncio.sleep(0.05)
    assert chan.frames.qsize() == 0 and [i.request.rid for i in st.loop.queue] == ["r1", "r9"]
    assert [r.id for r in chan.reads] == [5]
    _decide(d, st)  # (full again: the next frame waits for a decision)
    chan.frames.put_nowait([wire.Hello(0)])  # not a client's message: dropped
    await asyncio.wait_for(serving, 5)
    assert chan.closed


def test_epoch_records_log_direct_requests_whole() -> None:
    item = Pending(wire.Request.decode(_record("r1")), 2, -1, 9.0, raw=_record("r1"))
    kafka = Pending(wire.Request.decode(_record("r2")), 1, 17, 9.0)
    rec = EpochRecord.of(4, 0, 9.0, [(10, item), (11, kafka)], generation=3)
    assert rec.direct == ((10, _record("r1")),) and rec.batch == ((10, 2, -1), (11, 1, 17))
    assert decode_record(rec.encode()) == rec
    bad = b"SFEL\x05" + msgpack.packb([4, 0, 9.0, [[10, 2, -1]], [], [], [], 3, []])
    with pytest.raises(EpochLogError, match="direct requests do not match"):
        EpochRecord.decode(bad)
    with pytest.raises(EpochLogError, match="malformed body"):
        CutRecord.decode(b"SFDC\x01" + msgpack.packb([1, 2, 0, [["x"]], []]))


def _owner(index: int, owners: list[int]) -> tuple[WorkerState, DirectIngress]:
    """A worker ``index`` under the map ``owners``, and its direct ingress."""
    st = _state(index=index)
    st.owners = owners
    return st, _direct(st)


def _moved_key(p: int) -> str:
    return next(k for k in (f"k{i}" for i in range(1000))
                if partition_of("counters", k, PARTITIONS) == p)


def test_a_request_the_old_owner_committed_is_answered_not_run_again_by_the_new_one() -> None:
    """A rescale moves partition ``p`` from worker 2 (retiring) to worker 0 at round 9.
    Worker 2 committed ``paid`` in an epoch before the switch; its client got no answer
    and sends it again to the new owner, which must answer from worker 2's cut — running
    it again would commit it twice (a double charge)."""
    p = 1
    key = _moved_key(p)
    old_st, old = _owner(2, [0, 2, 0, 2])
    chan = _Chan()
    old.submit(chan, _record("paid", key))
    _decide(old, old_st, "charged once")
    other = _moved_key(3)
    old.submit(chan, _record("stays", other))
    _decide(old, old_st, "kept by 2")
    cuts = [CutRecord.decode(c.encode()) for c in old.cut(9, 40)]
    new_st, new = _owner(0, [0, 0, 0, 2])  # the map after the switch: 1 moved, 3 did not
    new.take_over(cuts, {p})
    copy = _Chan()
    assert new.submit(copy, _record("paid", key)) is False
    assert [r.value for r in copy.sent] == ["charged once"]
    assert new_st.loop.queue == [] and new.pending == 0  # type: ignore[union-attr]
    # a reply of a partition that did not move is not the new owner's to give
    elsewhere = _Chan()
    new.submit(elsewhere, _record("stays", other))
    assert elsewhere.sent[0].error_type == NOT_HERE


def test_a_waiting_rerun_moves_with_its_tid_and_journal_and_a_copy_waits_for_it() -> None:
    """A direct request waiting to re-run at the switch (its effect journaled) is dropped
    by the old owner, which sends its client elsewhere; the new owner re-runs it under its
    tid with its journal (the effect is not run again), and the client's copy waits for
    that run instead of starting another."""
    p = 2
    key = _moved_key(p)
    old_st, old = _owner(1, [0, 1, 1, 0])
    chan = _Chan()
    old.submit(chan, _record("effect", key))
    waiting = old_st.loop.queue.pop(0)  # type: ignore[union-attr]
    waiting.now, waiting.journal = 3.25, {"e:0": [True, "receipt-17"]}
    old_st.loop.sequencer.waiting.append((77, waiting))  # type: ignore[union-attr]
    cuts = old.cut(4, 12)
    old.dropped(["effect"])  # (the release)
    assert chan.sent[0].error_type == NOT_HERE
    new_st, new = _owner(0, [0, 1, 0, 0])
    new.take_over(cuts, {p})
    [(tid, item)] = new_st.loop.sequencer.waiting  # type: ignore[union-attr]
    assert (tid, item.request.rid, item.now, item.journal) == (
        77, "effect", 3.25, {"e:0": [True, "receipt-17"]})
    copy = _Chan()
    assert new.submit(copy, _record("effect", key)) is False
    assert new_st.loop.queue == [] and len(new_st.loop.sequencer.waiting) == 1  # type: ignore[union-attr]
    new.replied(item, wire.Reply("effect", True, "done"))
    assert [r.value for r in copy.sent] == ["done"]


def test_a_joining_worker_takes_no_request_until_its_takeover() -> None:
    """A worker joining a scale-up serves its clients only once the previous owners'
    replies are in: before that, any request could be a copy of a committed one."""
    _st, d = _owner(1, [0, 1, 0, 1])
    d.arriving()
    early = _Chan()
    d.submit(early, _record("r", _moved_key(1)))
    assert early.sent[0].error_type == NOT_HERE and "takeover" in str(early.sent[0].reason)
    d.take_over([], {1, 3})
    later = _Chan()
    assert d.submit(later, _record("r", _moved_key(1))) is True
