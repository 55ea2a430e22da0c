"""What a user function sees: :class:`Context`, bound to one key and one transaction."""

from __future__ import annotations

import inspect
import random as _random
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from crc32c import crc32c

__all__ = ["Context", "Transactions"]


class Transactions(Protocol):
    """What a :class:`Context` asks of whoever runs its transaction (the runtime's engine):
    the transaction's reads and writes of one key, and its calls of other functions."""

    def read(self, tid: int, operator: str, key: str, default: Any) -> Any: ...

    def write(self, tid: int, operator: str, key: str, value: Any) -> None: ...

    def remove(self, tid: int, operator: str, key: str) -> None: ...

    async def call(
        self, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int = 0,
    ) -> Any: ...


class Context:
    """The handle a function gets as its first argument.

    ``ctx.key`` is the key this call runs on; ``get``/``put``/``delete`` act on that key's
    value in this operator, inside the transaction (writes become visible to others only
    if the whole transaction commits). ``call``/``send`` invoke other functions in the same
    transaction. ``random``/``now`` are deterministic per transaction, so a re-run of a
    conflicting transaction sees the same values.
    """

    __slots__ = ("_engine", "_tid", "_now", "operator", "key", "_pending", "_rng", "_depth",
                 "_calls")

    def __init__(
        self, engine: Transactions, tid: int, now: float, operator: str, key: str, depth: int
    ) -> None:
        self._engine = engine
        self._tid = tid
        self._now = now
        self._depth = depth
        #: The operator this call runs in.
        self.operator = operator
        #: The key this call runs on.
        self.key = key
        self._pending: list[Any] | None = None
        self._rng: _random.Random | None = None
        #: every ``call`` made, to find one never awaited (see :meth:`unawaited_call`)
        self._calls: list[tuple[Coroutine[Any, Any, Any], str, str, str]] | None = None

    @property
    def tid(self) -> int:
        """This transaction's id (its position in the serial order)."""
        return self._tid

    def get(self, default: Any = None) -> Any:
        """This key's value as of the transaction (``default`` when it has none)."""
        return self._engine.read(self._tid, self.operator, self.key, default)

    def put(self, value: Any) -> None:
        """Set this key's value (must be msgpack-able: raises NotSerializable otherwise)."""
        self._engine.write(self._tid, self.operator, self.key, value)

    def delete(self) -> None:
        """Remove this key's value."""
        self._engine.remove(self._tid, self.operator, self.key)

    def call(
        self, operator: str, key: str, function: str, *args: Any
    ) -> Coroutine[Any, Any, Any]:
        """Run ``operator.function`` on ``key`` in this transaction; ``await`` it for the
        result.

        A failure of the callee raises here (``Abort`` for a user abort, a
        ``TransactionAborted`` subclass otherwise) and aborts the whole transaction even
        if caught. A call never awaited never runs: the transaction aborts with
        :class:`~sfaas.NotAwaited` rather than commit without it.
        """
        coro = self._engine.call(
            self._tid, self._now, operator, key, function, args, self._depth + 1
        )
        if self._calls is None:
            self._calls = []
        self._calls.append((coro, operator, key, function))
        return coro

    def unawaited_call(self) -> str | None:
        """The first ``ctx.call(...)`` made and never started, as written (``None`` if
        none); closes every such call, so Python does not also warn about it."""
        first = None
        for coro, operator, key, function in self._calls or ():
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
                if first is None:
                    first = f"ctx.call({operator!r}, {key!r}, {function!r}, ...)"
        return first

    def send(self, operator: str, key: str, function: str, *args: Any) -> None:
        """Run ``operator.function`` on ``key`` in this transaction without waiting for it.

        It completes before the calling function's result is returned, and commits or
        aborts with the transaction. A function's sends run one after another, in the order
        they were made (overlapping what the function does meanwhile): two sends writing the
        same key must leave the same value when the transaction is replayed after a recovery.
        """
        import asyncio

        engine, args_, depth = self._engine, args, self._depth + 1
        previous = self._pending[-1] if self._pending else None

        async def in_order() -> Any:
            if previous is not None:
                await asyncio.wait([previous])  # its failure is reported by its own task
            return await engine.call(self._tid, self._now, operator, key, function, args_, depth)

        task = asyncio.ensure_future(in_order())
        if self._pending is None:
            self._pending = []
        self._pending.append(task)

    def random(self) -> float:
        """A float in [0, 1), deterministic per (transaction, operator, key, draw)."""
        if self._rng is None:
            seed = crc32c(f"{self.operator}\x00{self.key}".encode()) ^ (self._tid << 32)
            self._rng = _random.Random(seed)
        return self._rng.random()

    def now(self) -> float:
        """The transaction's timestamp (seconds since the epoch), fixed when it was first
        sequenced."""
        return self._now

    def __repr__(self) -> str:
        return f"Context(operator={self.operator!r}, key={self.key!r}, tid={self._tid})"
