"""Journaled side effects (``await ctx.run(fn, *args)``), run outside the epochs.

A transaction may run many times — conflict re-runs, the fallback phase, the determinism
check, a recovery's replay — but its effects must happen once. Each ``ctx.run`` gets an
*effect key*, ``"{scope}:{operator}:{key}:{n}"`` (``n``: the n-th effect, action or timer
of the transaction on that key, in the order the function makes them), the same on every
run. The *scope* is the request id, or — for a request with an idempotency key — ``"i"``
and 32 hex digits of a hash of its operator, key, function and idempotency key
(:func:`effect_scope`): every duplicate of one logical request, and every retry, has the
same effect keys, so the external system can drop a repeat too. Its outcome — the result,
or the exception's type and message — is kept in the transaction's *journal*, which every
later run reads instead of running ``fn``.

An effect key runs at most once per process: a run that wants a key already running here
waits for that run's outcome, and a key that finished here (or whose outcome this process
saw in any journal installed, a replay's included) is delivered from memory. So concurrent
duplicates of an idempotent request — same worker, since their key is — share one run.

An effect never runs inside an epoch: a run that reaches a ``ctx.run`` whose outcome is
not journaled yet *suspends* — it aborts with the internal error type ``Suspended``, its
reads and writes discarded, so it holds nothing while ``fn`` runs — and the runtime starts
``fn`` once that epoch is committed (never during a replay). When every effect the run
waited for is journaled, the transaction runs again, from its start, in a later epoch,
reading the state of then and the journaled outcomes. Other transactions never wait for an
effect.

At most ``limit`` effects run at once (the rest wait their turn); one that does not finish
within ``timeout`` seconds is journaled as a ``TimeoutError``. ``fn`` learns its effect key
from :func:`sfaas.effect_key` (also on the second run described in
docs/guide/outside-world.md: a crash after ``fn`` started and before its outcome was
journaled durably runs it again, with the same key).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import concurrent.futures
import contextvars
import functools
import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sfaas.context import EFFECT_KEY
from sfaas.errors import EffectFailed, NotSerializable
from sfaas.runtime.codec import pack, unpack

log = logging.getLogger("sfaas.effects")

__all__ = ["Effects", "EffectSpans", "SUSPENDED", "raise_outcome", "DONE_CACHE", "MAX_THREADS",
           "call_any", "effect_scope"]

#: Threads running sync effects (and, separately, sync post-commit actions) at once per
#: process: a sync ``fn`` needs one while it runs; ``async def`` ones need none.
MAX_THREADS = 64


async def call_any(pool: concurrent.futures.ThreadPoolExecutor, fn: Any,
                   args: Sequence[Any]) -> Any:
    """``fn(*args)``, awaited if it is a coroutine function, else in a thread of ``pool``
    (seeing this task's context variables; an awaitable it returns is awaited too)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    ctx = contextvars.copy_context()
    result = await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(ctx.run, fn, *args))
    if inspect.isawaitable(result):
        result = await result
    return result

#: The error type of a run that stopped at an effect not journaled yet (never reported).
SUSPENDED = "Suspended"

#: Outcomes of finished effects a worker remembers after their transaction moved on (so a
#: replay after a recovery does not run them again).
DONE_CACHE = 100_000

#: ``(True, result)`` or ``(False, (error type, message))``
Outcome = tuple[bool, Any]


def effect_scope(rid: str, operator: str, key: str, function: str,
                 idempotency_key: str | None) -> str:
    """The prefix of a root request's effect keys: ``rid``, or for an idempotent request
    ``"i"`` + 32 hex digits of a hash of what makes duplicates one logical request (the
    same operator, key, function and idempotency key: docs/guide/idempotency.md)."""
    if idempotency_key is None:
        return rid
    ident = "\x00".join((operator, key, function, idempotency_key))
    return "i" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def raise_outcome(outcome: Outcome) -> Any:
    """The journaled outcome as the function sees it: the result, or the exception raised
    again (the same built-in class when it is one, else :class:`sfaas.EffectFailed`)."""
    ok, value = outcome
    if ok:
        return value
    etype, message = value
    if etype == "NotSerializable":  # (the effect's result: the message names it already)
        raise NotSerializable(message, etype)
    cls = getattr(builtins, etype, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:
            exc = EffectFailed(f"{etype}: {message}", etype)
        raise exc
    raise EffectFailed(f"{etype}: {message}", etype)


class EffectSpans(Protocol):
    """What traces the effects (the worker's, with tracing on: ``worker.traces``)."""

    def effect_context(self, tid: int) -> Any:
        """The trace context of transaction ``tid``'s effects (None: not traced)."""

    def effect_ran(self, context: Any, key: str, name: str, start_ns: int,
                   outcome: Outcome) -> None:
        """Effect ``key`` (function ``name``) ran from ``start_ns`` to now."""


class Effects:
    """The effects of one process's transactions (see the module docstring).

    A transaction's *journal* travels with it: the host (the worker, ``LocalRunner``)
    keeps it on the queued request, logs it with the epoch's batch, and installs it here
    when a run begins (:meth:`begin`; a peer's call carries it to the other workers), so
    every run — and a replay — sees exactly the outcomes journaled before its epoch began.
    ``deliver(tid, key, outcome)`` hands a finished effect's outcome to the host, which
    adds it to the journal and lets a parked run go on; it may be called again for the
    same effect (it is idempotent there).
    """

    def __init__(self, deliver: Callable[[int, str, Outcome], None], limit: int = 1000,
                 timeout: float = 30.0) -> None:
        if limit < 1 or timeout <= 0:
            raise ValueError(f"effects need limit >= 1 and timeout > 0, got {limit}, {timeout}")
        self._deliver = deliver
        self.limit = limit
        self.timeout = timeout
        self._slots: asyncio.Semaphore | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            min(limit, MAX_THREADS), thread_name_prefix="sfaas-effect")
        #: tid → its request id (for logs), for the current epoch
        self.rids: dict[int, str] = {}
        #: tid → the prefix of its effect keys (:func:`effect_scope`), for the current epoch
        self.scopes: dict[int, str] = {}
        #: tid → effect key → outcome: the journals installed for the current epoch
        self.journals: dict[int, dict[str, Outcome]] = {}
        #: tid → its request's idempotency key, for the current epoch (roots only)
        self.idem: dict[int, str] = {}
        #: effects a run asked for this epoch, started once it commits: (tid, key, fn, args)
        self._wanted: list[tuple[int, str, Callable[..., Any], Sequence[Any]]] = []
        self.running: dict[str, asyncio.Task[None]] = {}
        #: effect key → the tids that wait for its run here (the first one started it)
        self._waiters: dict[str, set[int]] = {}
        #: finished outcomes by effect key, the newest ``DONE_CACHE`` (never run twice here)
        self._done: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        self.started = self.finished = self.failed = 0
        #: with tracing on, a span of each effect run of a traced transaction
        self.spans: EffectSpans | None = None

    # -- what the engine asks ---------------------------------------------------------------
    def rid(self, tid: int) -> str:
        """The request id of transaction ``tid`` (its tid when none is known)."""
        return self.rids.get(tid) or f"t{tid:x}"

    def scope(self, tid: int) -> str:
        """The prefix of transaction ``tid``'s effect keys (:func:`effect_scope`)."""
        return self.scopes.get(tid) or self.rid(tid)

    def outcome(self, tid: int, key: str) -> Outcome | None:
        """The outcome of effect ``key`` in ``tid``'s journal, if it has one."""
        j = self.journals.get(tid)
        return None if j is None else j.get(key)

    def want(self, tid: int, key: str, fn: Callable[..., Any], args: Sequence[Any]) -> None:
        """A run of ``tid`` suspended at effect ``key``: run it once the epoch commits."""
        self._wanted.append((tid, key, fn, args))

    # -- the epoch ----------------------------------------------------------------------------
    def begin_epoch(self) -> None:
        """A new epoch: the journals installed for the last one go."""
        self.rids, self.scopes, self.journals, self.idem = {}, {}, {}, {}

    def begin(self, tid: int, rid: str, journal: dict[str, Outcome] | None = None,
              idempotency_key: str | None = None, scope: str | None = None) -> None:
        """``tid`` (request ``rid``) runs in the current epoch with ``journal``; its effect
        keys start with ``scope`` (default ``rid``; a peer's call carries its root's). The
        journal's outcomes are remembered: a duplicate wanting one of them gets it."""
        self.rids[tid] = rid
        self.scopes[tid] = scope or rid
        if journal:
            self.journals[tid] = journal
            for key, outcome in journal.items():
                self._remember(key, outcome)
        if idempotency_key is not None:
            self.idem[tid] = idempotency_key

    def _remember(self, key: str, outcome: Outcome) -> None:
        if key not in self._done:
            self._done[key] = outcome
            if len(self._done) > DONE_CACHE:
                self._done.popitem(last=False)

    def launch(self, live: bool = True) -> None:
        """The epoch committed: start the effects its runs suspended at (``live``; a replay
        starts none) — each key at most once per process: one that finished here already is
        delivered again instead, one running here delivers to every run waiting for it."""
        wanted, self._wanted = self._wanted, []
        if not live:
            return
        for tid, key, fn, args in wanted:
            done = self._done.get(key)
            if done is not None:
                self._deliver(tid, key, done)
            elif key in self.running:
                self._waiters[key].add(tid)
            else:
                self._waiters[key] = {tid}
                context = self.spans.effect_context(tid) if self.spans is not None else None
                self.running[key] = asyncio.get_running_loop().create_task(
                    self._run(key, fn, args, context))
                self.started += 1

    # -- running ------------------------------------------------------------------------------
    async def _run(self, key: str, fn: Callable[..., Any], args: Sequence[Any],
                   context: Any = None) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        try:
            async with self._slots:
                start_ns = time.time_ns() if context is not None else 0
                outcome = await self._call(key, fn, args)
        finally:
            self.running.pop(key, None)
        if context is not None and self.spans is not None:
            self.spans.effect_ran(context, key, _name(fn), start_ns, outcome)
        self.finished += 1
        self._remember(key, outcome)
        for tid in sorted(self._waiters.pop(key, ())):
            self._deliver(tid, key, outcome)

    async def _call(self, key: str, fn: Callable[..., Any], args: Sequence[Any]) -> Outcome:
        token = EFFECT_KEY.set(key)
        try:
            result = await asyncio.wait_for(call_any(self._pool, fn, args), self.timeout)
            try:
                return True, unpack(pack(result, f"the result of effect {key} ({_name(fn)})"))
            except NotSerializable as exc:
                self.failed += 1
                return False, ("NotSerializable", f"{exc.reason}: the effect ran, return a "
                               "msgpack-able value from it")
        except TimeoutError:
            self.failed += 1
            return False, ("TimeoutError", f"effect {key} ({_name(fn)}) did not finish within "
                                           f"{self.timeout:g} s (the effect_timeout setting)")
        except Exception as exc:
            self.failed += 1
            log.info("effect %s (%s) raised %s: %s", key, _name(fn), type(exc).__name__, exc)
            return False, (type(exc).__name__, str(exc))
        finally:
            EFFECT_KEY.reset(token)

    async def close(self) -> None:
        """Cancel the effects still running."""
        self._waiters.clear()
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or fn)
