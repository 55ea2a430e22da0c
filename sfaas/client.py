"""Clients: send requests through Kafka, get each request's single reply.

>>> async with Client(app="bank", bootstrap="127.0.0.1:9092") as client:
...     await client.call("accounts", "alice", "deposit", 10)
...     await client.call(deposit, "alice", 10)   # the same through the function's handle

A request goes to the ingress partition owning its key; the reply comes back on the egress
partition this client listens to, matched by request id. Validation that needs no
cluster (key type, serializable arguments; names and arity when given the :class:`App`)
happens before anything is sent.

A client waits for at most ``max_in_flight`` replies at once (default
:data:`MAX_IN_FLIGHT`): :meth:`Client.submit` beyond it waits until a reply arrives, so
an application sending faster than the cluster answers is slowed down instead of growing
the client's memory. A :meth:`Client.call` that times out stops waiting for its reply; a
request Kafka did not take (its delivery failed) fails its call at once with
:class:`~sfaas.errors.ClusterError`, as does starting a client whose Kafka cannot be reached.

One delivery failure is not final: with replicated topics the producer is idempotent, and
aiokafka's idempotent producer, once a broker answered ``OutOfOrderSequenceNumber`` (seen
after a broker restart under load: the new leader's sequence of this producer is behind
the one the producer holds), rejects every later request to that partition — the Java
client resets its producer epoch there, aiokafka does not. The broker appended none of the
rejected records, so the client replaces its producer (a new producer id: sequences start
over) and sends those requests again, each at most :data:`RESENDS` times.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, TypeVarTuple, overload

from aiokafka import TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)
from crc32c import crc32c

from sfaas.app import App, FunctionRef, call_target
from sfaas.direct import DirectCalls
from sfaas.errors import BadKey, BadRequest, ClusterError, RequestTimeout, reply_error
from sfaas.reads import DirectReads, Unavailable
from sfaas.runtime import tracing
from sfaas.runtime.codec import check_arguments
from sfaas.runtime.kafka import make_consumer, make_producer, partition_count
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.settings import Settings
from sfaas.runtime.wire import FENCE, MAX_RID, ProtocolError, Reply, Request

log = logging.getLogger("sfaas.client")

P = ParamSpec("P")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")

__all__ = ["Client", "SyncClient", "MAX_IN_FLIGHT"]

#: Requests a client waits for at once, by default (see module docstring).
MAX_IN_FLIGHT = 100_000
#: Times one request is sent again through a new producer after the broker rejected it
#: for a sequence desynchronization (see module docstring).
RESENDS = 3
#: Delivery errors after which the idempotent producer is replaced (nothing was appended).
_DESYNCED = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch)


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
        direct_reads: bool = True,
        direct_calls: bool | None = None,
    ) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) \
                or max_in_flight < 1:
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
        #: requests handed to a producer and not yet acknowledged: rid → (record,
        #: partition, resends so far, the producer); bounded by ``max_in_flight`` too
        self._unacked: dict[str, tuple[bytes, int, int, Any]] = {}
        #: the producer replacing a desynchronized one (one replacement at a time)
        self._renewing: asyncio.Task[None] | None = None
        #: producers replaced so far (after ``OutOfOrderSequenceNumber`` and the like)
        self.producer_renewals = 0
        #: resends and stops of replaced producers under way (held: the loop keeps weak refs)
        self._chores: set[asyncio.Task[None]] = set()
        #: direct calls under way (``sfaas.direct``)
        self._direct_tasks: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        self._started = False
        #: egress records on this client's partition that were not replies (logged, skipped)
        self.rejected = 0
        if direct_calls is None:
            direct_calls = self.settings.direct_calls
        path = DirectReads(self.settings, self.app_name) if direct_reads or direct_calls \
            else None
        #: reads sent straight to the owning worker when it can answer (``sfaas.reads``)
        self.direct: DirectReads | None = path if direct_reads else None
        #: transactions sent straight to the owning worker (``sfaas.direct``); None: Kafka
        self.calls: DirectCalls | None = DirectCalls(path) if direct_calls and path else None
        self._path = path
        self._kafka_up = False
        self._kafka_lock = asyncio.Lock()
        tracing.setup(self.settings, "client")  # (once per process; off: nothing)

    async def start(self) -> None:
        """Connect to the cluster (called by ``async with``): with direct calls, ask the
        coordinator where the partitions are, and connect to Kafka only when a request
        must go that way; else connect to Kafka and start listening for replies."""
        if self._started:
            return
        if self.calls is not None and self._path is not None:
            try:
                self.partitions = len((await self._path.where()).owners)
            except Unavailable as exc:
                log.info("direct calls unavailable (%s): using Kafka", exc)
            else:
                if self.partitions:
                    self._started = True
                    return
        await self._start_kafka()
        self._started = True

    async def _kafka(self) -> None:
        """Kafka is started (a request or a read going that way)."""
        if not self._kafka_up:
            async with self._kafka_lock:
                if not self._kafka_up:
                    await self._start_kafka()

    async def _start_kafka(self) -> None:
        s = self.settings
        # replicated topics (a cluster of brokers): a request the broker acknowledged must
        # survive its leader's loss, so wait for the in-sync replicas too
        self._producer = make_producer(s.kafka, s.linger_ms, durable=s.replication > 1)
        try:
            await self._producer.start()
            self.partitions = await partition_count(self._producer, self.ingress)
            egress_parts = await partition_count(self._producer, self.egress)
            self.reply_partition = crc32c(self.client_id.encode()) % egress_parts
            self._consumer = make_consumer(s.kafka, None, s.fetch_wait_ms)
            try:
                await self._consumer.start()
            except BaseException:
                await self._consumer.stop()
                raise
        except BaseException as exc:
            await self._producer.stop()
            if isinstance(exc, KafkaError):
                raise ClusterError(f"cannot reach Kafka at {s.kafka}: {exc}") from None
            raise
        tp = TopicPartition(self.egress, self.reply_partition)
        self._consumer.assign([tp])
        await self._consumer.seek_to_end(tp)
        await self._consumer.position(tp)  # pin the start before any request goes out
        self._reader = asyncio.create_task(self._read_replies())
        self._kafka_up = True

    async def close(self) -> None:
        """Stop listening; pending calls fail with ``RequestTimeout``-free cancellation."""
        if not self._started:
            return
        self._started = False
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
        self._room.set()  # a submit waiting for room fails now
        for task in list(self._direct_tasks):
            task.cancel()
        await asyncio.gather(*self._direct_tasks, return_exceptions=True)
        if self.calls is not None:
            self.calls.flush()  # (the acknowledgements held: the closing channels write them)
        if self._path is not None:
            await self._path.close()
        await asyncio.gather(*self._chores, return_exceptions=True)
        if not self._kafka_up:
            return
        self._kafka_up = False
        if self._renewing is not None:  # (its new producer is the one to stop)
            await asyncio.gather(self._renewing, return_exceptions=True)
        await self._producer.stop()
        await asyncio.gather(*self._chores, return_exceptions=True)
        await self._consumer.stop()

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read_replies(self) -> None:
        while True:
            data = await self._consumer.getmany(timeout_ms=1000, max_records=10000)
            for records in data.values():
                for rec in records:
                    if rec.value == FENCE:  # (a recovery's, in an aborted transaction)
                        continue
                    try:
                        reply = Reply.decode(rec.value)
                    except ProtocolError as exc:
                        self.rejected += 1
                        log.warning("ignoring malformed reply at offset %d: %s", rec.offset, exc)
                        continue
                    fut = self._waiting.pop(reply.rid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(reply)
            if len(self._waiting) < self.max_in_flight:
                self._room.set()

    def _validate(self, operator: str, key: str, function: str, args: tuple[Any, ...]) -> None:
        if self.app is not None:
            self.app.validate(operator, key, function, args)
            return
        if not isinstance(key, str) or not key:
            raise BadKey(f"key for operator {operator!r} must be a non-empty str, got {key!r:.80}")
        check_arguments(list(args), f"arguments of {operator}.{function}")

    async def submit(
        self, operator: str, key: str, function: str, *args: Any,
        idempotency_key: str | None = None,
    ) -> asyncio.Future[Reply]:
        """Send a request; the returned future resolves to its raw :class:`Reply`."""
        return (await self._submit(operator, key, function, args, idempotency_key))[1]

    async def _submit(self, operator: str, key: str, function: str, args: tuple[Any, ...],
                      idempotency_key: str | None = None) -> tuple[str, asyncio.Future[Reply]]:
        if not self._started:
            await self.start()
        self._validate(operator, key, function, args)
        check_idempotency_key(idempotency_key)
        while len(self._waiting) >= self.max_in_flight:
            self._room.clear()
            await self._room.wait()
            if not self._started:
                raise RuntimeError(f"client of app {self.app_name!r} closed while a request "
                                   "waited to be sent")
        return await self._send(operator, key, function, list(args),
                                partition_of(operator, key, self.partitions), idempotency_key)

    async def _send(self, operator: str, key: str, function: str, args: list[Any],
                    partition: int, idempotency_key: str | None = None, *, direct: bool = True,
                    ) -> tuple[str, asyncio.Future[Reply]]:
        """Send one request — straight to its worker (``sfaas.direct``) unless not
        ``direct`` or that cannot be, else to ingress ``partition`` — its id and reply
        future."""
        self._seq += 1
        rid = self.last_rid = f"{self.client_id}-{self._seq}"
        request = Request(rid, operator, key, function, args, 0, time.time(), idempotency_key,
                          tracing.traceparent() if tracing.ON else None)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if direct and self.calls is not None and not self.calls.off:
            record = request.encode()  # (raises before anything is registered)
            self._waiting[rid] = fut
            task = asyncio.get_running_loop().create_task(
                self._direct_call(request, record, partition, fut))
            self._direct_tasks.add(task)
            task.add_done_callback(self._direct_tasks.discard)
            return rid, fut
        await self._kafka()
        request.reply_partition = self.reply_partition
        record = request.encode()  # (raises before anything is registered)
        self._waiting[rid] = fut
        try:
            await self._hand_over(rid, record, partition, 0)
        except KafkaError as exc:  # e.g. a record larger than the producer takes
            self._forget(rid)
            raise ClusterError(f"request {rid} was not sent to {self.ingress}: {exc}") from None
        except BaseException:
            self._forget(rid)
            raise
        return rid, fut

    async def _direct_call(self, request: Request, record: bytes, partition: int,
                           fut: asyncio.Future[Reply]) -> None:
        """Run ``request`` on the direct path (``sfaas.direct``), or hand it to Kafka when
        no worker took it; its reply resolves ``fut``."""
        assert self.calls is not None
        rid = request.rid
        try:
            reply = await self.calls.call(rid, record, partition,
                                          time.monotonic() + self.timeout)
            if reply is None:  # (no worker took it: Kafka it is)
                await self._kafka()
                request.reply_partition = self.reply_partition
                await self._hand_over(rid, request.encode(), partition, 0)
                return
        except TimeoutError:
            return  # (the caller's wait times out, with its message)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(ClusterError(f"request {rid} failed on its way: {exc}"))
            self._forget(rid)
            return
        if not fut.done():
            fut.set_result(reply)
        self._forget(rid)

    async def _hand_over(self, rid: str, record: bytes, partition: int, resends: int) -> None:
        """Give the producer request ``rid``'s ``record``; its delivery ends in
        :meth:`_delivered`."""
        producer = self._producer
        delivery = await producer.send(self.ingress, record, partition=partition)
        self._unacked[rid] = (record, partition, resends, producer)
        delivery.add_done_callback(functools.partial(self._delivered, rid))

    async def _reply(self, rid: str, fut: asyncio.Future[Reply], what: str) -> Reply:
        """The reply of request ``rid`` (``what`` names it in the timeout's message)."""
        try:
            return await asyncio.wait_for(fut, self.timeout)
        except TimeoutError:
            self._forget(rid)
            raise RequestTimeout(
                f"no reply to {what} within {self.timeout} s "
                f"(is the cluster for app {self.app_name!r} running?)"
            ) from None

    def _delivered(self, rid: str, delivery: asyncio.Future[Any]) -> None:
        """The request's delivery ended; if Kafka did not take it, its call fails now
        (instead of waiting for a reply that cannot come)."""
        exc = None if delivery.cancelled() else delivery.exception()
        sent = self._unacked.pop(rid, None)
        if exc is None:
            return
        fut = self._waiting.get(rid)
        if (isinstance(exc, _DESYNCED) and sent is not None and sent[2] < RESENDS
                and fut is not None and not fut.done() and self._started):
            # (the callback runs on the loop: the resend is a task of its own)
            self._chore(self._resend(rid, *sent, exc))
            return
        if fut is not None and not fut.done():
            fut.set_exception(
                ClusterError(f"request {rid} was not delivered to {self.ingress}: {exc}"))
        self._forget(rid)

    async def _resend(self, rid: str, record: bytes, partition: int, resends: int,
                      broken: Any, exc: BaseException) -> None:
        """Send request ``rid`` again through a new producer (see the module docstring);
        ``broken``: the producer whose delivery failed (replaced once, whoever asks first)."""
        if broken is self._producer and (self._renewing is None or self._renewing.done()):
            self._renewing = asyncio.get_running_loop().create_task(self._renew(broken, exc))
        try:
            if self._renewing is not None:
                await asyncio.shield(self._renewing)
            await self._hand_over(rid, record, partition, resends + 1)
        except Exception as e:  # (a client closing, Kafka gone): the call fails as before
            fut = self._waiting.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(ClusterError(
                    f"request {rid} was not delivered to {self.ingress}: {exc}; sending it "
                    f"again failed: {e}"))
            self._forget(rid)

    async def _renew(self, broken: Any, exc: BaseException) -> None:
        """Replace the producer ``broken`` (its sequences desynchronized: ``exc``)."""
        if broken is not self._producer:
            return
        s = self.settings
        log.warning("Kafka rejected a request of this client (%s): sending it again through "
                    "a new producer", exc)
        fresh = make_producer(s.kafka, s.linger_ms, durable=s.replication > 1)
        await fresh.start()
        self._producer = fresh
        self.producer_renewals += 1
        # its batches still queued fail the same way and are sent again through ``fresh``
        self._chore(broken.stop())

    def _chore(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[None]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("replacing the producer: %s", task.exception())

    def _forget(self, rid: str) -> None:
        self._unacked.pop(rid, None)
        if self._waiting.pop(rid, None) is not None and len(self._waiting) < self.max_in_flight:
            self._room.set()

    async def _read(self, operator: str, key: str, function: str, args: list[Any],
                    partition: int) -> Any:
        """Send a read (``sfaas.runtime.txn.reads``) to ingress ``partition``; its value."""
        if not self._started:
            await self.start()
        if self.app is not None:
            self.app.get_operator(operator)
        rid, fut = await self._send(operator, key, function, args, partition, direct=False)
        reply = await self._reply(rid, fut, f"a read of {operator}")
        if not reply.ok:
            raise reply_error(reply.error_type or "BadRequest", reply.reason or "read failed")
        return reply.value

    async def get(self, operator: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``operator`` (``default`` if it has none), read
        without a transaction: the key's worker answers from its state as of an epoch
        boundary (``sfaas.runtime.txn.reads``)."""
        if not isinstance(key, str) or not key or key[0] == "\x00":
            raise BadKey(f"key for operator {operator!r} must be a non-empty str not starting "
                         f"with \\x00, got {key!r:.80}")
        from sfaas.runtime.txn.reads import GET

        if not self._started:
            await self.start()
        partition = partition_of(operator, key, self.partitions)
        answered, value = False, None
        if self.direct is not None:
            if self.app is not None:
                self.app.get_operator(operator)
            answered, value = await self.direct.read(operator, partition, key)
        if not answered:
            value = await self._read(operator, key, GET, [], partition)
        return default if value is None else value

    async def scan(self, operator: str, prefix: str = "", limit: int = 1000) -> list[
            tuple[str, Any]]:
        """``(key, value)`` of ``operator``'s keys starting with ``prefix``, in key order, at
        most ``limit`` (≤ 10,000), read without a transaction: each partition's worker
        answers from its state as of an epoch boundary (not one boundary for all)."""
        from sfaas.runtime.txn.reads import SCAN, check_scan

        check_scan(prefix, limit)
        if not self._started:
            await self.start()
        async def part(p: int) -> Any:
            if self.direct is not None:
                answered, value = await self.direct.read(operator, p, "", prefix, limit)
                if answered:
                    return value
            return await self._read(operator, "*", SCAN, [p, prefix, limit], p)

        parts = await asyncio.gather(*(part(p) for p in range(self.partitions)))
        merged = sorted((str(k), v) for part in parts for k, v in part)
        return merged[:limit]

    @overload
    async def call(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
                   **kwargs: P.kwargs) -> R: ...

    @overload  # (with an idempotency key: a handle's positional arguments only, see below)
    async def call(self, target: Callable[[Any, *Ts], Coroutine[Any, Any, R]], key: str, /,
                   *args: *Ts, idempotency_key: str | None) -> R: ...

    @overload
    async def call(self, target: str, key: str, function: str, /, *args: Any,
                   idempotency_key: str | None = None) -> Any: ...

    # (mypy 2.4 accepts no implementation signature for a *Ts overload, not even
    # (*Any, **Any), nor, beside a P.kwargs one, a typed idempotency_key: its [misc] error
    # here is wrong)
    async def call(self, target: Any, /, *rest: Any,  # type: ignore[misc]
                   idempotency_key: str | None = None, **kwargs: Any) -> Any:
        """Run one transaction and return its result; raises ``TransactionAborted(reason)``.

        Either form of :meth:`sfaas.Context.call`: ``call(deposit, "alice", 10)`` with the
        handle ``@accounts.function`` returned (mypy checks the arguments and the result),
        or ``call("accounts", "alice", "deposit", 10)``. A handle's keyword arguments go to
        its positional parameters; with an ``idempotency_key`` the typing takes positional
        ones only (``idempotency_key`` is the client's, never the function's).

        With ``idempotency_key``, a retry is safe: every request with the same operator,
        key, function and idempotency key within the retention window (setting
        ``idempotency_retention``, 24 h) gets the first one's outcome — its result or its
        abort — and only the first runs, also across a recovery, a rescale or a failover.
        """
        operator, key, function, args = self._target(target, rest, kwargs)
        if tracing.ON:  # (a client span: the request record carries its context)
            with tracing.span(f"call {operator}.{function}", "client",
                              attributes={"sfaas.operator": operator,
                                          "sfaas.function": function}) as span:
                rid, reply = await self._call(operator, key, function, args, idempotency_key)
                span.set_attribute("sfaas.request_id", rid)
                span.set_attribute("sfaas.outcome", "committed" if reply.ok else "aborted")
        else:
            _, reply = await self._call(operator, key, function, args, idempotency_key)
        if reply.ok:
            return reply.value
        exc = reply_error(reply.error_type or "TransactionAborted", reply.reason or "aborted")
        if reply.traceback:
            exc.traceback = reply.traceback
            exc.add_note(f"raised in the transaction's function:\n{reply.traceback.rstrip()}")
        raise exc

    async def _call(self, operator: str, key: str, function: str, args: tuple[Any, ...],
                    idempotency_key: str | None) -> tuple[str, Reply]:
        rid, fut = await self._submit(operator, key, function, args, idempotency_key)
        return rid, await self._reply(rid, fut, f"{operator}/{key}.{function}")

    def _target(self, target: Any, rest: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[str, str, str, tuple[Any, ...]]:
        """:func:`sfaas.app.call_target`, refusing the handle of another app's function."""
        if self.app is not None:
            return self.app.call_target(target, *rest, **kwargs)
        if isinstance(target, FunctionRef):
            target.check_app(self.app_name)
        return call_target(target, *rest, **kwargs)


def check_idempotency_key(key: object) -> None:
    """Raise :class:`~sfaas.errors.BadRequest` unless ``key`` is None or a str of 1 to
    256 characters."""
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_RID):
        raise BadRequest(f"an idempotency key must be a str of 1 to {MAX_RID} characters, "
                         f"got {key!r:.80}")


class SyncClient:
    """A blocking :class:`Client`: runs one on a private event loop in a background thread."""

    def __init__(self, app: str | App, bootstrap: str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sfaas-client", daemon=True)
        self._thread.start()
        self._client = Client(app, bootstrap, **kwargs)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @overload
    def call(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
             **kwargs: P.kwargs) -> R: ...

    @overload
    def call(self, target: Callable[[Any, *Ts], Coroutine[Any, Any, R]], key: str, /,
             *args: *Ts, idempotency_key: str | None) -> R: ...

    @overload
    def call(self, target: str, key: str, function: str, /, *args: Any,
             idempotency_key: str | None = None) -> Any: ...

    # (the [misc] error mypy reports here is wrong: see Client.call's implementation)
    def call(self, target: Any, /, *rest: Any,  # type: ignore[misc]
             idempotency_key: str | None = None, **kwargs: Any) -> Any:
        """Like :meth:`Client.call` (either form), blocking."""
        return self._run(self._client.call(target, *rest, idempotency_key=idempotency_key,
                                           **kwargs))

    def get(self, operator: str, key: str, default: Any = None) -> Any:
        """Like :meth:`Client.get`, blocking."""
        return self._run(self._client.get(operator, key, default))

    def scan(self, operator: str, prefix: str = "", limit: int = 1000) -> list[tuple[str, Any]]:
        """Like :meth:`Client.scan`, blocking."""
        return self._run(self._client.scan(operator, prefix, limit))  # type: ignore[no-any-return]

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
