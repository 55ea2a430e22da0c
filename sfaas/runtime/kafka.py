"""Kafka plumbing shared by coordinator, workers and clients (aiokafka)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
)

from sfaas.errors import ClusterError
from sfaas.runtime import ports
from sfaas.runtime.ports import ClockPort, KafkaPort

log = logging.getLogger("sfaas.runtime.kafka")

__all__ = [
    "ensure_topics", "make_producer", "make_consumer", "consumer_group", "partition_count",
    "read_range", "Reachability", "LATE_PROBE", "silence_limit",
]


async def ensure_topics(bootstrap: str, topics: dict[str, int], replication: int = 1,
                        *, kafka: KafkaPort | None = None) -> dict[str, int]:
    """Create the ``topic → partitions`` that do not exist (each partition on
    ``replication`` brokers); return the actual partition counts. ``kafka``: the Kafka
    port (``sfaas.runtime.ports``; the process's when None), as in every function here."""
    admin = (kafka or ports.current().kafka).admin(bootstrap_servers=bootstrap,
                                                   request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, n, replication) for t, n in topics.items() if t not in existing]
        if new:
            try:
                await admin.create_topics(new)
                log.info("created topics %s", [t.name for t in new])
            except TopicAlreadyExistsError:
                pass
        # metadata of a just-created topic can lag: ask until every topic has partitions
        deadline = asyncio.get_running_loop().time() + 30.0
        while True:
            described = await admin.describe_topics(list(topics))
            counts = {d["topic"]: len(d["partitions"] or []) for d in described}
            if all(counts.get(t, 0) > 0 for t in topics) \
                    or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    for t, n in topics.items():
        if counts.get(t, 0) == 0:
            raise ClusterError(f"topic {t} has no partitions after creation")
        if counts[t] != n:
            log.warning("topic %s exists with %d partitions (wanted %d); using %d",
                        t, counts[t], n, counts[t])
    return counts


#: Bytes of one partition's batch a producer holds; a send waits while that batch is full.
PRODUCE_BATCH_BYTES = 1 << 20
#: A transaction open this long is aborted by the broker (its producer then fails with
#: ``ProducerFenced`` and a worker retries it through a new one: ``worker.egress``). A
#: killed worker's open transaction is aborted at once by its slot's next process; this
#: bounds how long it holds back ``read_committed`` readers if no next process comes.
TRANSACTION_TIMEOUT_MS = 20_000
#: A transactional producer's pause before asking again, ms (aiokafka's default: 100). The
#: broker answers ``CONCURRENT_TRANSACTIONS`` while it aborts or commits the id's previous
#: transaction — to every slot's new process whose predecessor died with one open (a kill,
#: a cut, a fence), and to a ``begin`` right after a commit — and each answer cost a full
#: pause: a replacing producer started in 0.12-0.13 s at 100 ms, 0.03-0.04 s at 20 ms
#: (``python -m benchmarks.runtime.client_starts``). Kafka's Java producer pauses 20 ms on
#: that answer too. Produce retries of these producers pause as long.
TXN_RETRY_BACKOFF_MS = 20
#: Bytes a consumer prefetches per partition, and per fetch in all: it fetches again for a
#: partition only once its records were taken, so what is not taken stays in Kafka. (4 and
#: 16 MiB made a worker's memory grow by a quarter under overload; these commit as much.)
FETCH_PARTITION_BYTES = 256 << 10
FETCH_BYTES = 1 << 20
#: How often producers and consumers refresh the cluster's metadata. aiokafka retries a
#: request to a broker it cannot reach without looking for the partition's new leader
#: (``NodeNotReadyError`` is not an "invalid metadata" error), so a lost broker's partitions
#: are found elsewhere only at the next refresh (measured: a broker stopped for 10 s held
#: replies for 13 s with aiokafka's default of 5 minutes). With several brokers (a list of
#: bootstrap servers) every 0.5 s: a broker loss then costs the brokers' session timeout
#: (deploy/images/kafka-entry.sh) plus at most this; a lone broker has no other leader to
#: find, its clients refresh every 2 s.
METADATA_MAX_AGE_MS = 500
METADATA_MAX_AGE_ONE_BROKER_MS = 2000


def metadata_max_age_ms(bootstrap: str) -> int:
    """The metadata refresh interval of clients of ``bootstrap`` (see above)."""
    return METADATA_MAX_AGE_MS if "," in bootstrap else METADATA_MAX_AGE_ONE_BROKER_MS


#: Seconds a probe waits for a broker to accept its TCP connection (the kernel's handshake,
#: not the broker's work: a millisecond on a loaded host). A cut is seen only when a probe
#: times out past the limit, and one probe runs at a time: at 0.5 s the cuts series' cuts
#: took 1.29-1.53 s to be called (1.125 s limit), at 0.25 s 1.28-1.39 s.
PROBE_TIMEOUT = 0.25
#: A probe that timed out this many of its timeouts after it began came late because this
#: process did not run (its event loop or its core was busy): it is not counted as silence.
LATE_PROBE = 1.5


class Reachability:
    """Can this process reach Kafka at all? Each :meth:`probe` opens (and closes) a TCP
    connection to the next broker of the bootstrap list, in turn; :meth:`silence` is the
    seconds since one last answered. A broker cut off or stopped fails its turns only — the
    others answer theirs — so only a process cut from every broker falls silent. (The
    clients' own traffic says less: a worker whose partitions all lead on one cut broker
    waits on it alone, and aiokafka's metadata refresh can wait behind it for its request
    timeout.)"""

    def __init__(self, bootstrap: str, timeout: float = PROBE_TIMEOUT, *,
                 kafka: KafkaPort | None = None,
                 clock: ClockPort | None = None) -> None:
        self._kafka = kafka or ports.current().kafka
        self._clock = clock or ports.current().clock
        self._hosts = [(h, int(p)) for h, p in (e.strip().rsplit(":", 1)
                                                for e in bootstrap.split(",") if e.strip())]
        self._timeout = timeout
        self._turn = 0
        self._probing = False
        #: when a broker last answered (None: not probed yet), and the silence as of the
        #: last probe — probes that did not run (a standby before its promotion, a busy
        #: loop) are not silence
        self._last_ok: float | None = None
        self._silent = 0.0
        #: per broker, its probe still running past its timeout (see :meth:`_ask`)
        self._hung: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def probe(self) -> None:
        """Try the next broker (nothing when the previous probe is still running)."""
        if self._probing or not self._hosts:
            return
        self._probing = True
        if self._last_ok is None:
            self._last_ok = self._clock.monotonic()
        host, port = self._hosts[self._turn % len(self._hosts)]
        self._turn += 1
        started = self._clock.monotonic()
        try:
            await self._ask(host, port)
            self._last_ok, self._silent = self._clock.monotonic(), 0.0
        except TimeoutError:
            now = self._clock.monotonic()
            if now - started <= LATE_PROBE * self._timeout:
                self._silent = now - self._last_ok
            # (else this process stood still — a busy host, a long turn of its loop — and
            # the probe says nothing of Kafka: at a limit of 1.5 heartbeat timeouts a 1.2 s
            # stall would read as a cut and replace a healthy worker)
        except OSError:  # (unreachable, refused, a name that no longer resolves)
            self._silent = self._clock.monotonic() - self._last_ok
        finally:
            self._probing = False

    async def _ask(self, host: str, port: int) -> None:
        """One probe of ``host:port``, given up after the timeout (``TimeoutError``) even if it
        does not end: ``wait_for`` waited for its cancellation, and a connection whose name
        lookup hangs (a stopped broker's, in the nemesis: 5 s) cannot be cancelled — every
        other broker's turn waited behind it, and its end counted the whole wait as silence:
        a worker back from a coordinator cut was replaced as "cut from Kafka for 5.1 s" while
        two brokers of three were up. A probe still running after its cancel keeps its
        broker's later turns failing at once, without a second one."""
        hung = self._hung.get((host, port))
        if hung is not None:
            if not hung.done():
                raise TimeoutError
            del self._hung[(host, port)]
        task = asyncio.ensure_future(self._kafka.probe(host, port))
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            # (a connection attempt ends at the cancel — one kept would hold its broker's
            # turns for the kernel's SYN retries, ~2 min; a name lookup does not)
            task.cancel()
            task.add_done_callback(_ended)
            self._hung[(host, port)] = task
            raise TimeoutError
        task.result()

    def silence(self) -> float:
        """Seconds from a broker's last answer to the last probe that got none (0.0 when the
        last probe was answered, or none ran)."""
        return self._silent


def _ended(task: asyncio.Future[None]) -> None:
    """(a probe left running ended) Its outcome is not wanted: taken, so asyncio does not
    log it as an exception never retrieved."""
    if not task.cancelled():
        task.exception()


def silence_limit(bootstrap: str, heartbeat_timeout: float) -> float:
    """How long a worker may hear nothing from Kafka before the coordinator replaces it
    (while other workers do hear it): 1.5 heartbeat timeouts, and with several brokers at
    least three metadata refreshes (a worker's probes take the brokers in turn, and those
    of brokers cut or stopped fail between the answers of the others: 1.5 s). A lone
    broker's probes are its own: the limit was three of its 2 s refreshes, and a worker cut
    from it stalled the replies for the 6 s (the ``cuts`` series, 6.6-6.8 s per cut)."""
    if "," not in bootstrap:
        return 1.5 * heartbeat_timeout
    return max(3 * metadata_max_age_ms(bootstrap) / 1000, 1.5 * heartbeat_timeout)


def make_producer(bootstrap: str, linger_ms: int = 0, *, durable: bool = False,
                  transactional_id: str | None = None,
                  kafka: KafkaPort | None = None) -> AIOKafkaProducer:
    """A producer tuned for low latency with batching under load.

    ``durable`` (workers: the epoch log): ``acks=all`` and idempotence, so an acknowledged
    record survives a broker failover and a retried send is never duplicated.
    ``transactional_id`` (workers: replies, ``worker.egress``): durable, and its records are
    written in transactions; a newer producer of the same id fences this one.
    """
    durable = durable or transactional_id is not None
    txn: dict[str, Any] = {} if transactional_id is None else {
        "transactional_id": transactional_id,
        "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
        "retry_backoff_ms": TXN_RETRY_BACKOFF_MS,
    }
    return (kafka or ports.current().kafka).producer(
        bootstrap_servers=bootstrap,
        linger_ms=linger_ms,
        acks="all" if durable else 1,
        enable_idempotence=durable,
        **txn,
        max_batch_size=PRODUCE_BATCH_BYTES,
        request_timeout_ms=30000,
        metadata_max_age_ms=metadata_max_age_ms(bootstrap),
    )


def consumer_group(settings: Any, app: str) -> str:
    """The consumer group of ``app``'s workers (offsets of their ingress partitions)."""
    return f"{settings.namespace}.{app}.workers"


def make_consumer(bootstrap: str, group: str | None, fetch_wait_ms: int, *,
                  kafka: KafkaPort | None = None) -> AIOKafkaConsumer:
    """A manually assigned consumer (no rebalancing) with a short fetch wait."""
    return (kafka or ports.current().kafka).consumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_wait_ms,
        max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
        fetch_max_bytes=FETCH_BYTES,
        metadata_max_age_ms=metadata_max_age_ms(bootstrap),
    )


async def partition_count(producer: AIOKafkaProducer, topic: str, timeout: float = 30.0) -> int:
    """Partitions of ``topic``, waiting (up to ``timeout``) for the runtime to create it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            parts = await producer.partitions_for(topic)
            if parts:
                return len(parts)
        except Exception as exc:  # unknown topic while the coordinator is still starting
            log.debug("waiting for topic %s: %s", topic, exc)
        if asyncio.get_running_loop().time() > deadline:
            raise ClusterError(f"topic {topic} does not exist; is the coordinator running?")
        await asyncio.sleep(0.2)


#: How long :func:`read_range` keeps asking when Kafka's answers cannot be right (an end
#: before what is known to exist, a position "out of range"): a broker back from a
#: partition answers as the leader it no longer is until it learns otherwise (aiokafka
#: sends no leader epochs, KIP-320) — about a second — and a new leader needs the brokers'
#: session timeout to be elected.
READ_RANGE_PATIENCE = 30.0
#: How long one poll of :func:`read_range` waits for records, ms. A partition whose last
#: offsets hold no record to hand out (an aborted transaction's, a commit marker: every
#: recovery's egress fence leaves both) returns none, and only the position says the read
#: got there: a poll waiting 200 ms for records made every recovery 0.2 s longer.
READ_POLL_MS = 10
#: The pauses between :func:`read_range`'s askings of a short end, s: from short to long.
#: The common short end is not a stale leader but the last stable offset of a
#: ``read_committed`` read, held behind the recovery's egress fences — every worker's,
#: written at once in transactions each aborts (``worker.egress.Egress.fence``) — until
#: their markers land, a few ms later. A first pause of 0.2 s was 0.2–0.4 s of every
#: failover with a standby (issue 48). A stale leader still gets its metadata refresh
#: before every asking, and the long pauses after the first few.
SHORT_END_PAUSES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
#: After how many askings a short end is logged as a warning (before: at debug).
SHORT_END_WARN = 4
#: How long one request of :func:`read_range`'s consumer may wait for its broker, ms
#: (aiokafka's default: 40 s). A request to a broker cut off — the leader of a partition
#: the read wants, or the first of the bootstrap list — is answered by nobody until the
#: cut heals; the read waited that long (nemesis seed 5: a recovery's replies read took
#: 4.1 s, a cut broker's 3.1 s and more). Timed out, it is asked again after a metadata
#: refresh, which names the partition's new leader once the brokers fenced the cut one
#: (their session timeout, 1 s in our images); the whole read still has its patience.
READ_REQUEST_TIMEOUT_MS = 2000


async def _read_consumer(bootstrap: str, committed: bool, kafka: KafkaPort | None,
                         deadline: float) -> Any:
    """:func:`read_range`'s consumer, started: a start that reached no broker in
    :data:`READ_REQUEST_TIMEOUT_MS` per bootstrap broker is tried again with a new one
    until ``deadline`` (the loop's clock)."""
    loop = asyncio.get_running_loop()
    while True:
        consumer = (kafka or ports.current().kafka).consumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="none",
            isolation_level="read_committed" if committed else "read_uncommitted",
            max_partition_fetch_bytes=FETCH_PARTITION_BYTES, fetch_max_wait_ms=50,
            metadata_max_age_ms=metadata_max_age_ms(bootstrap),
            request_timeout_ms=READ_REQUEST_TIMEOUT_MS)
        try:
            await consumer.start()
            return consumer
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            await consumer.stop()
            if loop.time() > deadline:
                raise ClusterError(f"cannot reach Kafka at {bootstrap} to read: {exc}") from None
            log.warning("reading from Kafka: %s; trying again", exc)
            await asyncio.sleep(SHORT_END_PAUSES[-1])


async def read_range(
    bootstrap: str, starts: dict[TopicPartition, int],
    at_least: dict[TopicPartition, int] | None = None,
    patience: float = READ_RANGE_PATIENCE, *, committed: bool = False,
    kafka: KafkaPort | None = None,
) -> dict[int, list[tuple[int, bytes]]]:
    """Records of each partition from its start offset to its end now:
    partition → [(offset, value)]. ``committed``: ``read_committed`` — no record of an
    aborted transaction, and the end is the last stable offset (the egress topic's
    replies: ``worker.egress``).

    Never fewer than Kafka holds without saying so. A recovery replays what this returns,
    and a record left out is executed a second time (the nemesis saw a counter two bumps
    over), so: a position Kafka calls out of range is fetched again after a metadata
    refresh, never reset (aiokafka would jump to the end); an end before a partition's
    start or before ``at_least[tp]`` (an offset the caller knows was acknowledged) is
    asked again; past ``patience`` seconds a :class:`~sfaas.errors.ClusterError` names
    the partition. Both are what a stale leader answers (see :data:`READ_RANGE_PATIENCE`);
    the end is asked twice, the second time after a metadata refresh, and the larger
    answer kept."""
    if not starts:
        return {}
    need = {tp: max(starts[tp], (at_least or {}).get(tp, 0)) for tp in starts}
    deadline = asyncio.get_running_loop().time() + patience
    consumer = await _read_consumer(bootstrap, committed, kafka, deadline)
    read = _RangeRead(consumer, list(starts), deadline, patience)
    try:
        consumer.assign(read.tps)
        # (positioned before anything awaits: a partition assigned without a position sends
        # aiokafka's fetcher to look for one, which ``auto_offset_reset="none"`` cannot give,
        # and a seek after that left the fetcher idle for its 0.2 s poll interval — 0.21 s
        # of a promoted standby's recovery in 4 of 6 failovers; the records fetched while
        # the ends are asked are kept)
        for tp, start in starts.items():
            consumer.seek(tp, start)
        return await read.records(starts, await read.ends(need))
    finally:
        await consumer.stop()


class _RangeRead:
    """One :func:`read_range`: its consumer (assigned ``tps``), and how often it asked
    again after a metadata refresh, until ``deadline`` (the loop's clock)."""

    def __init__(self, consumer: Any, tps: list[TopicPartition], deadline: float,
                 patience: float) -> None:
        self.consumer, self.tps = consumer, tps
        self._deadline, self._patience = deadline, patience
        self._asked = 0

    async def refresh(self, why: str) -> None:
        """Ask Kafka for fresh metadata and pause before asking again (past the deadline:
        a :class:`~sfaas.errors.ClusterError` saying ``why``)."""
        if asyncio.get_running_loop().time() > self._deadline:
            raise ClusterError(f"cannot read {why} for {self._patience:.0f} s; Kafka's "
                               "partition leaders keep answering as if records were missing")
        log.log(logging.WARNING if self._asked >= SHORT_END_WARN else logging.DEBUG,
                "reading %s; asking again after a metadata refresh", why)
        await self.consumer._client.force_metadata_update()  # (no public call for it)
        await asyncio.sleep(SHORT_END_PAUSES[min(self._asked, len(SHORT_END_PAUSES) - 1)])
        self._asked += 1

    async def _end_offsets(self) -> dict[TopicPartition, int]:
        while True:
            try:
                return dict(await self.consumer.end_offsets(self.tps))
            except KafkaTimeoutError as exc:  # (a leader cut off: its new one, once named)
                await self.refresh(f"the end offsets of {self.tps[0].topic}: {exc}")

    async def ends(self, need: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Each partition's end, asked until it is not before ``need``, then once more
        after a metadata refresh (the larger answer kept)."""
        ends = await self._end_offsets()
        while short := [tp for tp in self.tps if ends[tp] < need[tp]]:
            tp = short[0]
            await self.refresh(f"{tp.topic}[{tp.partition}]: its end is {ends[tp]}, "
                               f"before offset {need[tp]}, which exists")
            ends = await self._end_offsets()
        await self.consumer._client.force_metadata_update()
        again = await self._end_offsets()
        return {tp: max(ends[tp], again[tp]) for tp in self.tps}

    async def records(self, starts: dict[TopicPartition, int],
                      ends: dict[TopicPartition, int]) -> dict[int, list[tuple[int, bytes]]]:
        """Every record from each start (where the consumer stands) to its end (out of
        range: asked again)."""
        consumer, tps = self.consumer, self.tps
        out: dict[int, list[tuple[int, bytes]]] = {tp.partition: [] for tp in tps}
        at = dict(starts)  # the next offset wanted, per partition
        while [tp for tp in tps if at[tp] < ends[tp]]:
            try:
                got = await consumer.getmany(timeout_ms=READ_POLL_MS)
            except OffsetOutOfRangeError as exc:
                tp = next(iter(exc.args[0])) if exc.args and isinstance(exc.args[0], dict) \
                    else tps[0]
                await self.refresh(f"{tp.topic}[{tp.partition}] at offset {at.get(tp)}: "
                                   "out of range")
                for t in tps:
                    consumer.seek(t, at[t])
                continue
            for tp, records in got.items():
                for r in records:
                    if at[tp] <= r.offset < ends[tp]:
                        out[tp.partition].append((r.offset, r.value))
                        at[tp] = r.offset + 1
            for tp in tps:  # (past offsets without a record to hand out: control records)
                if at[tp] < ends[tp]:
                    at[tp] = max(at[tp], await consumer.position(tp))
        return out
