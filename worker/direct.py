"""Direct ingress, the worker's side: requests a trusted client sends straight to this
worker over an authenticated channel, answered on that channel (``sfaas.direct`` is the
client's side; the messages are ``sfaas.runtime.protocols.ingress``).

**Durable before answered.** A direct request joins the epoch loop like one read from
Kafka, at offset -1 of its key's partition; the epoch-log record of its epoch holds the
request whole (``sfaas.runtime.epochlog``), and since a Commit needs every worker's
acknowledged record, its reply — sent after the commit — never reaches a client before
a recovery could reproduce it.

**One reply per request id.** Every request id this worker knows is an *entry*: pending
(queued, running, waiting to re-run) with the channels waiting for it, or replied, with
its reply record, until its client acknowledges it (``Acked``) or
``direct_retention`` seconds passed. A copy of a known request id — a client resending
after a closed channel — waits for the entry or gets its reply; it never runs again.

**Through a round and a recovery.** A round's cut writes ``CutRecord``s to the epoch log
before the round is reported: the replies not yet acknowledged and the direct requests
waiting to re-run. A recovery (:meth:`DirectIngress.rollback`, then
:meth:`DirectIngress.restore`) closes every client's channel — its clients resend what
they have no answer to — forgets every entry, and rebuilds them from the round's cut
records and the logged epochs it replays. Until then a request is turned away with
``NOT_HERE``, as is one whose partition another worker owns; its client asks the
coordinator where the partition is and sends it again.

The same channel carries the client's direct state reads (``worker.protocols.reads``).

**Bounds.** At most ``limit`` pending entries (the ingress's in-flight limit): at the limit
the worker stops reading its clients' channels until entries are decided, so a client
sending faster than the epochs commit is slowed by TCP. A frame carries at most
:data:`MAX_PER_FRAME` messages.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sfaas.errors import BadRequest, ChannelClosed
from sfaas.runtime import channels, ports, wire
from sfaas.runtime.epochlog import CutRecord
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.reads import MOVED, NOT_HERE
from sfaas.runtime.txn.reads import READS
from worker.needs import WorkArrived
from worker.state import Pending, WorkerState

log = logging.getLogger("sfaas.worker.direct")

__all__ = ["DirectIngress", "MAX_PER_FRAME"]

#: Messages one frame of a client may carry; more is a protocol violation.
MAX_PER_FRAME = 4096
#: Bytes of replies per cut record (a round's cut of many replies is several records).
CUT_RECORD_BYTES = 256 * 1024


@dataclass(slots=True)
class _Entry:
    """One request id: pending (``reply`` empty) or replied."""

    partition: int
    waiters: list[channels.Channel] = field(default_factory=list)
    reply: bytes = b""
    #: when the reply was made (monotonic seconds)
    at: float = 0.0


class DirectIngress:
    """The direct requests of one worker (see the module docstring).

    ``arrived.work_arrived()``: requests were queued (the epochs may need waking; given here
    or by :meth:`wakes`); ``limit``: pending entries at most; ``retention``: seconds an
    unacknowledged reply is kept, by ``clock`` (monotonic; the process's clock port's).
    """

    def __init__(self, state: WorkerState, arrived: WorkArrived | None, limit: int,
                 retention: float, read: Callable[[wire.Read], wire.ReadReply],
                 clock: Callable[[], float] | None = None) -> None:
        self._state = state
        self._clock = clock or ports.current().clock.monotonic
        self._arrived = arrived
        #: answers a direct state read (``worker.protocols.reads.ReadServer.answer``)
        self._read = read
        self.limit = limit
        self.retention = retention
        self._entries: dict[str, _Entry] = {}
        #: replied request ids in the order their replies were made (for expiry)
        self._replied: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._clients: set[channels.Channel] = set()
        #: requests are taken (False while a recovery rolls back, and without rounds:
        #: nothing would make them durable)
        self.accepting = bool(state.log_topic)
        #: a joining worker waits for its takeover (:meth:`arriving`)
        self._arriving = False
        #: requests taken, copies of known ones, replies sent, requests turned away
        self.taken = 0
        self.copies = 0
        self.answered = 0
        self.turned_away = 0

    def wakes(self, epochs: WorkArrived) -> None:
        """Requests taken wake ``epochs`` (a loop between parts: ``worker.service``)."""
        self._arrived = epochs

    # -- a client's channel ---------------------------------------------------------------------
    async def serve(self, chan: channels.Channel, first: list[wire.Message]) -> None:
        """Take one client's requests, acknowledgements and state reads until it closes
        the channel."""
        self._clients.add(chan)
        msgs = first
        try:
            while True:
                if len(msgs) > MAX_PER_FRAME or not all(
                        isinstance(m, (wire.Submit, wire.Acked, wire.Read)) for m in msgs):
                    log.warning("client %s sent something other than requests and reads; "
                                "dropping it", chan.peer)
                    return
                took = False
                for m in msgs:
                    if isinstance(m, wire.Submit):
                        took |= self.submit(chan, m.request)
                    elif isinstance(m, wire.Read):
                        chan.send(self._read(m))
                    else:
                        assert isinstance(m, wire.Acked)
                        self.acked(m.rids)
                if took:
                    assert self._arrived is not None, "DirectIngress.wakes: not wired"
                    self._arrived.work_arrived()
                if self._pending >= self.limit:
                    self._room.clear()
                    await self._room.wait()
                await chan.wait_room()  # (a client reading its answers slowly slows itself)
                msgs = await chan.recv()
        except (ChannelClosed, wire.ProtocolError):
            return
        finally:
            self._clients.discard(chan)
            chan.close()

    def submit(self, chan: channels.Channel, record: bytes) -> bool:
        """One request record from ``chan``; whether it was queued to run."""
        try:
            req = wire.Request.decode(record)
        except BadRequest as exc:
            address = wire.reply_address(record)
            log.warning("rejected a malformed direct request from %s: %s", chan.peer, exc.reason)
            if address is not None:
                self._send(chan, wire.Reply(address[0], False, None, "BadRequest", exc.reason))
            return False
        st = self._state
        self._clients.add(chan)  # (closed by a rollback)
        entry = self._entries.get(req.rid)
        if entry is not None:
            self.copies += 1
            if entry.reply:
                self._send_raw(chan, entry.reply)
            else:  # (each copy is answered)
                entry.waiters.append(chan)
            return False
        p = partition_of(req.operator, req.key, st.partitions) if st.partitions else -1
        if not self.accepting or st.loop is None or not 0 <= p < len(st.owners) \
                or st.owners[p] != st.index:
            self.turned_away += 1
            if not st.log_topic:
                why = "direct requests need snapshot rounds (the epoch log makes them durable)"
            elif not self.accepting or st.loop is None:
                why = "a recovery or a rescale's takeover is under way"
            else:
                why = f"worker {st.index} does not own partition {p}"
            self._send(chan, wire.Reply(req.rid, False, None, NOT_HERE, why))
            return False
        if req.function in READS:
            self._send(chan, wire.Reply(req.rid, False, None, "BadRequest",
                                        f"{req.function!r} is a read: send it as a Read"))
            return False
        self._entries[req.rid] = _Entry(p, [chan])
        self._pending += 1
        self.taken += 1
        st.loop.queue.append(Pending(req, p, -1, raw=record))
        return True

    def acked(self, rids: Iterable[str]) -> None:
        """The clients got these replies: forget them."""
        for rid in rids:
            entry = self._entries.get(rid)
            if entry is not None and entry.reply:
                del self._entries[rid]
                self._replied.pop(rid, None)

    # -- the epochs -----------------------------------------------------------------------------
    def replied(self, item: Pending, reply: wire.Reply) -> None:
        """A direct request's epoch committed (live or replayed): answer whoever waits, and
        keep the reply until it is acknowledged."""
        rid = item.request.rid
        record = reply.encode()
        entry = self._entries.get(rid)
        if entry is None:  # (a replayed request nobody resent yet)
            entry = self._entries[rid] = _Entry(item.partition)
        elif not entry.reply:
            self._pending -= 1
            if self._pending < self.limit:
                self._room.set()
        entry.reply, entry.at = record, self._clock()
        self._replied[rid] = None
        waiters, entry.waiters = entry.waiters, []
        for chan in waiters:
            self._send_raw(chan, record)
        self._expire(entry.at)

    def expect(self, items: Iterable[Pending]) -> None:
        """Direct requests a recovery put back (logged epochs to replay, waiting re-runs):
        a copy arriving now waits for them."""
        for item in items:
            if item.direct and item.request.rid not in self._entries:
                self._entries[item.request.rid] = _Entry(item.partition)
                self._pending += 1

    def dropped(self, rids: Iterable[str]) -> None:
        """A rescale dropped these queued direct requests: their clients send them again
        to the partitions' new owner."""
        for rid in rids:
            entry = self._entries.pop(rid, None)
            if entry is None or entry.reply:
                continue
            self._pending -= 1
            for chan in entry.waiters:
                self._send(chan, wire.Reply(rid, False, None, NOT_HERE, MOVED))
        if self._pending < self.limit:
            self._room.set()

    def _expire(self, now: float) -> None:
        horizon = now - self.retention
        while self._replied:
            rid = next(iter(self._replied))
            entry = self._entries.get(rid)
            if entry is not None and entry.at > horizon:
                break
            self._replied.popitem(last=False)
            if entry is not None and entry.reply:
                del self._entries[rid]

    # -- rounds and recoveries ------------------------------------------------------------------
    def cut(self, round_id: int, epoch: int) -> list[CutRecord]:
        """This worker's cut of round ``round_id`` (after epoch ``epoch``): the replies not
        yet acknowledged and the direct requests waiting to re-run, in records of at most
        about :data:`CUT_RECORD_BYTES` (Kafka refuses records over 1 MiB)."""
        now = self._clock()
        self._expire(now)
        index = self._state.index
        records: list[CutRecord] = []
        replies: list[tuple[int, bytes, float]] = []
        size = 0
        for rid in self._replied:
            e = self._entries.get(rid)
            if e is None or not e.reply:
                continue
            if size + len(e.reply) > CUT_RECORD_BYTES and replies:
                records.append(CutRecord(round_id, epoch, index, tuple(replies), ()))
                replies, size = [], 0
            replies.append((e.partition, e.reply, now - e.at))
            size += len(e.reply) + 16
        retries = tuple((tid, item.partition, item.now, dict(item.journal), item.raw)
                        for tid, item in self._state.direct_waiting())
        records.append(CutRecord(round_id, epoch, index, tuple(replies), retries))
        return records

    def rollback(self) -> None:
        """A recovery begins: turn requests away, close every client's channel (each
        resends what it has no answer to) and forget every entry."""
        self.accepting = False
        for chan in list(self._clients):
            chan.close()
        self._clients.clear()
        self._entries.clear()
        self._replied.clear()
        self._pending = 0
        self._room.set()

    def restore(self, cuts: Iterable[CutRecord], mine: set[int]) -> None:
        """The recovery rebuilt the epoch loop: keep the replies the round's ``cuts`` hold
        for ``mine`` partitions, and take requests again."""
        self._keep_replies(cuts, mine)
        self.accepting = bool(self._state.log_topic)

    def take_over(self, cuts: Iterable[CutRecord], gained: set[int]) -> None:
        """A rescale gave this worker the partitions ``gained`` at the round whose ``cuts``
        their previous owners wrote: keep their replies (a client resending a request
        the previous owner committed gets its reply, the request does not run again)
        and put their waiting re-runs back with their tids and journals (an effect
        already journaled is not run again)."""
        cuts = list(cuts)
        self._keep_replies(cuts, gained)
        self.requeue(cuts, gained, set())
        if self._arriving:
            self._arriving = False
            self.accepting = bool(self._state.log_topic)

    def arriving(self) -> None:
        """A worker joining a rescale: take no request until :meth:`take_over` (one could
        be a copy of a request the partition's previous owner committed)."""
        self._arriving = True
        self.accepting = False

    def requeue(self, cuts: Iterable[CutRecord], mine: set[int], in_log: set[object]) -> None:
        """The direct requests of ``mine`` partitions the round's ``cuts`` kept waiting
        (their tids, first ``now`` and journals) wait to re-run, but those in ``in_log``
        (request ids a logged epoch after the round runs again); a copy arriving now
        waits for them."""
        loop = self._state.loop
        assert loop is not None
        back = []
        for cut in cuts:
            for tid, p, now, journal, raw in cut.retries:
                if p not in mine:
                    continue
                item = Pending(wire.Request.decode(raw), p, -1, now, journal=dict(journal),
                               raw=raw)
                if item.request.rid not in in_log and item.request.rid not in self._entries:
                    loop.sequencer.requeue(tid, item)
                    back.append(item)
        self.expect(back)

    def _keep_replies(self, cuts: Iterable[CutRecord], mine: set[int]) -> None:
        now = self._clock()
        for cut in cuts:
            for p, record, age in cut.replies:
                if p not in mine or age >= self.retention:
                    continue
                try:
                    rid = wire.Reply.decode(record).rid
                except wire.ProtocolError as exc:
                    log.warning("skipping an undecodable reply of round %d: %s", cut.round, exc)
                    continue
                if rid not in self._entries:
                    self._entries[rid] = _Entry(p, reply=record, at=now - age)
                    self._replied[rid] = None

    def counters(self) -> dict[str, float]:
        """What ``worker.metrics`` shows of the direct calls."""
        return {"calls_pending": self._pending, "replies_kept": len(self._replied),
                "calls_taken": self.taken, "calls_copies": self.copies,
                "calls_turned_away": self.turned_away, "answers_sent": self.answered}

    @property
    def pending(self) -> int:
        """Direct requests taken and not yet answered."""
        return self._pending

    # -- answering ------------------------------------------------------------------------------
    def _send(self, chan: channels.Channel, reply: wire.Reply) -> None:
        self._send_raw(chan, reply.encode())

    def _send_raw(self, chan: channels.Channel, record: bytes) -> None:
        if chan.closed:
            return
        try:
            chan.send(wire.Answer(record))
            self.answered += 1
        except ChannelClosed:
            pass
