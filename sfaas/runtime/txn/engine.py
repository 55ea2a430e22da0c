"""Executes user functions for one worker's share of the keys, inside epochs.

An :class:`Engine` owns the stores of its partitions and an :class:`AccessLog` for the
current epoch. It is transport-agnostic: calls to keys another worker owns go through a
:class:`Router` (peer channels in a worker process, direct calls in
:class:`sfaas.testing.LocalRunner`), so both share exactly the same transaction semantics.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sfaas.app import App
from sfaas.context import Context
from sfaas.errors import (
    Abort,
    BadArguments,
    NotAwaited,
    SfaasError,
    TransactionAborted,
)
from sfaas.runtime.codec import check_arguments, pack
from sfaas.runtime.liveness import Turns
from sfaas.runtime.partitioning import owner_of_partition, partition_of
from sfaas.runtime.txn import internal
from sfaas.runtime.txn.effects import SUSPENDED, Effects, raise_outcome
from sfaas.runtime.txn.epochs import AccessLog, Key
from sfaas.runtime.txn.failures import after_effects, check_key, describe, make_error
from sfaas.runtime.values import Values
from statestores import Store

log = logging.getLogger("sfaas.engine")

__all__ = [
    "Engine", "Router", "RootCall", "Outcome", "describe", "make_error", "check_key",
    "MAX_CALL_DEPTH", "DEVIATED",
]

#: Deepest chain of nested ``ctx.call``s before the transaction aborts (catches runaway recursion).
MAX_CALL_DEPTH = 64

#: ``(True, result)`` or ``(False, (error_type, reason))``.
Outcome = tuple[bool, Any]


class RootCall(NamedTuple):
    """A transaction's root call, what :meth:`Engine.run_root` runs: a client's request,
    or the runtime's own (``operator`` an ``internal.RuntimeCall``)."""

    operator: str
    key: str
    function: str
    args: Sequence[Any]

#: The error type of a fallback run that left the keys its first run touched: it re-runs
#: next epoch (never reported to a client).
DEVIATED = "FallbackDeviated"


class _Fallback:
    """One engine's share of an epoch's *cross-worker fallback phase*: deterministic locks.

    Every conflicting transaction of the epoch (``tids``, the same set on every worker)
    re-runs at once, all of them concurrently, against the committed state. Each key this
    engine owns gets the queue of those tids whose first run read or wrote it, in tid
    order; a re-run may use the key only after every lower tid of its queue *finished*
    (committed or gave up, on every worker). Waits only ever go to lower tids, so the
    lowest never waits and no cycle can form, and each key is used in tid order: the
    committed re-runs are equivalent to running them one by one in tid order after the
    epoch's commits (Calvin's ordered locks over the first run's read/write sets; Styx's
    fallback). A re-run that reads or writes a key outside its first run's set could
    race an unordered tid there: it *deviates*, its writes dropped; once the phase ended
    everywhere its worker runs it again alone (``Participant.rerun_deviated``), and it
    re-runs next epoch only if that run would leave the worker.
    """

    def __init__(self, first: AccessLog, tids: set[int]) -> None:
        self.tids = tids
        sets: dict[Key, set[int]] = {}
        for accesses in (first.reads, first.writes):
            for tid, keys in accesses.items():
                if tid in tids:
                    for k in keys:
                        sets.setdefault(k, set()).add(tid)
        self.declared = sets
        self.queues = {k: sorted(v) for k, v in sets.items()}
        self.finished: dict[int, asyncio.Event] = {}
        self.deviated: set[int] = set()

    def _event(self, tid: int) -> asyncio.Event:
        ev = self.finished.get(tid)
        if ev is None:
            ev = self.finished[tid] = asyncio.Event()
        return ev

    async def turn(self, tid: int, key: Key) -> None:
        """Wait until every lower tid that used ``key`` in its first run has finished."""
        for t in self.queues.get(key, ()):
            if t >= tid:
                return
            await self._event(t).wait()

    def finish(self, tid: int) -> None:
        self._event(tid).set()


class Router(Protocol):
    """Carries a call to the engine of worker ``dest`` and returns its :data:`Outcome`."""

    async def remote_call(
        self, dest: int, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int,
    ) -> Outcome: ...


@dataclass(frozen=True)
class EpochReport:
    """What one engine saw in one epoch (for logs and stats)."""

    committed: int
    rerun: int
    aborted: int


class Engine:
    """One worker's execution engine (see module docstring)."""

    def __init__(
        self,
        app: App,
        index: int,
        n_workers: int,
        partitions: int,
        stores: Mapping[tuple[str, int], Store],
        router: Router | None,
        owners: Sequence[int] | Callable[[], Sequence[int]] | None = None,
    ) -> None:
        if not 0 <= index < n_workers:
            raise ValueError(f"worker index {index} not in [0, {n_workers})")
        missing = set(app.operators) - {op for op, _ in stores}
        if missing:
            raise ValueError(f"no store for operator(s) {sorted(missing)}")
        self.app = app
        self.index = index
        self.partitions = partitions
        #: the partition map (``owners[p]``: the worker index owning partition ``p``): a
        #: callable reads it from its one owner (a worker's state, which recoveries and
        #: rescales change); a list is this engine's own copy
        self._owners: Callable[[], Sequence[int]]
        if callable(owners):
            self._owners = owners
        else:
            self.owners = owners or [owner_of_partition(p, n_workers) for p in range(partitions)]
        self.stores = dict(stores)
        self.values = Values(app)  # each operator's stored-value codec (version, ttl)
        self.router = router
        self.epoch = 0
        self.log = AccessLog()
        #: tids whose calls left this worker in the current epoch (not fallback-eligible)
        self._remote_tids: set[int] = set()
        #: set while :meth:`run_fallback` runs: remote calls are refused, not made
        self._in_fallback = False
        self._deviated: set[int] = set()
        #: the cross-worker fallback phase in progress (see :class:`_Fallback`), or None
        self._fb: _Fallback | None = None
        #: ``(tid, reason) → traceback`` of the plain exceptions user functions raised here
        #: this epoch (what :class:`sfaas.testing.LocalRunner` attaches to the error)
        self.tracebacks: dict[tuple[int, str], str] = {}
        #: the journals of ``ctx.run`` effects (set by whoever runs the epochs; without one
        #: a ``ctx.run`` aborts the transaction)
        self.effects: Effects | None = None
        #: told ``(operator, key, value or None)`` of each runtime record (timer, action)
        #: applied to a store here
        self.on_record: Callable[[str, str, bytes | None], None] | None = None
        #: seconds an idempotent request's outcome is kept (setting ``idempotency_retention``)
        self.idempotency_retention = 86400.0

    def shadow(self) -> Engine:
        """An engine over the same stores, partition map and effect journals, with its own
        access log and no router (a call leaving this worker fails in it): for running
        transactions again without touching this one's epoch (the determinism check)."""
        n = max(max(self.owners) + 1, self.index + 1)
        twin = Engine(self.app, self.index, n, self.partitions, self.stores, None, self._owners)
        twin.epoch, twin.effects, twin.values = self.epoch, self.effects, self.values
        return twin

    # -- placement -------------------------------------------------------------------
    @property
    def owners(self) -> Sequence[int]:
        """The partition map now."""
        return self._owners()

    @owners.setter
    def owners(self, owners: Sequence[int]) -> None:
        fixed = list(owners)
        self._owners = lambda: fixed

    def owner(self, operator: str, key: str) -> int:
        """The worker index owning ``key`` of ``operator``."""
        return self.owners[partition_of(operator, key, self.partitions)]

    def store_of(self, operator: str, key: str) -> Store:
        """The store of ``key``'s partition (KeyError if this worker does not own it)."""
        return self.stores[(operator, partition_of(operator, key, self.partitions))]

    def operator_stores(self, operator: str) -> list[Store]:
        """This worker's stores of ``operator``, one per owned partition."""
        return [s for (op, _), s in self.stores.items() if op == operator]

    # -- state access (used by Context) ------------------------------------------------
    def read(self, tid: int, operator: str, key: str, default: Any,
             now: float | None = None) -> Any:
        """``key``'s value for ``tid``: its own buffered write, else the epoch-start value;
        as of the transaction's ``now`` (expired: ``default``; see ``runtime.values``)."""
        k = (operator, key)
        if self._fb is not None:
            self._check_declared(tid, k)
        found, raw = self.log.buffered(tid, k)
        if not found:
            self.log.record_read(tid, k)
            raw = self.store_of(operator, key).get(key.encode())
        try:
            return self.values.decode(operator, key, raw, now, default)
        except TransactionAborted as exc:  # (SchemaTooNew…: aborts even if the function catches)
            self.log.record_abort(tid, *describe(exc))
            raise

    def write(self, tid: int, operator: str, key: str, value: Any, now: float | None = None
              ) -> None:
        """Buffer ``tid``'s write of ``value`` to ``key`` (``now``: the transaction's)."""
        if self._fb is not None:
            self._check_declared(tid, (operator, key))
        self.log.record_write(tid, (operator, key), self.values.encode(operator, key, value, now))

    def remove(self, tid: int, operator: str, key: str) -> None:
        """Buffer ``tid``'s delete of ``key``."""
        if self._fb is not None:
            self._check_declared(tid, (operator, key))
        self.log.record_write(tid, (operator, key), None)

    def _check_declared(self, tid: int, key: Key) -> None:
        """(fallback phase) ``tid`` may use ``key`` only if its first run did."""
        fb = self._fb
        assert fb is not None
        if tid not in fb.declared.get(key, ()):
            fb.deviated.add(tid)
            raise Abort(f"the fallback run of {tid} used {key[0]}/{key[1]!r}, which its first "
                        "run did not")

    # -- the outside world: effects, actions, timers (see ``effects`` and ``internal``) -------
    def next_seq(self, tid: int, operator: str, key: str) -> int:
        return self.log.next_seq(tid, (operator, key))

    async def run_effect(self, tid: int, operator: str, key: str, n: int,
                         fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """``ctx.run``: the journaled outcome, or suspend the transaction until it is."""
        fx = self.effects
        if fx is None:
            raise Abort("ctx.run is not available here (no effect journal)")
        ekey = f"{fx.scope(tid)}:{operator}:{key}:{n}"
        outcome = fx.outcome(tid, ekey)
        if outcome is not None:
            return raise_outcome(outcome)
        self.log.record_abort(tid, SUSPENDED, ekey)
        fx.want(tid, ekey, fn, args)
        raise TransactionAborted(f"suspended at effect {ekey}", SUSPENDED)

    def after_commit(self, tid: int, operator: str, key: str, n: int,
                     fn: Callable[..., Any], args: Sequence[Any]) -> None:
        """``ctx.after_commit``: store the action with the transaction's writes."""
        name = internal.function_name(fn)
        scope = self.effects.scope(tid) if self.effects is not None else f"t{tid:x}"
        record = internal.action_record(name, args, f"{scope}:{operator}:{key}:{n}")
        self.write(tid, operator, internal.action_key(key, tid, n), record)

    def set_timer(self, tid: int, now: float, operator: str, key: str, n: int, delay: float,
                  target: tuple[str, str, str], args: Sequence[Any]) -> str:
        """``ctx.send_after``: store the timer with the transaction's writes; its id."""
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not delay >= 0:
            raise BadArguments(f"ctx.send_after: delay_s must be a number >= 0, got {delay!r:.40}")
        t_op, t_key, t_fn = target
        if t_fn[:1] != "\x00":  # (the runtime's own timers name internal functions)
            self.app.resolve(t_op, t_fn).check_args(t_op, args)
            check_key(t_key, t_op)
        check_arguments(list(args), f"arguments of the timer's {t_op}.{t_fn}")
        rkey = internal.timer_key(key, now + delay, tid, n)
        self.write(tid, operator, rkey, [t_op, t_key, t_fn, list(args), now + delay])
        return internal.timer_id(operator, rkey)

    def cancel_timer(self, tid: int, now: float, operator: str, key: str, timer_id: str,
                     depth: int) -> Any:
        """``ctx.cancel_timer``: delete the timer here, or return the call deleting it on
        the key that made it."""
        t_op, rkey = internal.parse_timer_id(timer_id)
        owner = internal.owner_key(rkey)
        if (t_op, owner) == (operator, key):
            if self.read(tid, operator, rkey, None) is not None:
                self.remove(tid, operator, rkey)
            return None
        return self.call(tid, now, t_op, owner, internal.CANCEL_TIMER, [rkey], depth)

    # -- execution -----------------------------------------------------------------------
    def begin(self, epoch: int) -> None:
        """Start epoch ``epoch``: a fresh access log over the (committed) store state."""
        self.epoch = epoch
        self.log = AccessLog()
        self._remote_tids = set()
        self.tracebacks = {}

    async def call(
        self, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int = 0,
    ) -> Any:
        """Run ``operator.function(key, *args)`` for ``tid`` wherever ``key`` lives.

        Raises the caller-side view of a failure (:func:`make_error`); every failure is
        also recorded as an abort of ``tid`` on this worker.
        """
        try:
            if function[:1] == "\x00":  # the runtime's own (see ``internal``)
                if function not in internal.IMPLEMENTATIONS:
                    raise Abort(f"no internal function {function!r}")
            else:
                self.app.resolve(operator, function).check_args(operator, args)
                check_key(key, operator)
            if depth > MAX_CALL_DEPTH:
                raise Abort(f"call depth exceeded {MAX_CALL_DEPTH} at {operator}.{function}")
            dest = self.owner(operator, key)
            if dest == self.index or self.router is None:
                if depth:  # root arguments came off the wire: already msgpack values
                    check_arguments(args, f"arguments of {operator}.{function}")
                ok, value = await self.serve(tid, now, operator, key, function, args, depth)
            elif self._in_fallback:
                # the first run stayed on this worker; this one would not: re-run next epoch
                self._deviated.add(tid)
                raise Abort(f"fallback run of {tid} left worker {self.index}")
            else:
                self._remote_tids.add(tid)
                ok, value = await self.router.remote_call(
                    dest, tid, now, operator, key, function, args, depth
                )
        except Exception as exc:
            etype, reason = describe(exc)
            reason = self._after_effects(tid, etype, reason)
            self.log.record_abort(tid, etype, reason)
            raise make_error(etype, reason) from None
        if not ok:
            etype, reason = value
            if etype == DEVIATED and self._fb is not None:
                self._fb.deviated.add(tid)
            self.log.record_abort(tid, etype, reason)
            raise make_error(etype, reason)
        return value

    async def serve(
        self, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int = 0,
    ) -> Outcome:
        """Run a call on a key this worker owns; never raises (the outcome says how it went)."""
        fb = self._fb
        if fb is not None and tid in fb.declared.get((operator, key), ()):
            await fb.turn(tid, (operator, key))
        try:
            sends: list[Any] = []
            ctx = Context(self, tid, now, operator, key, depth, sends)
            try:
                if function[:1] == "\x00":  # the runtime's own (timers, idempotency, actions)
                    result = await internal.IMPLEMENTATIONS[function](ctx, self, depth, *args)
                else:
                    result = await self.app.resolve(operator, function).fn(ctx, *args)
            finally:
                missed = ctx.unawaited_call()
                if sends:
                    # Sends complete within the call; their failures are recorded by
                    # Engine.call on this worker, which aborts the transaction.
                    await asyncio.gather(*sends, return_exceptions=True)
            if missed is not None:
                raise NotAwaited(f"{operator}.{function} on key {key!r} returned without awaiting "
                                 f"{missed}: that call never ran (write `await {missed}`)")
            pack(result, f"result of {operator}.{function}")
            outcome: Outcome = (True, result)
        except Exception as exc:
            etype, reason = describe(exc)
            reason = self._after_effects(tid, etype, reason)
            self.log.record_abort(tid, etype, reason)
            if not isinstance(exc, SfaasError):
                self._raised(tid, operator, key, function, reason, exc)
            outcome = (False, (etype, reason))
        if fb is not None:
            # in the fallback a deviation or an abort anywhere below reaches the root,
            # even if a function on the way caught the exception
            if tid in fb.deviated:
                return False, (DEVIATED, f"the fallback run of {tid} deviated from its first run")
            if tid in self.log.user_aborts:
                return False, self.log.user_aborts[tid]
        return outcome

    def _after_effects(self, tid: int, etype: str, reason: str) -> str:
        """An abort's reason, naming the transaction's effects that ran before it."""
        journal = self.effects.journals.get(tid) if self.effects is not None else None
        return after_effects(journal, etype, reason)

    def _raised(self, tid: int, operator: str, key: str, function: str, reason: str,
                exc: Exception) -> None:
        """A user function raised a plain exception (a bug, not an ``Abort``): keep its
        traceback, from the function's frame on, and log it where the function ran."""
        tb = exc.__traceback__
        text = "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb else None))
        self.tracebacks[(tid, reason)] = text
        rid = self.effects.rids.get(tid, "?") if self.effects is not None else "?"
        log.warning("%s.%s on key %r raised in request %s (transaction %d): %s\n%s", operator,
                    function, key, rid, tid, reason, text.rstrip(), extra={"worker": self.index})

    async def run_root(self, tid: int, now: float, root: RootCall) -> Outcome:
        """Run a transaction's root call; never raises. A root naming an internal function
        must come from the runtime: a ``RuntimeCall`` operator (see ``internal``), never a
        client's string."""
        operator, key, function, args = root
        if not isinstance(operator, internal.RuntimeCall) and (
                function[:1] == "\x00" or key[:1] == "\x00"):
            return False, ("UnknownFunction", f"no function {function!r} on key {key!r:.40} "
                                              "(names and keys starting with \\x00 are the "
                                              "runtime's)")
        idem = self.effects.idem.get(tid) if self.effects is not None else None
        if idem is not None and not isinstance(operator, internal.RuntimeCall):
            return await self._run_idempotent(tid, now, operator, key, function, args, idem)
        try:
            return True, await self.call(tid, now, operator, key, function, args, 0)
        except Exception as exc:
            return False, describe(exc)

    async def _run_idempotent(self, tid: int, now: float, operator: str, key: str,
                              function: str, args: Sequence[Any], idem: str) -> Outcome:
        """A root with an idempotency key: the outcome kept for it within the retention
        window, or run it and keep its result with its writes (an abort is kept by the
        runtime's request that follows it: ``internal.record_abort``), with a timer that
        drops it when the window ends."""
        rkey = internal.idem_key(key, function, idem)
        try:
            check_key(key, operator)
            kept = self.read(tid, operator, rkey, None)
        except Exception as exc:
            return False, describe(exc)
        if kept is not None and now - float(kept[2]) <= self.idempotency_retention:
            ok, value = bool(kept[0]), kept[1]
            if not ok:
                self.log.record_abort(tid, str(value[0]), str(value[1]))
                return False, (str(value[0]), str(value[1]))
            return True, value
        try:
            value = await self.call(tid, now, operator, key, function, args, 0)
        except Exception as exc:
            return False, describe(exc)
        if tid not in self.log.user_aborts:
            self.write(tid, operator, rkey, [True, value, now])
            n = self.next_seq(tid, operator, key)
            self.set_timer(tid, now, operator, key, n, self.idempotency_retention,
                           (operator, key, internal.IDEM_EXPIRE), [rkey])
        return True, value

    def local_only(self, tid: int) -> bool:
        """Whether root ``tid`` (run here this epoch) touched only this worker's keys.

        Every other worker a transaction reaches is reached through a call chain starting
        with a remote call from its root's worker, so no remote call here means none at all.
        """
        return tid not in self._remote_tids

    async def run_fallback(
        self, items: Sequence[tuple[int, float, RootCall]]
    ) -> list[tuple[str, Any]]:
        """Aria's fallback phase for conflicting, local-only roots, after the epoch's commit.

        ``items`` are ``(tid, now, root)`` in increasing tid order. Each runs alone, to
        completion, against the state including the epoch's commits and the earlier
        fallback commits, and its writes are applied before the next one starts — a serial
        execution, so a hot-key chain commits whole in one epoch. The serial order of the
        history is: the epoch's commits, then these in tid order (another worker's fallback
        transactions touch only its own keys, so they commute with these), then the next
        epoch. Returns, per item, ``("committed", outcome)``, ``("aborted", (type, reason))``
        (a user abort, final: it saw current state) or ``("rerun", outcome)`` when the run
        tried to leave this worker (its writes are discarded; it re-runs next epoch).
        Must not overlap an epoch's execution on this engine.
        """
        results: list[tuple[str, Any]] = []
        self._in_fallback = True
        turn = Turns()  # (local runs never wait: the loop beats its heartbeat meanwhile)
        try:
            for tid, now, root in items:
                await turn()
                self.log = AccessLog()
                self._deviated.clear()
                ok, value = await self.run_root(tid, now, root)
                if tid in self._deviated:
                    results.append(("rerun", (ok, value)))
                elif tid in self.log.user_aborts:
                    results.append(("aborted", self.log.user_aborts[tid]))
                else:
                    self._apply([tid])
                    results.append(("committed", (ok, value)))
        finally:
            self._in_fallback = False
            self._deviated.clear()
            self.log = AccessLog()
        return results

    # -- the cross-worker fallback phase (see _Fallback) -----------------------------------
    @property
    def in_fallback(self) -> bool:
        """Whether the cross-worker fallback phase runs on this engine now."""
        return self._fb is not None

    def begin_fallback(self, tids: set[int]) -> None:
        """After :meth:`commit`: start the cross-worker fallback of ``tids`` (every
        conflicting tid of the epoch, the same set on every engine). Every engine must
        begin it before any re-run starts; calls of the re-runs go through the router."""
        self._fb = _Fallback(self.log, tids)
        self.log = AccessLog()  # the re-runs' buffered writes and aborts

    async def run_fallback_root(
        self, tid: int, now: float, root: RootCall
    ) -> tuple[str, Any]:
        """Re-run root ``tid`` (this engine's) in the fallback phase; ``("committed",
        outcome)``, ``("aborted", (type, reason))`` (a user abort: final, it saw committed
        state) or ``("rerun", outcome)`` (it deviated: next epoch). The caller then calls
        :meth:`finish_fallback` on every engine, committing only the first kind."""
        fb = self._fb
        assert fb is not None, "begin_fallback first"
        ok, value = await self.run_root(tid, now, root)
        if tid in fb.deviated or (not ok and value[0] == DEVIATED):
            return "rerun", (ok, value)
        if tid in self.log.user_aborts:
            return "aborted", self.log.user_aborts[tid]
        if not ok:
            return "aborted", value
        return "committed", (ok, value)

    def finish_fallback(self, tid: int, commit: bool) -> None:
        """Re-run ``tid`` is over: apply its writes here if it commits, then let the
        higher tids waiting for it go on."""
        fb = self._fb
        assert fb is not None
        if commit:
            self._apply([tid])
        self.log.writes.pop(tid, None)
        fb.finish(tid)

    def end_fallback(self) -> None:
        """Every re-run finished on every engine: back to normal execution."""
        self._fb = None
        self.log = AccessLog()

    # -- barrier ---------------------------------------------------------------------------
    def votes(self) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
        """This worker's conflicting tids (→ blockers) and user aborts of the current epoch."""
        return self.log.conflicts(), dict(self.log.user_aborts)

    def commit(
        self, conflicts: Mapping[int, int] | set[int], user_aborts: Mapping[int, object]
    ) -> list[int]:
        """Apply the writes of every tid that wrote here and neither conflicts nor failed.

        One ``write_batch`` per (operator, partition) store. Returns the committed tids that
        wrote here.
        """
        committed = [t for t in self.log.writes if t not in conflicts and t not in user_aborts]
        self._apply(committed)
        return committed

    def _apply(self, tids: list[int]) -> None:
        """Write the buffered writes of ``tids``: one ``write_batch`` per (operator, partition)
        store."""
        for where, ops in self.log.commit_batches(tids, self.partitions).items():
            self.stores[where].write_batch(ops)
            if self.on_record is not None:
                for k, v in ops:
                    if k[:1] == b"\x00":
                        self.on_record(where[0], k.decode(), v)

    def close(self) -> None:
        """Close every store."""
        for store in self.stores.values():
            try:
                store.close()
            except Exception:
                log.exception("closing store failed", extra={"worker": self.index})
