"""What a user function sees: :class:`Context`, bound to one key and one transaction."""

from __future__ import annotations

import contextvars
import inspect
import random as _random
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

from crc32c import crc32c

from sfaas.app import FunctionRef

if TYPE_CHECKING:
    from sfaas.app import App

__all__ = ["Context", "Transactions", "effect_key", "EFFECT_KEY"]

P = ParamSpec("P")
R = TypeVar("R")

#: The key of the effect or post-commit action running now (see :func:`effect_key`).
EFFECT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("sfaas_effect_key",
                                                                        default=None)


def effect_key() -> str:
    """Inside a ``ctx.run`` effect or a ``ctx.after_commit`` action: its idempotency key,
    the same on every try (pass it to the external system so it can drop a repeat).
    Raises ``RuntimeError`` anywhere else."""
    key = EFFECT_KEY.get()
    if key is None:
        raise RuntimeError("sfaas.effect_key() is only known inside a ctx.run effect or a "
                           "ctx.after_commit action")
    return key


class Transactions(Protocol):
    """What a :class:`Context` asks of whoever runs its transaction (the runtime's engine):
    the transaction's reads and writes of one key, and its calls of other functions."""

    @property
    def app(self) -> App:
        """The app whose functions the calls reach."""
        ...

    def read(self, tid: int, operator: str, key: str, default: Any,
             now: float | None = None) -> Any: ...

    def write(self, tid: int, operator: str, key: str, value: Any,
              now: float | None = None) -> None: ...

    def remove(self, tid: int, operator: str, key: str) -> None: ...

    async def call(
        self, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int = 0,
    ) -> Any: ...

    def next_seq(self, tid: int, operator: str, key: str) -> int:
        """The number of the transaction's next effect, action or timer on this key."""
        ...

    async def run_effect(self, tid: int, operator: str, key: str, n: int,
                         fn: Callable[..., Any], args: Sequence[Any]) -> Any: ...

    def after_commit(self, tid: int, operator: str, key: str, n: int,
                     fn: Callable[..., Any], args: Sequence[Any]) -> None: ...

    def set_timer(self, tid: int, now: float, operator: str, key: str, n: int, delay: float,
                  target: tuple[str, str, str], args: Sequence[Any]) -> str: ...

    def cancel_timer(self, tid: int, now: float, operator: str, key: str, timer_id: str,
                     depth: int) -> Coroutine[Any, Any, Any] | None: ...


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
        self, engine: Transactions, tid: int, now: float, operator: str, key: str, depth: int,
        sends: list[Any],
    ) -> None:
        self._engine = engine
        self._tid = tid
        self._now = now
        self._depth = depth
        #: The operator this call runs in.
        self.operator = operator
        #: The key this call runs on.
        self.key = key
        #: the ``send`` tasks, in order (the engine's list: it awaits them after the call)
        self._pending = sends
        self._rng: _random.Random | None = None
        #: every ``call``/``run`` made, as written, to find one never awaited (see
        #: :meth:`unawaited_call`)
        self._calls: list[tuple[Coroutine[Any, Any, Any], str]] | None = None

    @property
    def tid(self) -> int:
        """This transaction's id (its position in the serial order)."""
        return self._tid

    def get(self, default: Any = None) -> Any:
        """This key's value as of the transaction (``default`` when it has none, or when it
        expired by :meth:`now` under the operator's ``ttl``), brought to the code's schema
        version by the operator's upcasters. A value stored by newer code (a higher schema
        version) raises :class:`~sfaas.errors.SchemaTooNew` and aborts the transaction."""
        return self._engine.read(self._tid, self.operator, self.key, default, self._now)

    def put(self, value: Any) -> None:
        """Set this key's value (must be msgpack-able: raises NotSerializable otherwise);
        under the operator's ``ttl`` it expires ``ttl`` seconds after :meth:`now`."""
        self._engine.write(self._tid, self.operator, self.key, value, self._now)

    def delete(self) -> None:
        """Remove this key's value."""
        self._engine.remove(self._tid, self.operator, self.key)

    @overload
    def call(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
             **kwargs: P.kwargs) -> Coroutine[Any, Any, R]: ...

    @overload
    def call(self, target: str, key: str, function: str, /,
             *args: Any) -> Coroutine[Any, Any, Any]: ...

    def call(self, target: FunctionRef[..., Any] | str, /, *rest: Any,
             **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Run a function on a key in this transaction; ``await`` it for the result.

        Two forms: ``ctx.call(deposit, key, *args)`` with the handle ``@accounts.function``
        returned (mypy checks the arguments and the result against ``deposit``; keyword
        arguments are put at their parameters' positions), or by name,
        ``ctx.call("accounts", key, "deposit", *args)``.

        A failure of the callee raises here (``Abort`` for a user abort, a
        ``TransactionAborted`` subclass otherwise) and aborts the whole transaction even
        if caught. A call never awaited never runs: the transaction aborts with
        :class:`~sfaas.NotAwaited` rather than commit without it.
        """
        operator, key, function, args = self._engine.app.call_target(target, *rest, **kwargs)
        coro = self._engine.call(
            self._tid, self._now, operator, key, function, args, self._depth + 1
        )
        return self._track(coro, _written("ctx.call", target, key, function))

    def _track(self, coro: Coroutine[Any, Any, Any], written: str) -> Coroutine[Any, Any, Any]:
        if self._calls is None:
            self._calls = []
        self._calls.append((coro, written))
        return coro

    def unawaited_call(self) -> str | None:
        """The first ``ctx.call(...)``/``ctx.run(...)`` made and never started, as written
        (``None`` if none); closes every such call, so Python does not also warn about it."""
        first = None
        for coro, written in self._calls or ():
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
                if first is None:
                    first = written
        return first

    # -- the outside world ----------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any) -> Coroutine[Any, Any, Any]:
        """Run the side effect ``fn(*args)`` (sync or async, any Python) once for this
        request; ``await`` it for its result, which must be msgpack-able.

        The outcome — the result, or the exception, raised again here — is journaled: every
        later run of the transaction (a re-run after a conflict, the fallback phase, a
        replay after a crash) gets it without calling ``fn`` again. The first run to reach
        it leaves the epoch while ``fn`` runs, so nobody waits for it; the transaction then
        runs again from its start with the outcome. Inside ``fn``,
        :func:`sfaas.effect_key` is the effect's idempotency key.
        """
        if not callable(fn):
            raise TypeError(f"ctx.run needs a callable, got {fn!r:.80}")
        n = self._engine.next_seq(self._tid, self.operator, self.key)
        coro = self._engine.run_effect(self._tid, self.operator, self.key, n, fn, args)
        return self._track(coro, f"ctx.run({getattr(fn, '__qualname__', fn)!s}, ...)")

    def after_commit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after this transaction commits — only then, once (retried with
        backoff until it returns, with the same :func:`sfaas.effect_key`), never for an
        aborted or re-run attempt. ``fn`` must be a module-level function (it is stored by
        name with its msgpack-able ``args`` and may run after a restart)."""
        n = self._engine.next_seq(self._tid, self.operator, self.key)
        self._engine.after_commit(self._tid, self.operator, self.key, n, fn, args)

    @overload
    def send_after(self, delay_s: float, target: FunctionRef[P, R], key: str, /,
                   *args: P.args, **kwargs: P.kwargs) -> str: ...

    @overload
    def send_after(self, delay_s: float, target: str, key: str, function: str, /,
                   *args: Any) -> str: ...

    def send_after(self, delay_s: float, target: FunctionRef[..., Any] | str, /, *rest: Any,
                   **kwargs: Any) -> str:
        """Call a function on a key (either form of :meth:`call`: ``deposit, key, *args`` or
        ``"accounts", key, "deposit", *args``) as its own transaction ``delay_s`` seconds
        from ``ctx.now()``: exactly once, in the first epoch whose ``now`` is at or past
        that time, never before — if this transaction commits. Returns the timer's id
        (for :meth:`cancel_timer`)."""
        operator, key, function, args = self._engine.app.call_target(target, *rest, **kwargs)
        n = self._engine.next_seq(self._tid, self.operator, self.key)
        return self._engine.set_timer(self._tid, self._now, self.operator, self.key, n,
                                      delay_s, (operator, key, function), args)

    def cancel_timer(self, timer_id: str) -> None:
        """Cancel the timer ``timer_id`` (from :meth:`send_after`), in this transaction: if
        it commits, the timer never fires. Cancelling one that fired or was cancelled
        already does nothing."""
        coro = self._engine.cancel_timer(self._tid, self._now, self.operator, self.key,
                                         timer_id, self._depth + 1)
        if coro is not None:  # the timer lives on another key: delete it there, like a send
            self._send_coro(coro)

    @overload
    def send(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
             **kwargs: P.kwargs) -> None: ...

    @overload
    def send(self, target: str, key: str, function: str, /, *args: Any) -> None: ...

    def send(self, target: FunctionRef[..., Any] | str, /, *rest: Any, **kwargs: Any) -> None:
        """Run a function on a key (either form of :meth:`call`) in this transaction
        without waiting for it.

        It completes before the calling function's result is returned, and commits or
        aborts with the transaction. A function's sends run one after another, in the order
        they were made (overlapping what the function does meanwhile): two sends writing the
        same key must leave the same value when the transaction is replayed after a recovery.
        """
        operator, key, function, args = self._engine.app.call_target(target, *rest, **kwargs)
        self._send_coro(self._engine.call(self._tid, self._now, operator, key, function, args,
                                          self._depth + 1))

    def _send_coro(self, coro: Coroutine[Any, Any, Any]) -> None:
        import asyncio

        previous = self._pending[-1] if self._pending else None

        async def in_order() -> Any:
            if previous is not None:
                await asyncio.wait([previous])  # its failure is reported by its own task
            return await coro

        self._pending.append(asyncio.ensure_future(in_order()))

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


def _written(method: str, target: object, key: object, function: str) -> str:
    """A call as its author wrote it (for :class:`~sfaas.NotAwaited`'s message)."""
    if isinstance(target, FunctionRef):
        return f"{method}({target.__name__}, {key!r}, ...)"
    return f"{method}({target!r}, {key!r}, {function!r}, ...)"
