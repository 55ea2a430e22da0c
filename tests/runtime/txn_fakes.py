"""A transactional Kafka producer of our own, for the egress' unit tests (``worker.egress``):
it keeps each transaction's records and whether it committed, as a ``read_committed``
reader of the topic would see them, and can be stuck, failing, or held before its commit."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

#: (topic, value, partition, headers)
Record = tuple[str, bytes, int, Any]


class TxnProducer:
    """``offsets``: the next offset per (topic, partition), shared by the producers of one
    test as Kafka's log is. ``send_error``: every delivery fails with it (a stuck producer);
    ``commit_error``: every commit fails with it; ``hold``: commits wait for it;
    ``manual``: deliveries wait for :meth:`deliver`."""

    def __init__(self, offsets: dict[tuple[str, int], int] | None = None, *,
                 send_error: BaseException | None = None,
                 commit_error: BaseException | None = None,
                 hold: asyncio.Event | None = None, manual: bool = False) -> None:
        self.offsets = {} if offsets is None else offsets
        self.send_error = send_error
        self.commit_error = commit_error
        self.hold = hold
        #: every record handed over, in order, and the records of each committed transaction
        self.sent: list[Record] = []
        self.committed: list[list[Record]] = []
        self._open: list[Record] | None = None
        self.started = self.stopped = False
        #: deliveries handed out and not yet resolved (``pending()`` resolves them)
        self.waiting: list[tuple[asyncio.Future[Any], str, int]] = []
        self.manual = manual
        #: topics whose partitions were asked for (aiokafka fetches their metadata then)
        self.asked: list[str] = []

    async def partitions_for(self, topic: str) -> set[int]:
        self.asked.append(topic)
        return {p for t, p in self.offsets if t == topic} or {0}

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def begin_transaction(self) -> None:
        assert self._open is None, "a transaction began inside another"
        self._open = []

    async def send(self, topic: str, value: bytes, partition: int,
                   headers: Any = None) -> asyncio.Future[Any]:
        assert self._open is not None, "a send outside a transaction"
        self.sent.append((topic, value, partition, headers))
        self._open.append((topic, value, partition, headers))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.send_error is not None:
            fut.set_exception(self.send_error)
        elif self.manual:
            self.waiting.append((fut, topic, partition))
        else:
            fut.set_result(self._next(topic, partition))
        return fut

    def deliver(self) -> None:
        """Resolve the deliveries a ``manual`` producer holds."""
        for fut, topic, partition in self.waiting:
            fut.set_result(self._next(topic, partition))
        self.waiting.clear()

    def _next(self, topic: str, partition: int) -> SimpleNamespace:
        at = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = at + 1
        return SimpleNamespace(topic=topic, partition=partition, offset=at)

    async def commit_transaction(self) -> None:
        assert self._open is not None, "a commit outside a transaction"
        if self.hold is not None:
            await self.hold.wait()
        if self.commit_error is not None:
            raise self.commit_error
        self.committed.append(self._open)
        self._open = None

    async def abort_transaction(self) -> None:
        assert self._open is not None, "an abort outside a transaction"
        self._open = None

    def values(self) -> list[bytes]:
        """The values of every committed record, in order."""
        return [v for txn in self.committed for _, v, _, _ in txn]


class Factory:
    """Makes the egress' new producers (``Egress.new_producer``): each a :class:`TxnProducer`
    with ``kw``, all sharing one log's offsets; ``made`` lists them with their ids."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw
        self.offsets: dict[tuple[str, int], int] = {}
        self.made: list[TxnProducer] = []
        self.ids: list[str] = []

    def __call__(self, tid: str) -> TxnProducer:
        self.made.append(TxnProducer(self.offsets, **self.kw))
        self.ids.append(tid)
        return self.made[-1]
