"""Clients: send requests through Kafka, get each request's single reply.

>>> async with Client(app="bank", bootstrap="127.0.0.1:9092") as client:
...     await client.call("accounts", "alice", "deposit", 10)

A request goes to the ingress partition owning its key; the reply comes back on the egress
partition this client listens to, matched by request id. Validation that needs no
cluster (key type, serializable arguments; names and arity when given the :class:`App`)
happens before anything is sent.

A client waits for at most ``max_in_flight`` replies at once (default
:data:`MAX_IN_FLIGHT`): :meth:`Client.submit` beyond it waits until a reply arrives, so
an application sending faster than the cluster answers is slowed down instead of growing
the client's memory. A :meth:`Client.call` that times out stops waiting for its reply; a
request Kafka refused (its delivery failed) fails its call at once with
:class:`~sfaas.errors.ClusterError`.

The client talks to Kafka through librdkafka (``confluent-kafka``), not the workers'
asyncio client: its requests leave without waiting for one another's acknowledgements,
and the protocol work runs in C, off the caller's event loop. A reader thread waits for
replies and hands them to the event loop in batches (at most :data:`REPLY_BATCHES_QUEUED`
batches waiting there); only the loop's thread touches the calls waiting for replies.
At 1,000 requests per second this client costs ~0.18 of a core and answers ~1.7 ms sooner
than the asyncio one it replaced (benchmarks/README.md, "The client").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from crc32c import crc32c

from .app import App
from .codec import check_arguments
from .errors import BadKey, ClusterError, RequestTimeout, reply_error
from .kafka import FETCH_BYTES, FETCH_PARTITION_BYTES
from .partitioning import partition_of
from .settings import Settings
from .wire import ProtocolError, Reply, Request

log = logging.getLogger("sfaas.client")

__all__ = ["Client", "SyncClient", "MAX_IN_FLIGHT", "REPLY_BATCH", "REPLY_BATCHES_QUEUED"]

#: Requests a client waits for at once, by default (see module docstring).
MAX_IN_FLIGHT = 100_000
#: Most replies the reader thread hands to the event loop at once.
REPLY_BATCH = 1000
#: Batches of replies handed to the event loop and not yet taken; the reader waits beyond.
REPLY_BATCHES_QUEUED = 8
#: KiB of records librdkafka prefetches for the reply consumer / buffers for the producer.
CONSUMER_QUEUE_KIB = 8 << 10
PRODUCER_QUEUE_KIB = 64 << 10
#: Seconds a client waits at start for the app's topics to exist, and for Kafka to answer.
START_TIMEOUT = 30.0
REACH_TIMEOUT = 10.0


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def _kafka_config(s: Settings) -> dict[str, Any]:
    return {"bootstrap.servers": s.kafka, "socket.nagle.disable": True,
            "logger": logging.getLogger("sfaas.client.kafka")}


class Client:
    """An asyncio client of one app's cluster (see module docstring)."""

    def __init__(
        self,
        app: str | App,
        bootstrap: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 60.0,
        settings: Settings | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._room = asyncio.Event()
        self.settings = settings or Settings.load({"kafka": bootstrap, "namespace": namespace})
        self.app = app if isinstance(app, App) else None
        self.app_name = app.name if isinstance(app, App) else str(app)
        self.timeout = timeout
        self.ingress, self.egress = self.settings.topics(self.app_name)
        self.client_id = uuid.uuid4().hex
        self._seq = 0
        #: the request id of the last request submitted
        self.last_rid = ""
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._started = False
        #: egress records on this client's partition that were not replies (logged, skipped)
        self.rejected = 0

    async def start(self) -> None:
        """Connect to Kafka and start listening for replies (called by ``async with``)."""
        if self._started:
            return
        s = self.settings
        producer = Producer({**_kafka_config(s), "linger.ms": s.linger_ms, "acks": 1,
                             "enable.idempotence": False,
                             "queue.buffering.max.kbytes": PRODUCER_QUEUE_KIB})
        try:
            self.partitions = await self._partition_count(producer, self.ingress)
            egress_parts = await self._partition_count(producer, self.egress)
        except BaseException:
            await asyncio.to_thread(producer.flush, 1.0)
            raise
        self.reply_partition = crc32c(self.client_id.encode()) % egress_parts
        consumer = Consumer({**_kafka_config(s), "group.id": f"sfaas-client-{self.client_id}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": s.fetch_wait_ms,
                             "fetch.min.bytes": 1, "max.partition.fetch.bytes": FETCH_PARTITION_BYTES,
                             "fetch.max.bytes": FETCH_BYTES, "queued.max.messages.kbytes": CONSUMER_QUEUE_KIB})
        tp = TopicPartition(self.egress, self.reply_partition)
        try:
            # pin the start before any request goes out: replies come after the end now
            _, end = await asyncio.to_thread(consumer.get_watermark_offsets, tp, START_TIMEOUT)
        except KafkaException as exc:
            await asyncio.to_thread(consumer.close)
            raise ClusterError(f"cannot read the end of {self.egress}[{self.reply_partition}] at "
                               f"{s.kafka}: {_reason(exc)}") from None
        consumer.assign([TopicPartition(self.egress, self.reply_partition, end)])
        self._producer, self._consumer = producer, consumer
        self._stop = threading.Event()
        self._handoff = threading.Semaphore(REPLY_BATCHES_QUEUED)
        self._reader = threading.Thread(target=self._read_replies, args=(asyncio.get_running_loop(),),
                                        name=f"sfaas-client-replies-{self.client_id[:8]}", daemon=True)
        self._reader.start()
        self._poller = asyncio.create_task(self._poll_deliveries())
        self._started = True

    async def _partition_count(self, producer: Producer, topic: str) -> int:
        """Partitions of ``topic``, waiting (up to :data:`START_TIMEOUT`) for the coordinator
        to create it; a Kafka that does not answer within :data:`REACH_TIMEOUT` fails at once."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                md = await asyncio.to_thread(producer.list_topics, topic, REACH_TIMEOUT)
            except KafkaException as exc:
                raise ClusterError(f"cannot reach Kafka at {self.settings.kafka}: {_reason(exc)}") from None
            t = md.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return len(t.partitions)
            if time.monotonic() > deadline:
                raise ClusterError(f"topic {topic} does not exist; is the coordinator running?")
            log.debug("waiting for topic %s (%s)", topic, t.error if t is not None else "not listed")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Stop listening; pending calls fail with ``RequestTimeout``-free cancellation."""
        if not self._started:
            return
        self._started = False
        self._stop.set()
        self._handoff.release()  # a reader waiting for room sees the stop
        self._poller.cancel()
        await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.to_thread(self._reader.join)  # (it closes the consumer)
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
        self._room.set()  # a submit waiting for room fails now
        await asyncio.to_thread(self._producer.flush, 5.0)

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _read_replies(self, loop: asyncio.AbstractEventLoop) -> None:
        """(reader thread) Hand every record of the reply partition to the event loop."""
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                first = consumer.poll(0.2)
                if first is None:
                    continue
                batch: list[tuple[int, bytes | None]] = []
                for msg in [first, *consumer.consume(REPLY_BATCH - 1, 0)]:
                    err = msg.error()
                    if err is None:
                        batch.append((msg.offset() or 0, msg.value()))
                    elif err.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading replies from %s: %s", self.egress, err)
                if not batch:
                    continue
                self._handoff.acquire()  # at most REPLY_BATCHES_QUEUED batches wait in the loop
                if self._stop.is_set():
                    return
                try:
                    loop.call_soon_threadsafe(self._deliver, batch)
                except RuntimeError:  # the loop closed under us
                    return
        finally:
            consumer.close()

    def _deliver(self, batch: list[tuple[int, bytes | None]]) -> None:
        self._handoff.release()
        self._take_replies(batch)

    def _take_replies(self, batch: list[tuple[int, bytes | None]]) -> None:
        """(event loop) Complete the calls these ``(offset, record value)`` answer."""
        for offset, value in batch:
            try:
                if value is None:
                    raise ProtocolError("the record has no value")
                reply = Reply.decode(value)
            except ProtocolError as exc:
                self.rejected += 1
                log.warning("ignoring malformed reply at offset %d: %s", offset, exc)
                continue
            fut = self._waiting.pop(reply.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        if len(self._waiting) < self.max_in_flight:
            self._room.set()

    async def _poll_deliveries(self) -> None:
        """Serve the producer's delivery reports (a failed one fails its call)."""
        while True:
            self._producer.poll(0)
            await asyncio.sleep(0.05)

    def _delivered(self, rid: str, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            return
        fut = self._waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(ClusterError(f"request {rid} was not delivered to {self.ingress}: {err.str()}"))
        if len(self._waiting) < self.max_in_flight:
            self._room.set()

    def _validate(self, operator: str, key: str, function: str, args: tuple[Any, ...]) -> None:
        if self.app is not None:
            self.app.validate(operator, key, function, args)
            return
        if not isinstance(key, str) or not key:
            raise BadKey(f"key for operator {operator!r} must be a non-empty str, got {key!r:.80}")
        check_arguments(list(args), f"arguments of {operator}.{function}")

    async def submit(self, operator: str, key: str, function: str, *args: Any) -> asyncio.Future[Reply]:
        """Send a request; the returned future resolves to its raw :class:`Reply`."""
        return (await self._submit(operator, key, function, args))[1]

    async def _submit(self, operator: str, key: str, function: str,
                      args: tuple[Any, ...]) -> tuple[str, asyncio.Future[Reply]]:
        if not self._started:
            await self.start()
        self._validate(operator, key, function, args)
        while len(self._waiting) >= self.max_in_flight:
            self._room.clear()
            await self._room.wait()
            if not self._started:
                raise RuntimeError(f"client of app {self.app_name!r} closed while a request waited to be sent")
        self._seq += 1
        rid = self.last_rid = f"{self.client_id}-{self._seq}"
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        req = Request(rid, operator, key, function, list(args), self.reply_partition, time.time())
        value, part = req.encode(), partition_of(operator, key, self.partitions)
        report = functools.partial(self._delivered, rid)
        while True:
            try:
                self._producer.produce(self.ingress, value, partition=part, on_delivery=report)
                break
            except BufferError:  # librdkafka's queue is full: let it drain
                await asyncio.sleep(0.005)
                self._producer.poll(0)
        return rid, fut

    def _forget(self, rid: str) -> None:
        if self._waiting.pop(rid, None) is not None and len(self._waiting) < self.max_in_flight:
            self._room.set()

    async def call(self, operator: str, key: str, function: str, *args: Any) -> Any:
        """Run one transaction and return its result; raises ``TransactionAborted(reason)``."""
        rid, fut = await self._submit(operator, key, function, args)
        try:
            reply = await asyncio.wait_for(fut, self.timeout)
        except TimeoutError:
            self._forget(rid)
            raise RequestTimeout(
                f"no reply to {operator}/{key}.{function} within {self.timeout} s "
                f"(is the cluster for app {self.app_name!r} running?)"
            ) from None
        if reply.ok:
            return reply.value
        raise reply_error(reply.error_type or "TransactionAborted", reply.reason or "aborted")


class SyncClient:
    """A blocking :class:`Client`: runs one on a private event loop in a background thread."""

    def __init__(self, app: str | App, bootstrap: str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sfaas-client", daemon=True)
        self._thread.start()
        self._client = Client(app, bootstrap, **kwargs)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, operator: str, key: str, function: str, *args: Any) -> Any:
        """Like :meth:`Client.call`, blocking."""
        return self._run(self._client.call(operator, key, function, *args))

    def close(self) -> None:
        """Stop the client and its thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
