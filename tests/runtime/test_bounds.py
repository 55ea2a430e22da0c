"""Every queue that grows with load or with a peer has a limit, and at the limit the
producer waits — nothing is dropped, nothing grows (docs/LIMITS.md lists them all)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sfaas import client as client_module
from sfaas.client import RESENDS, Client
from sfaas.errors import ClusterError, RequestTimeout
from sfaas.runtime import channels, wire
from tests.fuzz.harness import FakeChannel, bare_coordinator, bare_worker, message_of, settings
from worker import ingress as ingress_module
from worker.calls import DEFERRED_BATCHES
from worker.ingress import IN_FLIGHT_BATCHES, IngressRewound

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


# -- a worker's in-flight limit -------------------------------------------------------------


class _Backlog:
    """A Kafka consumer with an endless backlog on ingress partition 0."""

    def __init__(self) -> None:
        self.next = 0
        self.fetches = 0

    def assign(self, tps: Any) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.next = offset

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[TopicPartition, list[Any]]:
        self.fetches += 1
        await asyncio.sleep(0)
        recs = []
        for _ in range(max_records):
            req = wire.Request(f"r{self.next}", "acc", f"k{self.next}", "deposit", [1], 0, 0.0)
            recs.append(SimpleNamespace(offset=self.next, value=req.encode()))
            self.next += 1
        return {TopicPartition("fuzz.in", 0): recs}


async def test_ingest_stops_at_the_in_flight_limit_and_wakes_on_completions(tmp_path: Path) -> None:
    """Load beyond what the epochs commit stays in Kafka: the worker takes at most its
    limit, does not poll Kafka while there, and takes more once a batch's worth completed."""
    w = bare_worker(str(tmp_path), max_batch=10)
    limit = IN_FLIGHT_BATCHES * 10
    w.kafka.consumer = kafka = _Backlog()
    task = asyncio.create_task(w.ingress.run())
    try:
        await _until(lambda: w.state.offsets.in_flight >= limit)
        await asyncio.sleep(0.3)
        assert w.state.offsets.in_flight == limit and len(w.state.loop.queue) == limit  # type: ignore[union-attr]
        fetches = kafka.fetches
        assert fetches == limit // 10 and w.ingress.stalls == 1  # no fetch (no poll) while at the limit
        for off in range(5):  # half a batch completes: still no room for a batch
            w.ingress.complete(0, off)
        await asyncio.sleep(0.1)
        assert kafka.fetches == fetches
        for off in range(5, 10):
            w.ingress.complete(0, off)
        await _until(lambda: kafka.fetches > fetches)
        await _until(lambda: w.state.offsets.in_flight == limit)
        assert kafka.next == limit + 10  # exactly the room made, nothing more
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        w.state.engine.close()  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def _ingesting(tmp_path: Path) -> AsyncIterator[tuple[Any, _Backlog, list[BaseException]]]:
    """A bare worker ingesting from an endless backlog; its ingest failures collected."""
    w = bare_worker(str(tmp_path), max_batch=10)
    w.kafka.consumer = kafka = _Backlog()
    failed: list[BaseException] = []
    w.ingress._on_failure = failed.append
    w.ingress.start()
    try:
        await _until(lambda: kafka.next >= IN_FLIGHT_BATCHES * 10)  # (at the in-flight limit)
        yield w, kafka, failed
    finally:
        await w.ingress.pause()
        w.state.engine.close()  # type: ignore[union-attr]


def _rewind(w: Any, kafka: _Backlog) -> None:
    """The consumer's reset to offset 0, and room for the fetch that brings it."""
    kafka.next = 0
    for off in range(20):
        w.ingress.complete(0, off)


async def test_ingest_puts_a_consumer_that_went_back_where_it_was(tmp_path: Path) -> None:
    """A consumer position Kafka calls out of range is reset to the earliest offset (a
    stale leader: aiokafka has no leader epochs): the worker must not execute everything
    since then again (the nemesis saw a counter at twice its value); ingest seeks back to
    where it was and reads on from there."""
    async with _ingesting(tmp_path) as (w, kafka, failed):
        _rewind(w, kafka)
        await _until(lambda: w.ingress.rewinds >= 1)
        await _until(lambda: len(w.state.loop.queue) >= IN_FLIGHT_BATCHES * 10 + 10)
        offsets = [i.offset for i in w.state.loop.queue]
        assert offsets == list(range(len(offsets)))  # each once, in order: nothing again
        assert not failed


async def test_a_consumer_that_keeps_going_back_fails_ingest(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingress_module, "REWOUND_FOR", 0.0)
    monkeypatch.setattr(_Backlog, "seek", lambda self, tp, offset: None)  # (it stays rewound)
    async with _ingesting(tmp_path) as (w, kafka, failed):
        _rewind(w, kafka)
        await _until(lambda: bool(failed))
        assert isinstance(failed[0], IngressRewound)
        assert re.search(r"went back to offset \d+ from 200 again and again", str(failed[0]))


async def test_a_seek_back_is_not_a_rewind(tmp_path: Path) -> None:
    """A recovery seeks ingest back to its round on purpose: that is read, not refused."""
    async with _ingesting(tmp_path) as (w, kafka, failed):
        await w.ingress.pause()
        w.state.restart({})  # (a recovery: new trackers, a new epoch loop)
        w.ingress.restart_at({p: 0 for p in w.state.mine()})  # the round's positions
        kafka.next = 0
        await _until(lambda: len(w.state.loop.queue) >= 20)
        assert not failed


# -- calls deferred to an epoch not begun -------------------------------------------------------


async def test_calls_for_an_epoch_not_begun_stop_the_peer_channel_at_the_limit(tmp_path: Path) -> None:
    """A peer ahead by an epoch may send calls before this worker's Begin: the worker holds
    at most its limit of them and stops reading that peer until the Begin takes them."""
    w = bare_worker(str(tmp_path), max_batch=2)
    limit = DEFERRED_BATCHES * 2
    cid = iter(range(1, 10_000))

    def frame(n: int) -> bytes:
        calls = [wire.Call(1, 1, next(cid), 7, 0.0, "acc", "k0", "deposit", [1], 0, 0) for _ in range(n)]
        return wire.encode_frame(calls)

    frames = [wire.encode_frame([wire.Hello(1)])] + [frame(5) for _ in range(10)]
    chan = FakeChannel(frames, peer="worker-1")
    task = asyncio.create_task(w.calls.serve(chan))  # type: ignore[arg-type]
    try:
        await _until(lambda: w.calls.deferred_n >= limit)
        await asyncio.sleep(0.2)
        assert w.calls.deferred_n == 35 and len(chan.frames) == 3  # stopped reading at 32 (a frame's 5 at a time)
        taken = w.calls.take_deferred(1)  # what the Begin of epoch 1 does
        assert len(taken) == 35
        await _until(lambda: not chan.frames)
        assert w.calls.deferred_n == 15
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        w.state.engine.close()  # type: ignore[union-attr]


# -- peer channels ------------------------------------------------------------------------------


@hsettings(max_examples=200, deadline=None)
@given(msgs=st.lists(message_of(sorted(set(wire._TAGS.values()), key=lambda c: c.TAG)), max_size=20))
def test_messages_packed_as_queued_make_the_same_frame(msgs: list[wire.Message]) -> None:
    """A channel packs each message when it is sent (to count its bytes): the frame is the
    one packing them all at once gives."""
    assert wire.join_frame([wire.encode_message(m) for m in msgs]) == wire.encode_frame(msgs)


async def test_a_channel_writer_waits_while_the_peer_does_not_read() -> None:
    """Above HIGH_WATER unsent bytes ``wait_room`` blocks until the peer reads; what waits
    in our process stays near the mark instead of growing with what the writer wants to send."""
    reading = asyncio.Event()
    got: list[int] = []

    async def handler(chan: channels.Channel) -> None:
        await reading.wait()
        while True:
            got.extend(len(m.value) for m in await chan.recv())  # type: ignore[attr-defined]

    secret = "bounds-test-secret"
    server = await channels.serve("127.0.0.1", 0, secret, handler)
    port = server.sockets[0].getsockname()[1]
    client = await channels.connect("127.0.0.1", port, secret)
    body = "x" * (64 << 10)
    sent = 0
    peak = 0

    async def writer() -> None:
        nonlocal sent, peak
        for i in range(2000):  # 128 MiB in all
            client.send(wire.Result(i, True, body))
            await client.wait_room()
            sent += 1
            peak = max(peak, client.buffered())

    task = asyncio.create_task(writer())
    try:
        await asyncio.sleep(1.0)
        assert not task.done() and client.waits >= 1, "the writer went on although nobody read"
        assert peak <= channels.HIGH_WATER + (128 << 10)
        assert sent < 500  # what the OS's socket buffers take, plus the high-water mark
        reading.set()
        await asyncio.wait_for(task, 60)
        await _until(lambda: len(got) == 2000, 30)
        assert set(got) == {len(body)}
    finally:
        task.cancel()
        client.close()
        server.close()
        await server.wait_closed()


# -- the coordinator's inbox --------------------------------------------------------------------


async def test_a_loss_interrupts_the_barrier_even_with_a_full_inbox(tmp_path: Path) -> None:
    from coordinator.inbox import INBOX_LIMIT, Lost

    c = bare_coordinator(str(tmp_path))
    for i in range(INBOX_LIMIT):
        c.inbox.put_nowait(wire.Wakeup(i))
    put = asyncio.create_task(c.inbox.put(wire.Wakeup(-1)))  # a worker's reader: it waits
    await asyncio.sleep(0.05)
    assert not put.done() and c.inbox.qsize() == INBOX_LIMIT
    c.force_recovery("test")
    items = [c.inbox.get_nowait() for _ in range(c.inbox.qsize())]
    assert isinstance(items[-1], Lost) and len(items) == INBOX_LIMIT and c.inbox.interrupted
    await asyncio.wait_for(put, 5)  # room again: the waiting reader goes on


# -- clients ------------------------------------------------------------------------------------


class _Producer:
    """A client's producer: keeps what it is given; ``fail`` makes the deliveries fail."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.fail: Exception | None = None
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes, partition: int) -> asyncio.Future[None]:
        self.sent.append(value)
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail is not None:
            delivery.set_exception(self.fail)
        else:
            delivery.set_result(None)
        return delivery


class _Replies:
    """A client's reply consumer: hands out what the test puts in."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[str, list[Any]]:
        value = await self.queue.get()
        return {"tp": [SimpleNamespace(offset=0, value=value)]}


def _client(max_in_flight: int, timeout: float = 60.0) -> Client:
    c = Client("bounds", settings=settings("/nonexistent"), max_in_flight=max_in_flight, timeout=timeout,
               direct_calls=False)
    c._producer, c._consumer = _Producer(), _Replies()
    c.partitions, c.reply_partition, c._started, c._kafka_up = 4, 0, True, True
    return c


async def test_a_client_waits_for_replies_beyond_its_in_flight_limit() -> None:
    c = _client(3)
    reader = asyncio.create_task(c._read_replies())
    try:
        futs = [await c.submit("acc", f"k{i}", "deposit", 1) for i in range(3)]
        fourth = asyncio.create_task(c.submit("acc", "k3", "deposit", 1))
        await asyncio.sleep(0.1)
        assert not fourth.done() and len(c._producer.sent) == 3
        first = wire.Request.decode(c._producer.sent[0])
        c._consumer.queue.put_nowait(wire.Reply(first.rid, True, 1).encode())
        await asyncio.wait_for(fourth, 5)
        assert futs[0].done() and len(c._producer.sent) == 4
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_a_timed_out_call_stops_waiting_for_its_reply() -> None:
    c = _client(1, timeout=0.05)
    with pytest.raises(RequestTimeout, match="no reply to acc/k1.deposit"):
        await c.call("acc", "k1", "deposit", 1)
    assert c._waiting == {}
    with pytest.raises(RequestTimeout):  # its slot is free: the next call is sent, not stuck
        await c.call("acc", "k2", "deposit", 1)
    assert len(c._producer.sent) == 2


async def test_a_request_kafka_did_not_take_fails_its_call_at_once() -> None:
    c = _client(1)
    c._producer.fail = KafkaTimeoutError("the broker did not answer")
    with pytest.raises(ClusterError, match=r"request \S+-1 was not delivered to .*the broker did not answer"):
        await asyncio.wait_for(c.call("acc", "k1", "deposit", 1), 5)  # not the call's 60 s timeout
    assert c._waiting == {}
    c._producer.fail = None
    nxt = await c.submit("acc", "k2", "deposit", 1)  # its slot is free
    assert not nxt.done() and len(c._producer.sent) == 2


async def test_a_request_rejected_for_its_sequence_goes_again_through_a_new_producer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka's idempotent producer never recovers from OutOfOrderSequenceNumber (seen in
    the nemesis after a broker restart): the broker appended nothing, so the client replaces
    the producer and sends the same request again, once for all the requests it failed."""
    fresh: list[_Producer] = []

    def new_producer(*_: object, **__: object) -> _Producer:
        fresh.append(_Producer())
        return fresh[-1]

    monkeypatch.setattr(client_module, "make_producer", new_producer)
    c = _client(10)
    broken = c._producer
    broken.fail = OutOfOrderSequenceNumber()
    futs = [await c.submit("acc", f"k{i}", "deposit", 1) for i in range(3)]
    for _ in range(500):  # (until the new producer's deliveries are acknowledged: their
        if fresh and len(fresh[0].sent) == 3 and not c._unacked:  # callbacks run a turn later)
            break
        await asyncio.sleep(0.01)
    assert len(fresh) == 1 and fresh[0].started and c._producer is fresh[0]
    assert fresh[0].sent == broken.sent  # the same requests (ids), once each
    assert not any(f.done() for f in futs)  # still waiting for their replies
    assert c.producer_renewals == 1 and c._unacked == {}
    await asyncio.sleep(0.05)
    assert broken.stopped


async def test_a_request_rejected_again_and_again_fails_its_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def always_desynced(*_: object, **__: object) -> _Producer:
        p = _Producer()
        p.fail = OutOfOrderSequenceNumber()
        return p

    monkeypatch.setattr(client_module, "make_producer", always_desynced)
    c = _client(1)
    c._producer = always_desynced()
    with pytest.raises(ClusterError, match=r"not delivered to .*OutOfOrderSequenceNumber"):
        await asyncio.wait_for(c.call("acc", "k1", "deposit", 1), 5)
    assert c.producer_renewals == RESENDS and c._waiting == {}


async def test_a_client_whose_kafka_cannot_be_reached_fails_naming_it(tmp_path: Path) -> None:
    s = settings(str(tmp_path), kafka="127.0.0.1:1")
    with pytest.raises(ClusterError, match=r"cannot reach Kafka at 127\.0\.0\.1:1: .*Unable to bootstrap"):
        await Client("bounds", settings=s).start()


def test_a_bad_in_flight_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_in_flight must be an int >= 1, got 0"):
        Client("bounds", settings=settings("/nonexistent"), max_in_flight=0)


async def test_a_loss_while_the_recovery_waits_for_members_is_dealt_with_there(
        tmp_path: Path) -> None:
    """Found by the simulator (seeds 438, 503, 577): a worker lost while the recovery waited
    for the lost slot's new process left the inbox's loss flag set once both were back,
    and the first live epoch started a second recovery nobody needed. Once every slot is
    ready again, the losses so far are dealt with; a loss after that still interrupts."""
    c = bare_coordinator(str(tmp_path))
    m0, m1 = c.state.members
    waiting = asyncio.create_task(c.recovery.members_ready(1))
    await asyncio.sleep(0.05)
    c.membership.lose(m0, "test: its channel closed")  # (slot 1 is still being restarted)
    assert c.inbox.interrupted and not waiting.done()
    for m in (m0, m1):
        m.alive = True
        c.state.mark_ready(m)
    await asyncio.wait_for(waiting, 5)
    assert not c.inbox.interrupted and c.inbox.empty()
    c.membership.lose(m0, "test: lost again")
    assert c.inbox.interrupted
