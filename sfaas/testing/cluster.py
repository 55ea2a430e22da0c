"""The in-process cluster behind :class:`~sfaas.testing.LocalRunner`: the simulated
workers' engines, the epoch driver, effects, post-commit actions and timers.

Everything here runs on the runner's own event loop, on its thread
(:mod:`sfaas.testing.loop_thread`); :class:`~sfaas.testing.LocalRunner` is the only caller
and validates what users pass before it gets here. (:class:`sfaas.testing.replay.LogReplay`
uses only its engines, effects and timers — never its epoch driver — on its own caller's
loop.) The exceptions: the constructor (before
the thread exists) and :meth:`LocalCluster.now` (a read of two floats).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sfaas.app import App
from sfaas.errors import TransactionAborted, reply_error
from sfaas.runtime.codec import pack, unpack
from sfaas.runtime.partitioning import owner_of_partition
from sfaas.runtime.state import open_partition_stores
from sfaas.runtime.txn import internal
from sfaas.runtime.txn.actions import Actions
from sfaas.runtime.txn.determinism import roots_to_check, second_run
from sfaas.runtime.txn.effects import Effects, effect_scope
from sfaas.runtime.txn.engine import Engine, Outcome, RootCall
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.loop import Fate, Participant, commit_together, merge_votes
from sfaas.runtime.txn.timers import TimerIndex

log = logging.getLogger("sfaas.testing")

__all__ = ["LocalCluster", "Request", "RunnerStats"]

T = TypeVar("T")


@dataclass
class RunnerStats:
    """Counters of a :class:`~sfaas.testing.LocalRunner` since it started."""

    epochs: int = 0
    committed: int = 0
    aborted: int = 0
    reruns: int = 0
    #: runs suspended at a ``ctx.run`` until its effect finished
    suspended: int = 0
    #: ``ctx.run`` effects started, and post-commit actions that returned
    effects: int = 0
    actions: int = 0
    #: timers delivered (their transactions committed or aborted)
    timers: int = 0


@dataclass(frozen=True)
class Request:
    """A user's request, validated, its arguments copied as the wire would."""

    operator: str
    key: str
    function: str
    args: list[Any]
    idempotency_key: str | None = None


@dataclass
class _Item:
    request: RootCall
    #: the caller's future (None for the runtime's own requests: timers, action cleanups)
    future: asyncio.Future[Any] | None
    rid: str = ""
    now: float = 0.0
    attempts: int = 0
    #: the outcomes of its ``ctx.run`` effects so far (``sfaas.runtime.txn.effects``)
    journal: dict[str, Any] = field(default_factory=dict)
    #: the caller's idempotency key (``call(..., idempotency_key=…)``)
    idem: str | None = None


def _request_of(item: _Item) -> RootCall:
    return item.request


class _LocalRouter:
    """Delivers calls to the in-process engine that owns the key (copying like a wire would)."""

    def __init__(self) -> None:
        self.engines: list[Engine] = []

    async def remote_call(
        self, dest: int, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int,
    ) -> Outcome:
        wire_args = unpack(pack(list(args), f"arguments of {operator}.{function}"))
        ok, value = await self.engines[dest].serve(
            tid, now, operator, key, function, wire_args, depth)
        return ok, (unpack(pack(value)) if ok else value)


class LocalCluster:
    """``workers`` simulated workers in one event loop, driving the coordinator's epochs."""

    def __init__(
        self,
        app: App,
        *,
        workers: int,
        partitions: int,
        store: str | None,
        store_options: dict[str, Any] | None,
        directory: str | os.PathLike[str] | None,
        max_batch: int,
        fallback: bool,
        check_determinism: bool,
        effect_timeout: float,
        max_effects: int,
        idempotency_retention: float,
    ) -> None:
        if not isinstance(app, App):
            raise TypeError(f"LocalRunner needs an sfaas.App, got {type(app).__name__}")
        if workers < 1 or partitions < workers:
            raise ValueError(f"need 1 <= workers <= partitions, got workers={workers} "
                             f"partitions={partitions}")
        self.app = app
        self.max_batch = max_batch
        self.fallback = fallback
        self.check_determinism = check_determinism
        self._own_dir = directory is None
        self.directory = (tempfile.mkdtemp(prefix="sfaas-local-") if directory is None
                          else os.fspath(directory))
        self._router = _LocalRouter()
        self.engines: list[Engine] = []
        for i in range(workers):
            mine = [p for p in range(partitions) if owner_of_partition(p, workers) == i]
            stores = open_partition_stores(app, self.directory, mine, partitions,
                                           store=store, store_options=store_options)
            self.engines.append(Engine(app, i, workers, partitions, stores, self._router))
        self._router.engines = self.engines
        #: ``ctx.run`` journals; post-commit actions; one timer index per simulated worker
        self.effects = Effects(self._effect_done, max_effects, effect_timeout)
        self.actions = Actions(self._action_done)
        self.timers = [TimerIndex() for _ in self.engines]
        for eng, timers in zip(self.engines, self.timers, strict=True):
            eng.effects = self.effects
            eng.idempotency_retention = idempotency_retention
            eng.on_record = self._follower(timers)
            timers.load(eng.stores)
        #: seconds ``advance`` moved the clock ahead of the wall clock
        self._offset = 0.0
        self._timer_wake: asyncio.TimerHandle | None = None
        #: one participant of the epoch loop per simulated worker (``sfaas.runtime.txn.loop``)
        self.loops: list[Participant[_Item]] = [
            Participant(eng, Sequencer(i), _request_of, max_batch, fallback=fallback)
            for i, eng in enumerate(self.engines)
        ]
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        #: held by the driver through each epoch: reads between epochs see committed state
        self._epoch = asyncio.Lock()
        self.stats = RunnerStats()
        #: Called after every epoch's commit with ``(epoch, committed tids in serial order)``.
        self.on_epoch_committed: Callable[[int, list[int]], object] | None = None

    def remap(self, owners: list[int]) -> None:
        """Move the partitions' stores between the simulated workers to the map ``owners``
        (``owners[p]``: the worker owning partition ``p``), as a rescale does."""
        if len(owners) != self.engines[0].partitions \
                or not all(0 <= o < len(self.engines) for o in owners):
            raise ValueError(f"a map needs one owner in [0, {len(self.engines)}) per partition, "
                             f"got {owners}")
        stores = {k: st for eng in self.engines for k, st in eng.stores.items()}
        for eng, timers in zip(self.engines, self.timers, strict=True):
            eng.stores = {k: st for k, st in stores.items() if owners[k[1]] == eng.index}
            eng.owners = list(owners)
            timers.load(eng.stores)

    def now(self) -> float:
        """The cluster's clock: the wall clock plus what :meth:`advance` added."""
        return time.time() + self._offset

    # -- the runtime's hooks -------------------------------------------------------------
    def _follower(self, timers: TimerIndex) -> Callable[[str, str, bytes | None], None]:
        def on_record(operator: str, key: str, value: bytes | None) -> None:
            timers.on_record(operator, key, value)
            self.actions.on_record(operator, key, value)
        return on_record

    def _effect_done(self, tid: int, key: str, outcome: Outcome) -> None:
        """An effect finished: journal it; the run it suspended goes on in a coming epoch."""
        for lp in self.loops:
            item = lp.find(tid)
            if item is not None:
                item.journal[key] = outcome
                if lp.resume(tid):
                    assert self._wake is not None
                    self._wake.set()

    def _action_done(self, operator: str, key: str) -> None:
        """A post-commit action returned: delete its record, in a transaction."""
        self.stats.actions += 1
        self._internal(operator, key, internal.ACTION_DONE)

    def _internal(self, operator: str, key: str, function: str,
                  more: Sequence[Any] = ()) -> None:
        """Queue the runtime's own request ``function(key, *more)`` on the owner of ``key``."""
        owner = internal.owner_key(key)
        item = _Item(RootCall(internal.RuntimeCall(operator), owner, function, [key, *more]), None,
                     rid=internal.runtime_rid(function, key))
        self.loops[self.engines[0].owner(operator, owner)].queue.append(item)
        if self._wake is not None:
            self._wake.set()

    # -- what the runner asks (on the cluster's loop) ----------------------------------------
    def _start(self) -> None:
        """Start the epoch driver (the first call); the actions whose records a reopened
        directory holds start too."""
        if self._driver is None:
            self._wake = asyncio.Event()
            self._idle = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())
            for eng in self.engines:
                self.actions.load(eng.stores)
            self._wake.set()  # (timers a reopened directory holds may be due)

    async def call(self, request: Request) -> Any:
        """Run ``request`` as a transaction: its result, or the TransactionAborted."""
        self._start()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        r = request
        item = _Item(RootCall(r.operator, r.key, r.function, r.args), fut, rid=uuid.uuid4().hex,
                     idem=r.idempotency_key)
        self.loops[self.engines[0].owner(r.operator, r.key)].queue.append(item)
        assert self._wake is not None
        self._wake.set()
        return await fut

    async def gather(self, requests: Sequence[Request], return_exceptions: bool) -> list[Any]:
        """Run ``requests`` concurrently: queued in one turn of the loop, so they share
        epochs."""
        return list(await asyncio.gather(*(self.call(r) for r in requests),
                                         return_exceptions=return_exceptions))

    async def between_epochs(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` while no epoch runs (a read sees whole epochs, a remap moves stores
        no epoch uses)."""
        async with self._epoch:
            return fn(*args)

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead and run what is due by then to the end."""
        self._start()
        self._offset += seconds
        await self._settle()

    async def drain(self) -> None:
        """Until nothing is left to do now: no request, effect, action or due timer."""
        self._start()
        while True:
            await self._settle()
            busy = list(self.effects.running.values()) + list(self.actions.running.values())
            if busy:
                await asyncio.gather(*busy, return_exceptions=True)
            elif not self.actions.finishing:
                await self._settle()
                return

    async def _settle(self) -> None:
        """Until the epoch driver is idle with nothing due."""
        assert self._wake is not None and self._idle is not None
        while True:
            self._idle.clear()
            self._wake.set()
            await self._idle.wait()
            if not self._busy():
                return

    def _busy(self) -> bool:
        now = self.now()
        return any(lp.pending for lp in self.loops) or any(t.due(now) for t in self.timers)

    # -- reads (through between_epochs) --------------------------------------------------------
    def state(self, operator: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``operator`` (``default`` if none, or expired)."""
        eng = self.engines[self.engines[0].owner(operator, key)]
        raw = eng.store_of(operator, key).get(key.encode())
        return eng.values.decode(operator, key, raw, self.now(), default)

    def scan(self, operator: str, prefix: str, limit: int) -> list[tuple[str, Any]]:
        """``(key, value)`` of ``operator`` starting with ``prefix``, in key order."""
        from sfaas.runtime.txn.reads import scan_partition

        now = self.now()
        found = [(str(k), v) for eng in self.engines for store in eng.operator_stores(operator)
                 for k, v in scan_partition(store, prefix, limit, eng.values[operator], now)]
        return sorted(found)[:limit]

    def items(self, operator: str) -> dict[str, Any]:
        """Every committed ``key → value`` of ``operator`` (expired ones left out)."""
        out: dict[str, Any] = {}
        now = self.now()
        for eng in self.engines:
            codec = eng.values[operator]
            for store in eng.operator_stores(operator):
                for k, v in store.items():
                    if k[:1] != b"\x00" and codec.live(v, now):  # (not timers, actions)
                        out[k.decode()] = codec.decode(v, now, k.decode())
        return out

    # -- epochs ----------------------------------------------------------------------------
    async def _drive(self) -> None:
        assert self._wake is not None and self._idle is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            # let requests submitted in the same tick join this epoch
            await asyncio.sleep(0)
            while self._busy():
                try:
                    async with self._epoch:
                        await self._run_epoch()
                except Exception:  # a bug in the runtime: fail loudly
                    log.exception("epoch failed")
                    raise
            self._wake_for_timers()
            self._idle.set()

    def _wake_for_timers(self) -> None:
        """Wake the driver when the next timer is due on the wall clock."""
        if self._timer_wake is not None:
            self._timer_wake.cancel()
            self._timer_wake = None
        dues = [d for d in (t.next_due() for t in self.timers) if d is not None]
        if dues and self._wake is not None:
            self._timer_wake = asyncio.get_running_loop().call_later(
                max(0.0, min(dues) - self.now()), self._wake.set)

    async def _run_epoch(self) -> None:
        """One epoch exactly as the cluster runs it: every participant begins and executes
        concurrently, the votes are merged, every participant commits."""
        self.stats.epochs += 1
        epoch = self.stats.epochs
        now = self.now()
        for lp, timers in zip(self.loops, self.timers, strict=True):
            room = self.max_batch - len(lp.queue)
            for operator, key in timers.take_due(now, max(room, 0)):
                lp.queue.append(_Item(
                    RootCall(internal.RuntimeCall(operator), internal.owner_key(key),
                             internal.FIRE_TIMER, [key]),
                    None, rid=internal.runtime_rid(internal.FIRE_TIMER, key)))
        self.effects.begin_epoch()
        for lp in self.loops:
            for tid, item in lp.begin(epoch, now):
                operator, key, function, _ = item.request
                self.effects.begin(tid, item.rid, dict(item.journal), item.idem,
                                   effect_scope(item.rid, str(operator), key, function, item.idem))
        await asyncio.gather(*(lp.execute() for lp in self.loops))
        conflicts, aborts = merge_votes(
            (c.items(), ((t, e, r) for t, (e, r) in u.items()))
            for c, u in (lp.votes() for lp in self.loops)
        )
        if self.check_determinism:
            skip = set(conflicts) | set(aborts)
            roots = [r for lp in self.loops
                     for r in roots_to_check(lp.engine, lp.batch, lp.outcomes, lp.request_of, skip)]
            aborts = {**aborts, **await second_run(self.engines, roots)}
        reruns = sum(lp.reruns for lp in self.loops)
        all_fates = await commit_together(self.loops, conflicts, aborts, self.fallback)
        self.stats.suspended += sum(len(lp.just_parked) for lp in self.loops)
        self.effects.launch()
        self.stats.effects = self.effects.started
        order = self._deliver(all_fates)
        self.stats.reruns += sum(lp.reruns for lp in self.loops) - reruns
        if self.on_epoch_committed is not None:
            self.on_epoch_committed(epoch, order)

    def _deliver(self, all_fates: list[list[Fate[_Item]]]) -> list[int]:
        """Count the epoch's fates and answer their callers; the committed tids in serial
        order: the epoch's commits by tid, the fallback phase's by tid, then each
        participant's deviated roots run alone (``Participant.rerun_deviated``), in tid
        order (theirs commute)."""
        committed: list[int] = []
        in_fallback: list[int] = []
        alone: list[int] = []
        for fates in all_fates:
            alone += sorted(f.tid for f in fates if f.committed and f.alone)
            for f in fates:
                if f.committed:
                    self.stats.committed += 1
                    if not f.alone:
                        (in_fallback if f.fallback else committed).append(f.tid)
                else:
                    self.stats.aborted += 1
                if not f.committed and f.item.idem is not None:
                    self._keep_abort(f)
                fut = f.item.future
                if fut is None:
                    self._runtime_fate(f)
                elif fut.done():
                    pass
                elif f.committed:
                    fut.set_result(f.value)
                else:
                    fut.set_exception(self._error(f.tid, f.value))
        return sorted(committed) + sorted(in_fallback) + alone

    def _keep_abort(self, f: Fate[_Item]) -> None:
        """An idempotent request aborted: keep its abort as its outcome (a transaction)."""
        operator, key, function, _ = f.item.request
        assert f.item.idem is not None
        rkey = internal.idem_key(key, function, f.item.idem)
        self._internal(operator, rkey, internal.IDEM_ABORT, [*f.value, f.item.now])

    def _runtime_fate(self, f: Fate[_Item]) -> None:
        """The fate of a request the runtime made: a timer whose call aborted is delivered
        all the same (its record is dropped, so it never fires again)."""
        operator, _, function, args = f.item.request
        if function != internal.FIRE_TIMER:
            return
        key = args[0]
        self.stats.timers += 1
        if not f.committed:
            log.warning("timer %s: its call aborted: %s", internal.timer_id(operator, key),
                        f.value[1])
            self._internal(operator, key, internal.DROP_TIMER)

    def _error(self, tid: int, value: tuple[str, str]) -> TransactionAborted:
        """The error of an aborted transaction, with the traceback of the function that
        raised it (the engine that ran the function kept it)."""
        exc = reply_error(*value)
        for eng in self.engines:
            text = eng.tracebacks.get((tid, value[1]))
            if text is not None:
                exc.traceback = text
                exc.add_note(f"raised in the transaction's function:\n{text.rstrip()}")
                break
        return exc

    # -- lifecycle -----------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the epoch driver, the effects and the actions; close the stores; remove the
        temporary directory."""
        if self._timer_wake is not None:
            self._timer_wake.cancel()
        if self._driver is not None:
            self._driver.cancel()
        await asyncio.gather(*([self._driver] if self._driver is not None else []),
                             self.effects.close(), self.actions.close(), return_exceptions=True)
        for eng in self.engines:
            eng.close()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
