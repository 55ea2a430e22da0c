"""``LocalRunner``: the verbs users call, each in a blocking form and an ``a*`` twin.

Why a thread: a runner made in a sync fixture must serve an ``async`` test, and one made in
a coroutine a plain test. Bound to the caller's event loop it could do neither, so the
cluster (:mod:`sfaas.testing.cluster`) lives on an event loop of its own, on a daemon
thread started on first use (:mod:`sfaas.testing.loop_thread`). Every verb validates its
input on the caller's thread (so a bad input raises right there) and hands the rest to that
loop: the blocking form waits for the result, the ``a*`` form awaits it from whatever loop
the caller runs in. Engine state — reads included — is touched only on the runner's
thread, and reads wait for the epoch running, if any, to end.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, TypeVarTuple, overload

from sfaas.app import App, FunctionRef
from sfaas.errors import EffectThenAbortWarning, TransactionAborted
from sfaas.runtime.codec import pack, unpack
from sfaas.runtime.txn.actions import Actions
from sfaas.runtime.txn.effects import Effects
from sfaas.runtime.txn.engine import Engine
from sfaas.runtime.txn.timers import TimerIndex
from sfaas.testing.cluster import LocalCluster, Request, RunnerStats
from sfaas.testing.loop_thread import LoopThread

__all__ = ["LocalRunner"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class LocalRunner:
    """An in-process cluster for tests and notebooks (see :mod:`sfaas.testing`).

    Every verb has a blocking form, for plain code, and an ``a*`` twin, a coroutine for
    ``async`` code on any event loop; both forms work on one runner, in any order. A
    blocking form called inside a running event loop works too, but stops that loop until
    it returns: use the twin there.

    ``ctx.run`` effects, post-commit actions and ``on_epoch_committed`` run on the
    runner's own thread and event loop, not the caller's: an ``asyncio`` object they share
    with a test (an ``Event`` the test sets, say) must be used thread-safely.

    The attributes ``engines``, ``loops``, ``effects``, ``actions`` and ``timers`` are the
    cluster's parts, for tests of the runtime itself: they belong to the runner's thread.
    """

    def __init__(
        self,
        app: App,
        *,
        workers: int = 2,
        partitions: int = 8,
        store: str | None = None,
        store_options: dict[str, Any] | None = None,
        directory: str | os.PathLike[str] | None = None,
        max_batch: int = 1000,
        fallback: bool = True,
        check_determinism: bool = True,
        effect_timeout: float = 30.0,
        max_effects: int = 1000,
        idempotency_retention: float = 86400.0,
    ) -> None:
        self._cluster = c = LocalCluster(
            app, workers=workers, partitions=partitions, store=store,
            store_options=store_options, directory=directory, max_batch=max_batch,
            fallback=fallback, check_determinism=check_determinism,
            effect_timeout=effect_timeout, max_effects=max_effects,
            idempotency_retention=idempotency_retention)
        self.app: App = app
        self.directory: str = c.directory
        self.max_batch, self.fallback = max_batch, fallback
        #: run every transaction about to commit twice and abort it with
        #: NondeterminismError when the runs differ (``sfaas.runtime.txn.determinism``)
        self.check_determinism = check_determinism
        self.engines: list[Engine] = c.engines
        self.loops = c.loops
        self.effects: Effects = c.effects
        self.actions: Actions = c.actions
        self.timers: list[TimerIndex] = c.timers
        self.stats: RunnerStats = c.stats
        self._thread = LoopThread("sfaas-runner")
        # a runner dropped unclosed does not keep its thread
        self._finalizer = weakref.finalize(self, self._thread.stop)
        self._finalizer.atexit = False
        self._closed = False

    @property
    def on_epoch_committed(self) -> Callable[[int, list[int]], object] | None:
        """Called after every epoch's commit with ``(epoch, committed tids in serial
        order)``, on the runner's thread."""
        return self._cluster.on_epoch_committed

    @on_epoch_committed.setter
    def on_epoch_committed(self, fn: Callable[[int, list[int]], object] | None) -> None:
        self._cluster.on_epoch_committed = fn

    def now(self) -> float:
        """The runner's clock: the wall clock plus what :meth:`advance` added (from any
        thread)."""
        return self._cluster.now()

    def remap(self, owners: list[int]) -> None:
        """Move the partitions' stores between the simulated workers to the map ``owners``
        (``owners[p]``: the worker owning partition ``p``), as a rescale does; blocking,
        between epochs."""
        self._run(self._cluster.between_epochs(self._cluster.remap, list(owners)))

    # -- the two forms -----------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("LocalRunner is closed")
        try:
            return self._thread.run(coro)
        except TransactionAborted as exc:
            error = exc
        _warn_effects(error, 3)
        # the caller's error, raised outside the handler so it is chained to nothing; its
        # traceback starts at the caller, not in the runner's thread (the function's own
        # is in error.traceback and the note)
        raise error.with_traceback(None)

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("LocalRunner is closed")
        try:
            return await self._thread.arun(coro)
        except TransactionAborted as exc:
            error = exc
        _warn_effects(error, 3)
        raise error.with_traceback(None)  # (as in _run)

    # -- calling -------------------------------------------------------------------------------
    @overload
    def call(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
             **kwargs: P.kwargs) -> R: ...

    @overload  # (with an idempotency key: a handle's positional arguments only)
    def call(self, target: Callable[[Any, *Ts], Coroutine[Any, Any, R]], key: str, /,
             *args: *Ts, idempotency_key: str | None) -> R: ...

    @overload
    def call(self, target: str, key: str, function: str, /, *args: Any,
             idempotency_key: str | None = None) -> Any: ...

    # (the [misc] error mypy reports here is wrong: see sfaas.Client.call's implementation)
    def call(self, target: Any, /, *rest: Any,  # type: ignore[misc]
             idempotency_key: str | None = None, **kwargs: Any) -> Any:
        """Run one request as a transaction and return its result (blocking; in ``async``
        code, :meth:`acall`). Either form of :meth:`sfaas.Client.call`: the handle
        ``@operator.function`` returned (``call(deposit, "alice", 5)``, checked by mypy) or
        names (``call("accounts", "alice", "deposit", 5)``).

        Raises :class:`~sfaas.errors.TransactionAborted` (or a subclass) if it aborted — with
        the function's traceback in ``exc.traceback`` and a note when it raised a plain
        exception; warns :class:`~sfaas.errors.EffectThenAbortWarning` when it aborted after
        one of its ``ctx.run`` effects ran. ``idempotency_key``: as
        :meth:`sfaas.Client.call`'s.
        """
        return self._run(self._cluster.call(
            self._target(target, rest, kwargs, idempotency_key)))

    @overload
    async def acall(self, target: FunctionRef[P, R], key: str, /, *args: P.args,
                    **kwargs: P.kwargs) -> R: ...

    @overload
    async def acall(self, target: Callable[[Any, *Ts], Coroutine[Any, Any, R]], key: str, /,
                    *args: *Ts, idempotency_key: str | None) -> R: ...

    @overload
    async def acall(self, target: str, key: str, function: str, /, *args: Any,
                    idempotency_key: str | None = None) -> Any: ...

    async def acall(self, target: Any, /, *rest: Any,  # type: ignore[misc]
                    idempotency_key: str | None = None, **kwargs: Any) -> Any:
        """:meth:`call` for ``async`` code (any event loop). Concurrent ``acall`` s may land
        in different epochs; :meth:`agather` queues its requests together."""
        return await self._arun(self._cluster.call(
            self._target(target, rest, kwargs, idempotency_key)))

    def _target(self, target: Any, rest: tuple[Any, ...], kwargs: dict[str, Any],
                idempotency_key: object) -> Request:
        """The request of a call in either form (``App.call_target``), checked."""
        operator, key, function, args = self.app.call_target(target, *rest, **kwargs)
        return self._request(operator, key, function, args, idempotency_key)

    def gather(self, *requests: tuple[Any, ...], return_exceptions: bool = False) -> list[Any]:
        """Run several requests concurrently, each a tuple ``(operator, key, function,
        *args)``, queued together (they share epochs, as concurrent clients' would): their
        results in order (blocking; in ``async`` code, :meth:`agather`).

        A request that aborts raises its TransactionAborted, or with ``return_exceptions``
        is returned in its place; one that fails validation raises before any request runs
        (with ``return_exceptions``: its error in its place, the others run).
        """
        prepared = self._requests(requests, return_exceptions)
        valid = [r for r in prepared if isinstance(r, Request)]
        return _merge(prepared, self._run(self._cluster.gather(valid, return_exceptions)))

    async def agather(self, *requests: tuple[Any, ...],
                      return_exceptions: bool = False) -> list[Any]:
        """:meth:`gather` for ``async`` code (any event loop)."""
        prepared = self._requests(requests, return_exceptions)
        valid = [r for r in prepared if isinstance(r, Request)]
        return _merge(prepared, await self._arun(self._cluster.gather(valid, return_exceptions)))

    def _request(self, operator: object, key: object, function: object, args: Sequence[Any],
                 idempotency_key: object) -> Request:
        """The request, checked here on the caller's thread, its arguments copied."""
        from sfaas.client import check_idempotency_key

        self.app.validate(operator, key, function, args)
        check_idempotency_key(idempotency_key)
        return Request(str(operator), str(key), str(function), unpack(pack(list(args))),
                       idempotency_key if isinstance(idempotency_key, str) else None)

    def _requests(self, requests: Sequence[object],
                  return_exceptions: bool) -> list[Request | TransactionAborted]:
        out: list[Request | TransactionAborted] = []
        for i, r in enumerate(requests):
            if not isinstance(r, tuple) or len(r) < 2 or (
                    len(r) < 3 and not isinstance(r[0], FunctionRef)):
                hint = (" — pass each request as its own argument: gather(*requests)"
                        if isinstance(r, list) and r and isinstance(r[0], tuple) else "")
                raise TypeError(f"gather takes requests as tuples (operator, key, function, "
                                f"*args) or (handle, key, *args); request {i} is {r!r:.80} "
                                f"({type(r).__name__}){hint}")
            try:
                out.append(self._target(r[0], r[1:], {}, None))
            except TransactionAborted as exc:
                if not return_exceptions:
                    raise
                out.append(exc)
        return out

    # -- time ------------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead (``ctx.now()`` included) and run every timer due
        by then, and whatever they call, to the end — tests of timeouts need not sleep;
        values of operators with a ``ttl`` expire by this clock too (blocking; in ``async``
        code, :meth:`aadvance`)."""
        self._run(self._cluster.advance(_seconds(seconds)))

    async def aadvance(self, seconds: float) -> None:
        """:meth:`advance` for ``async`` code (any event loop)."""
        await self._arun(self._cluster.advance(_seconds(seconds)))

    def drain(self) -> None:
        """Wait until nothing is left to do now: no request, effect, post-commit action or
        due timer (blocking; in ``async`` code, :meth:`adrain`)."""
        self._run(self._cluster.drain())

    async def adrain(self) -> None:
        """:meth:`drain` for ``async`` code (any event loop)."""
        await self._arun(self._cluster.drain())

    # -- inspection (between epochs, without a transaction) -------------------------------------
    def state(self, operator: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``operator`` as functions would see it now
        (``default`` if none, or expired by :meth:`now`; blocking; in ``async`` code,
        :meth:`astate`)."""
        return self._run(self._state(operator, key, default))

    async def astate(self, operator: str, key: str, default: Any = None) -> Any:
        """:meth:`state` for ``async`` code (any event loop)."""
        return await self._arun(self._state(operator, key, default))

    def get(self, operator: str, key: str, default: Any = None) -> Any:
        """Like :meth:`sfaas.Client.get`: the committed value, without a transaction
        (blocking; in ``async`` code, :meth:`aget`)."""
        return self._run(self._get(operator, key, default))

    async def aget(self, operator: str, key: str, default: Any = None) -> Any:
        """:meth:`get` for ``async`` code (any event loop)."""
        return await self._arun(self._get(operator, key, default))

    def scan(self, operator: str, prefix: str = "", limit: int = 1000) -> list[tuple[str, Any]]:
        """Like :meth:`sfaas.Client.scan`: ``(key, value)`` starting with ``prefix``, in key
        order, at most ``limit``, without a transaction (blocking; in ``async`` code,
        :meth:`ascan`)."""
        return self._run(self._scan(operator, prefix, limit))

    async def ascan(self, operator: str, prefix: str = "",
                    limit: int = 1000) -> list[tuple[str, Any]]:
        """:meth:`scan` for ``async`` code (any event loop)."""
        return await self._arun(self._scan(operator, prefix, limit))

    def items(self, operator: str) -> dict[str, Any]:
        """Every committed ``key → value`` of ``operator`` (expired ones left out; blocking;
        in ``async`` code, :meth:`aitems`)."""
        return self._run(self._items(operator))

    async def aitems(self, operator: str) -> dict[str, Any]:
        """:meth:`items` for ``async`` code (any event loop)."""
        return await self._arun(self._items(operator))

    def _state(self, operator: str, key: str, default: Any) -> Coroutine[Any, Any, Any]:
        self.app.get_operator(operator)
        return self._cluster.between_epochs(self._cluster.state, operator, key, default)

    def _get(self, operator: str, key: str, default: Any) -> Coroutine[Any, Any, Any]:
        from sfaas.runtime.txn.engine import check_key

        return self._state(operator, check_key(key, operator), default)

    def _scan(self, operator: str, prefix: str,
              limit: int) -> Coroutine[Any, Any, list[tuple[str, Any]]]:
        from sfaas.runtime.txn.reads import check_scan

        check_scan(prefix, limit)
        self.app.get_operator(operator)
        return self._cluster.between_epochs(self._cluster.scan, operator, prefix, limit)

    def _items(self, operator: str) -> Coroutine[Any, Any, dict[str, Any]]:
        self.app.get_operator(operator)
        return self._cluster.between_epochs(self._cluster.items, operator)

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the epoch driver, the effects and actions still running and the runner's
        thread; close the stores; remove the temporary directory. Blocking (in ``async``
        code, :meth:`aclose`); again, nothing."""
        if self._closed:
            return
        self._not_on_own_thread("close")
        self._closed = True
        try:
            self._thread.run(self._cluster.close())
        finally:
            self._finalizer()

    async def aclose(self) -> None:
        """:meth:`close` for ``async`` code (any event loop)."""
        if self._closed:
            return
        self._not_on_own_thread("aclose")
        self._closed = True
        try:
            await self._thread.arun(self._cluster.close())
        finally:
            self._finalizer()  # (the loop has nothing left to do: the join is short)

    def _not_on_own_thread(self, verb: str) -> None:
        if self._thread.on_it():
            raise RuntimeError(f"LocalRunner.{verb} from the runner's own thread (an effect, "
                               "a post-commit action, on_epoch_committed) would stop the "
                               "thread it runs on: close the runner from the code that made it")

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> LocalRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _seconds(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError(f"advance needs seconds >= 0, got {seconds!r}")
    return float(seconds)


def _warn_effects(error: TransactionAborted, stacklevel: int) -> None:
    """An abort after an effect ran: the effect is not undone — say so where the test
    sees it (the reason names the effects: ``sfaas.runtime.txn.failures``)."""
    from sfaas.runtime.txn.failures import AFTER_EFFECTS

    at = error.reason.find(AFTER_EFFECTS)
    if at >= 0:
        keys = error.reason[at + len(AFTER_EFFECTS):].split(" ran before")[0].strip()
        warnings.warn(EffectThenAbortWarning(
            f"the transaction aborted ({error.error_type}) after its effect(s) {keys} ran; "
            "they are not undone. Commit the refusal and undo them with ctx.after_commit "
            "instead (docs/guide/outside-world.md)"), stacklevel=stacklevel + 1)


def _merge(prepared: Sequence[object], results: list[Any]) -> list[Any]:
    """The results of the valid requests, with the errors of the others in their places."""
    got = iter(results)
    return [next(got) if isinstance(p, Request) else p for p in prepared]
