"""Ingress: take requests off Kafka at the worker's own pace; reject malformed ones.

**The in-flight limit.** A worker holds at most :data:`IN_FLIGHT_BATCHES` × ``max_batch``
requests at once: taken from Kafka and not yet completed (queued, in an epoch, waiting to
re-run, or with a reply the broker has not acknowledged; see ``sfaas.runtime.txn.offsets``). At
the limit the ingest task stops fetching and sleeps until completions make a batch's room
(:meth:`Ingress.completed` wakes it; no polling), so load beyond what the epochs commit
stays in Kafka instead of in memory, and every queue that holds requests — the ingress
queue, the re-runs, the replies — is bounded by it. A recovery may take more at once (every
request after the snapshot round); ingest then waits until they drain below the limit.

**Admission.** A record that does not decode into a valid request (``wire.Request.decode`` raises
:class:`~sfaas.errors.BadRequest`), or whose reply partition the egress topic lacks, is
*rejected*: logged, counted in ``Ingress.rejected`` (``"answered"`` / ``"dropped"``), and,
when it names a request id and a reply partition that exists, answered with a
``BadRequest`` error reply, so its client gets an error instead of a timeout. Like any
request's, its ingress offset completes once that reply is acknowledged; its fate is in
the state at once (it has none), so a snapshot round never replays it.

**Never backwards.** Ingest reads each partition forward from where it was put (a seek of
a recovery or a rescale, or the consumer group's position). A record *before* the next
expected offset means the consumer jumped back: aiokafka resets a position Kafka calls out
of range to the earliest offset (``auto_offset_reset``, which a fresh consumer group needs),
and a broker that became leader without records it had acknowledged does that — executing
everything since the start again would double the state (the nemesis saw a counter at twice
its value). Ingest puts the consumer back where it was and fetches again: the usual cause
is a broker back from a partition that still believes it leads (aiokafka sends no leader
epochs, KIP-320), and the next metadata refresh names the real leader. A partition that
keeps going back for :data:`REWOUND_FOR` seconds fails ingest (:class:`IngressRewound`), and
any failed ingest makes the worker leave (``on_failure``; exit status 1) instead of idling:
its replacement's recovery restores a consistent round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import TopicPartition

from sfaas.errors import BadRequest, SfaasError
from sfaas.runtime import ports, wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.engine import describe
from sfaas.runtime.txn.reads import READS, read
from worker.needs import WorkArrived
from worker.state import Pending, WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Ingress", "IN_FLIGHT_BATCHES", "Replies", "Consumer", "IngressRewound"]

#: A worker's in-flight limit, in batches of ``max_batch`` requests (see module docstring).
IN_FLIGHT_BATCHES = 20
#: Seconds a partition's consumer may keep going back before ingest fails (module docstring).
REWOUND_FOR = 10.0


class IngressRewound(SfaasError):
    """The consumer handed out a record before the position ingest had reached."""


def _leave(exc: BaseException) -> None:
    """A failed ingest: the worker leaves at once (see the module docstring)."""
    ports.current().process.exit(1)


class Replies(Protocol):
    """Where a rejected record's error reply goes (``worker.egress.Egress``)."""

    def add(self, reply_partition: int, value: bytes, partition: int, offset: int) -> None: ...


class Consumer(Protocol):
    """Whoever holds the Kafka consumer (``worker.clients.KafkaClients``)."""

    consumer: Any


class Ingress:
    """The ingest task of one worker and its in-flight limit (see module docstring).

    ``arrived.work_arrived()`` is called when a fetch brought requests (the epochs may need
    waking; ``worker.needs.WorkArrived``, given here or by :meth:`wakes`).
    """

    def __init__(self, settings: Settings, state: WorkerState, kafka: Consumer, replies: Replies,
                 arrived: WorkArrived | None = None,
                 on_failure: Callable[[BaseException], None] = _leave) -> None:
        self._max_batch = settings.max_batch
        self._on_failure = on_failure
        #: partition → the offset ingest reads next (unknown until a seek or a first record)
        self._next: dict[int, int] = {}
        #: partition → when its consumer first and last went back (one episode: rewinds
        #: less than 2 s apart, ended by a forward fetch)
        self._rewound_since: dict[int, tuple[float, float]] = {}
        #: fetches that came back before the position ingest had reached (re-read)
        self.rewinds = 0
        self._state = state
        self._kafka = kafka
        self._replies = replies
        self._arrived = arrived
        self.limit = IN_FLIGHT_BATCHES * settings.max_batch
        self.room = asyncio.Event()
        #: how often ingest stopped at the limit
        self.stalls = 0
        #: malformed ingress records, ``"answered"`` (with an error reply) or ``"dropped"``
        self.rejected: collections.Counter[str] = collections.Counter()
        #: state reads answered (``sfaas.runtime.txn.reads``), and those taken while the
        #: stores may be behind the replies (a recovery), answered once they are not
        self.reads = 0
        self._held_reads: list[tuple[int, int, wire.Request]] = []
        self._task: asyncio.Task[None] | None = None

    def wakes(self, epochs: WorkArrived) -> None:
        """Requests taken wake ``epochs`` (a loop between parts: ``worker.service``)."""
        self._arrived = epochs

    # -- the ingest task --------------------------------------------------------------------------
    def start(self) -> None:
        """(Re)start taking requests from the ingress partitions."""
        self._task = asyncio.create_task(self.run(), name="ingest")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        assert exc is not None
        log.critical("ingest failed, leaving (a recovery restores a consistent round): %r", exc)
        self._on_failure(exc)

    @property
    def started(self) -> bool:
        return self._task is not None

    async def pause(self) -> None:
        """Stop taking requests (what was taken stays queued)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def start_at_group(self, record_start: bool) -> None:
        """Read the partitions the map gives this worker from the consumer group's
        positions; with ``record_start``, note them and start ingest (else a recovery,
        next, seeks and starts it)."""
        st = self._state
        tps = [TopicPartition(st.ingress_topic, p) for p in st.mine()]
        consumer = self._kafka.consumer
        consumer.assign(tps)
        self._next.clear()  # (the group's positions: known from the first record on)
        if record_start:
            for tp in tps:
                st.started_at(tp.partition, await consumer.position(tp))
            self.start()

    async def resume(self, gained: Mapping[int, int], skip: dict[int, list[int]] | None = None,
                     retries: Iterable[Sequence[Any]] | None = None) -> None:
        """Take requests from the partitions the map gives this worker: kept ones where
        ingest stopped, ``gained`` ones from the given offsets (``skip``: offsets already
        in the state; ``retries``: ``[tid, partition, offset, now]`` re-runs keeping their
        tids and first runs' ``now``)."""
        st = self._state
        at: dict[int, int] = {}
        for p in st.mine():
            if p in gained:
                at[p] = gained[p]
                st.started_at(p, gained[p])
            else:
                taken = st.offsets.next_offset(p)
                at[p] = taken if taken is not None else st.start_offsets[p]
        self._seek(at)
        st.expect(skip, retries)
        self.start()

    def start_where_taken(self) -> None:
        """(Re)start after a rejoin of a restarted coordinator: each partition from one past
        the last offset taken (the others where the consumer is). The consumer's own
        position can lie below it — a recovery's read took records ingest never fetched,
        and the coordinator went away before that recovery's replay was over (the
        ``faults`` series, seed 777: ``offset 4031 of partition 2 taken out of order (next
        is 4039)`` made the worker leave, 4 s more of the longest gap)."""
        st = self._state
        at = {p: o for p in st.mine() if (o := st.offsets.next_offset(p)) is not None}
        self._seek(at)
        self.start()

    def restart_at(self, at: Mapping[int, int]) -> None:
        """Read each partition of this worker from offset ``at[p]`` on (a recovery)."""
        self._seek(at)
        self._state.start_offsets.update(at)
        self.start()

    def _rewound(self, tp: TopicPartition, offset: int, expected: int) -> None:
        """The consumer went back (see the module docstring): put it where ingest was and
        fetch again — a stale leader (aiokafka has no leader epochs, KIP-320) is replaced at
        the next metadata refresh — or, past :data:`REWOUND_FOR` seconds, fail."""
        now = ports.current().clock.monotonic()
        since, last = self._rewound_since.get(tp.partition, (now, now))
        if now - last > 2.0:  # (an old episode: the partition was idle since, not rewound)
            since = now
        self._rewound_since[tp.partition] = (since, now)
        if now - since > REWOUND_FOR:
            raise IngressRewound(
                f"ingress {tp.topic}[{tp.partition}]: the consumer went back to offset {offset} "
                f"from {expected} again and again for {now - since:.0f} s (its position was out "
                "of range and reset: the partition's leader lacks records it acknowledged?)")
        log.warning("ingress %s[%d]: the consumer went back to offset %d from %d (a stale "
                    "leader?); reading from %d again", tp.topic, tp.partition, offset, expected,
                    expected)
        self.rewinds += 1
        self._kafka.consumer.seek(tp, expected)

    def read_to(self) -> dict[int, int]:
        """Partition → the offset after the last record ingest took from it (where known):
        Kafka holds at least that much."""
        return dict(self._next)

    def _seek(self, at: Mapping[int, int]) -> None:
        topic = self._state.ingress_topic
        consumer = self._kafka.consumer
        consumer.assign([TopicPartition(topic, p) for p in self._state.mine()])
        self._next = {p: o for p, o in self._next.items() if p in at}
        for p, offset in at.items():
            consumer.seek(TopicPartition(topic, p), offset)
            self._next[p] = offset

    def completed(self) -> None:
        """A request completed: wake ingest once a batch fits again."""
        if not self.room.is_set() and self._state.offsets.in_flight <= self.limit - self._max_batch:
            self.room.set()

    def complete(self, partition: int, offset: int) -> None:
        """The request read at ingress ``partition:offset`` completed (see ``worker.egress``)."""
        self._state.offsets.complete(partition, offset)
        self.completed()

    async def run(self) -> None:
        """Take requests until cancelled (:meth:`start` / :meth:`pause`)."""
        st = self._state
        while True:
            room = self.limit - st.offsets.in_flight
            if room <= 0:
                self.stalls += 1
                self.room.clear()
                await self.room.wait()
                continue
            data = await self._kafka.consumer.getmany(timeout_ms=500,
                                                      max_records=min(self._max_batch, room))
            got = False
            loop = st.loop
            assert loop is not None
            for tp, records in data.items():
                held = st.skip.get(tp.partition, ()) if st.skip else ()
                expected = self._next.get(tp.partition)
                if records and expected is not None and records[0].offset < expected:
                    self._rewound(tp, records[0].offset, expected)
                    records = []
                if records:
                    self._rewound_since.pop(tp.partition, None)
                    self._next[tp.partition] = records[-1].offset + 1
                for rec in records:
                    item = self.take(tp.partition, rec.offset, rec.value, held)
                    if item is None:
                        continue
                    at = (tp.partition, rec.offset)
                    retry = st.retry_at.pop(at, None) if st.retry_at else None
                    if retry is None:
                        loop.queue.append(item)
                    else:  # a re-run waiting at the rescale's round: it keeps its tid and now
                        tid, now, journal = retry
                        item.rerun(now, journal)
                        loop.sequencer.requeue(tid, item)
                    got = True
            if got:
                assert self._arrived is not None, "Ingress.wakes: not wired"
                self._arrived.work_arrived()

    # -- one record -------------------------------------------------------------------------
    def take(self, partition: int, offset: int, value: bytes | None,
             held: Collection[int] = ()) -> Pending | None:
        """Take ingress record ``partition:offset``: the request to run, or None when it
        needs no epoch — a round holds it (``offset`` in ``held``: in the state, its reply
        out) or it was rejected (and answered, if it could be)."""
        st = self._state
        st.offsets.take(partition, offset)
        st.applied.take(partition, offset)
        if offset in held:
            self.complete(partition, offset)
            st.applied.complete(partition, offset)
            return None
        req = self.admit(partition, offset, value)
        if req is not None and req.function in READS:
            self._read(partition, offset, req)
            return None
        return None if req is None else Pending(req, partition, offset)

    def _read(self, partition: int, offset: int, req: wire.Request) -> None:
        """A state read (``sfaas.runtime.txn.reads``): answered now, from the committed
        state, outside any epoch."""
        st = self._state
        if not st.reads_open:
            # a recovery rolled the stores back (its replay is not over) or none began yet:
            # answering now could show state older than replies already sent
            self._held_reads.append((partition, offset, req))
            return
        st.applied.complete(partition, offset)
        if req.rid in st.answered or st.engine is None:  # (a recovery reading it again)
            self.complete(partition, offset)
            return
        eng = st.engine
        try:
            value = read(eng.app, eng.stores, lambda op, k: partition_of(op, k, eng.partitions),
                         req.operator, req.key, req.function, req.args)
            reply = wire.Reply(req.rid, True, value)
        except SfaasError as exc:
            etype, reason = describe(exc)
            reply = wire.Reply(req.rid, False, None, etype, reason)
        self.reads += 1
        self._replies.add(req.reply_partition, reply.encode(), partition, offset)

    def answer_held_reads(self) -> None:
        """Reads may be answered again: answer those taken meanwhile."""
        held, self._held_reads = self._held_reads, []
        for partition, offset, req in held:
            self._read(partition, offset, req)

    def forget_held_reads(self) -> None:
        """A recovery: the reads held are taken again from Kafka (their offsets are after
        the round), so they are dropped here."""
        self._held_reads = []

    def admit(self, partition: int, offset: int, value: bytes | None) -> wire.Request | None:
        """The request in ingress record ``partition:offset``, or None when it was rejected."""
        n = self._state.egress_partitions
        try:
            req = wire.Request.decode(value)  # type: ignore[arg-type]
            if req.reply_partition >= n:
                raise BadRequest(f"request {req.rid}: reply partition {req.reply_partition} does "
                                 f"not exist (the egress topic has {n})")
        except BadRequest as exc:
            self._reject(partition, offset, value, exc)
            return None
        return req

    def _reject(self, partition: int, offset: int, value: bytes | None, exc: BadRequest) -> None:
        st = self._state
        address = wire.reply_address(value) if isinstance(value, bytes) else None
        answer = address is not None and address[1] < st.egress_partitions
        self.rejected["answered" if answer else "dropped"] += 1
        log.warning("rejected the malformed request at ingress %d:%d (%s): %s", partition, offset,
                    "answered with an error" if answer else "no reply address to answer",
                    exc.reason, extra={"worker": st.index})
        st.applied.complete(partition, offset)
        if address is None or not answer or address[0] in st.answered:
            self.complete(partition, offset)
            return
        rid, reply_partition = address
        reply = wire.Reply(rid, False, None, "BadRequest", exc.reason)
        self._replies.add(reply_partition, reply.encode(), partition, offset)
