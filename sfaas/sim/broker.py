"""The simulated Kafka cluster's state: topics of partitions, each an in-memory log of
offsets; transactions and the transactional ids that fence; consumer groups' offsets; and
the faults switched on (:class:`Faults`, outages, stale leaders). The clients
(``sfaas.sim.log_clients``) act on it; ``sfaas.sim.log.SimKafka`` is its face.

What a partition holds, as Kafka's log does: every record takes an offset, and so does each
transaction's end (a *control marker*, never handed to a consumer). The *high watermark*
(``hw``) is one past the last offset; the *last stable offset* (``lso``) is the first offset
of the oldest transaction still open on the partition (``hw`` when none is): a
``read_committed`` reader stops there and skips the records of aborted transactions. The
*log start* rises when records are deleted (retention, ``delete_records``); an offset below
it, or above ``hw``, is out of range.

Time is the running loop's (``loop.time()``), never the wall clock: under
``sfaas.sim.clock`` a transaction timeout or an outage of minutes passes at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

__all__ = ["Broker", "Entry", "Faults", "Partition", "Txn", "RETAINED_RECORDS"]

#: Records a simulated partition keeps when its topic sets no retention of its own: past
#: it, the oldest are deleted (the log start rises), as Kafka's retention deletes segments.
RETAINED_RECORDS = 1_000_000


@dataclass
class Faults:
    """What goes wrong, each drawn from the broker's seeded ``random.Random`` per request
    (probabilities in [0, 1]; all off by default)."""

    #: a produce request times out: nothing appended, the delivery fails (KafkaTimeoutError)
    send_error: float = 0.0
    #: a produce request is appended but its answer is lost: the delivery fails
    #: (KafkaTimeoutError) though the record is in the log — the ambiguous case
    lost_ack: float = 0.0
    #: an idempotent producer's sequence goes out of order: the delivery fails with
    #: OutOfOrderSequenceNumber, and so does every later send of it to that partition
    #: (aiokafka's producer stays stuck: ``worker/clients.py``)
    desync: float = 0.0
    #: a fetch returns nothing (the consumer's ``getmany`` waits out its timeout)
    empty_fetch: float = 0.0
    #: seconds each produce and fetch request takes: uniform in [low, high]
    latency: tuple[float, float] = (0.0, 0.0)


@dataclass(eq=False)
class Txn:
    """One transaction of a transactional id's producer epoch."""

    tid: str
    epoch: int
    #: "open", "committed" or "aborted"
    state: str = "open"
    #: partition → the offset of its first record in this transaction
    first: dict[TopicPartition, int] = field(default_factory=dict)
    #: the broker's abort when the transaction outlives its timeout
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class Entry:
    """One offset of a partition: a record, or a transaction's control marker."""

    offset: int
    value: bytes | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    txn: Txn | None = None
    control: bool = False


class Partition:
    """One partition's log (see the module docstring)."""

    def __init__(self, tp: TopicPartition, retained: int) -> None:
        self.tp = tp
        self.retained = retained
        #: the entries from the log start on
        self.entries: list[Entry] = []
        self.start = 0
        #: open transactions with records here → their first offset here
        self.open: dict[Txn, int] = {}

    @property
    def hw(self) -> int:
        return self.start + len(self.entries)

    @property
    def lso(self) -> int:
        return min(self.open.values(), default=self.hw)

    def end(self, committed: bool) -> int:
        """Where a reader's log ends: the last stable offset, or the high watermark."""
        return self.lso if committed else self.hw

    def append(self, entry: Entry) -> None:
        assert entry.offset == self.hw, "offsets are dense"
        self.entries.append(entry)
        if len(self.entries) > self.retained:
            self.delete_before(self.hw - self.retained)

    def delete_before(self, offset: int) -> int:
        """Delete the records below ``offset`` (at most up to ``hw``); the new log start."""
        offset = min(max(offset, self.start), self.hw)
        del self.entries[: offset - self.start]
        self.start = offset
        return self.start

    def at(self, offset: int) -> Entry:
        return self.entries[offset - self.start]


class Broker:
    """The whole simulated cluster (one broker that leads every partition; its faults make
    it act like several: a partition's leader down or stale, the cluster unreachable)."""

    def __init__(self, rng: random.Random, faults: Faults | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.rng = rng
        self.faults = faults if faults is not None else Faults()
        self.topics: dict[str, list[Partition]] = {}
        #: transactional id → its current producer epoch (a newer one fences older ones)
        self.epochs: dict[str, int] = {}
        #: transactional id → its open transaction
        self.txns: dict[str, Txn] = {}
        #: (group, partition) → committed offset
        self.groups: dict[tuple[str, TopicPartition], int] = {}
        #: the whole cluster is unreachable until this loop time
        self.down_until = float("-inf")
        #: process name → until when it is cut from every broker (``SimKafka.cut``)
        self.cut_off: dict[str, float] = {}
        #: partition → until when its leader is unavailable
        self.leaderless: dict[TopicPartition, float] = {}
        #: partition → (until when, the end a stale leader answers)
        self.stale: dict[TopicPartition, tuple[float, int]] = {}
        self._changed: asyncio.Future[None] | None = None
        self._on_event = on_event
        self.producer_ids = 0

    # -- events and waiting -------------------------------------------------------------------
    def event(self, what: str) -> None:
        if self._on_event is not None:
            self._on_event(f"{self.now():.6f} {what}")

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def changed(self) -> asyncio.Future[None]:
        """A future done at the next change a reader may see (an append, a transaction's end,
        a fault's end)."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def latency(self) -> float:
        low, high = self.faults.latency
        return self.rng.uniform(low, high) if high > 0 else 0.0

    def chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    # -- availability --------------------------------------------------------------------------
    def reachable(self, owner: str | None = None) -> bool:
        """Is the cluster up, and not cut from process ``owner`` (None: anyone's view)?"""
        now = self.now()
        return now >= self.down_until and (
            owner is None or now >= self.cut_off.get(owner, float("-inf")))

    def leads(self, tp: TopicPartition, owner: str | None = None) -> bool:
        """Is ``tp``'s leader up (and the cluster reachable from ``owner``)?"""
        return self.reachable(owner) and self.now() >= self.leaderless.get(tp, float("-inf"))

    def stale_end(self, tp: TopicPartition) -> int | None:
        """The end a stale leader of ``tp`` answers with now (None: it is not stale)."""
        until, end = self.stale.get(tp, (float("-inf"), 0))
        return end if self.now() < until else None

    def fault_over(self, until: float) -> None:
        """Wake the readers when a fault ends at ``until``."""
        asyncio.get_running_loop().call_at(until, self.notify)

    # -- topics -------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, retained: int | None = None) -> None:
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} exists")
        if partitions < 1:
            raise ValueError(f"topic {name!r}: partitions must be >= 1, got {partitions}")
        keep = RETAINED_RECORDS if retained is None else retained
        self.topics[name] = [Partition(TopicPartition(name, p), keep) for p in range(partitions)]
        self.event(f"create {name} {partitions}")

    def partition(self, tp: TopicPartition) -> Partition:
        parts = self.topics.get(tp.topic)
        if parts is None or not 0 <= tp.partition < len(parts):
            raise UnknownTopicOrPartitionError(f"no partition {tp.topic}[{tp.partition}]")
        part: Partition = parts[tp.partition]
        return part

    # -- appends and transactions -------------------------------------------------------------
    def append(self, tp: TopicPartition, value: bytes | None, key: bytes | None,
               headers: tuple[tuple[str, bytes], ...], txn: Txn | None) -> Entry:
        part = self.partition(tp)
        entry = Entry(part.hw, value, key, headers, int(self.now() * 1000), txn)
        if txn is not None and tp not in txn.first:
            txn.first[tp] = entry.offset
            part.open[txn] = entry.offset
        part.append(entry)
        self.event(f"append {tp.topic}[{tp.partition}]@{entry.offset}")
        self.notify()
        return entry

    def init_producer(self, tid: str) -> int:
        """A producer of transactional id ``tid`` starts: its epoch, one above the last; the
        open transaction of the one before is aborted (fencing it)."""
        old = self.txns.get(tid)
        if old is not None:
            self.end_txn(old, commit=False)
        self.epochs[tid] = self.epochs.get(tid, -1) + 1
        self.event(f"init {tid} epoch {self.epochs[tid]}")
        return self.epochs[tid]

    def begin(self, tid: str, epoch: int, timeout: float) -> Txn:
        txn = Txn(tid, epoch)
        self.txns[tid] = txn
        txn.timer = asyncio.get_running_loop().call_later(timeout, self._expire, txn)
        return txn

    def _expire(self, txn: Txn) -> None:
        """A transaction outlived its timeout: the broker aborts it and bumps the id's epoch,
        so its producer is fenced (as aiokafka reports it: ``ProducerFenced``)."""
        if txn.state == "open":
            self.event(f"expire {txn.tid}")
            self.end_txn(txn, commit=False)
            if self.epochs.get(txn.tid) == txn.epoch:
                self.epochs[txn.tid] = txn.epoch + 1

    def end_txn(self, txn: Txn, commit: bool) -> None:
        """End ``txn``: a control marker on each partition it wrote, its records visible to
        ``read_committed`` readers (commit) or skipped by them (abort)."""
        if txn.state != "open":
            return
        txn.state = "committed" if commit else "aborted"
        if txn.timer is not None:
            txn.timer.cancel()
        if self.txns.get(txn.tid) is txn:
            del self.txns[txn.tid]
        for tp in txn.first:
            part = self.partition(tp)
            part.open.pop(txn, None)
            part.append(Entry(part.hw, None, None, (), int(self.now() * 1000), txn, True))
        self.event(f"{txn.state} {txn.tid} {sorted((tp.topic, tp.partition) for tp in txn.first)}")
        self.notify()

    def fenced(self, tid: str, epoch: int) -> bool:
        return self.epochs.get(tid, epoch) != epoch
