"""The worker's part in functions touching the world: ``ctx.run`` effects, post-commit
actions and durable timers (``sfaas.runtime.txn.effects``, ``…actions``, ``…timers``).

- **Effects.** A run suspended at an effect is parked by the epoch loop; the effect starts
  once the epoch commits, on the worker whose function called ``ctx.run`` (it holds the
  callable), never during a replay. Its outcome goes to every worker (``wire.EffectDone``):
  the one whose request it is adds it to the request's journal — logged with the request's
  next epoch, carried by its calls to the peers — and lets the run go on.
- **Timers.** Each live epoch, the timers of this worker's partitions due by the epoch's
  ``now`` join its batch as requests the runtime makes (logged whole in the epoch log).
- **Actions.** Each action record applied to a store here runs; a small transaction
  deletes it once it returned.

A recovery stops the actions and forgets nothing else: the stores restored, the timer
index is read again; the replay follows the records without running anything; once it is
over (the first live epoch begins) the actions still recorded start again and the parked
runs go on (they suspend again if their effect has not finished: a worker that ran it
already delivers it again from memory instead of running it twice).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sfaas.runtime import ports, tracing, wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn import internal
from sfaas.runtime.txn.actions import Actions
from sfaas.runtime.txn.effects import Effects, Outcome, effect_scope
from sfaas.runtime.txn.engine import Engine
from sfaas.runtime.txn.loop import Fate
from sfaas.runtime.txn.timers import TimerIndex
from worker.needs import HeldReads, PeerSends, WorkArrived
from worker.state import Pending, WorkerState
from worker.traces import TraceContexts, WorldSpans

log = logging.getLogger("sfaas.worker.world")

__all__ = ["World"]


class World:
    """This worker's effects, actions and timers (see the module docstring).

    ``links``: to every peer; ``arrived``: work was queued (wake the epochs; given here or
    by :meth:`wakes`); ``reads``: the state reads held until the stores caught up (ports
    of ``worker.needs``); ``wall``: the wall clock a timer's due time is read against (the
    process's clock port's ``time``).
    """

    def __init__(self, settings: Settings, state: WorkerState, links: PeerSends,
                 arrived: WorkArrived | None = None, reads: HeldReads | None = None,
                 wall: Callable[[], float] | None = None) -> None:
        self._state = state
        self._wall = wall or ports.current().clock.time
        #: the newest live epoch's ``now`` less this process's wall clock when it began: a
        #: timer's due time is a ``now`` of the cluster's clock (the coordinator's), which
        #: this machine's may be ahead of or behind
        self._skew = 0.0
        self._reads = reads
        self._links = links
        self._arrived = arrived
        self.effects = Effects(self._deliver, settings.max_effects, settings.effect_timeout)
        self._retention = settings.idempotency_retention
        self.actions = Actions(self._action_done)
        self.timers = TimerIndex()
        #: between a recovery's rollback and the end of its replay
        self.replaying = False
        self._wake: asyncio.TimerHandle | None = None
        #: with tracing on: the trace contexts of this epoch's traced transactions
        self.traced = TraceContexts()

    def wakes(self, epochs: WorkArrived) -> None:
        """Work queued here wakes ``epochs`` (a loop between parts: ``worker.service``)."""
        self._arrived = epochs

    def _wake_epochs(self) -> None:
        assert self._arrived is not None, "World.wakes: not wired"
        self._arrived.work_arrived()

    def attach(self, engine: Engine) -> None:
        """The engine is open: follow its records."""
        engine.effects = self.effects
        engine.on_record = self._on_record
        engine.idempotency_retention = self._retention
        self.timers.load(engine.stores)
        if tracing.ON:  # (spans of the effects and actions of traced transactions)
            self.effects.spans = self.actions.spans = WorldSpans(
                self.traced, lambda: self._state.index)

    def start(self) -> None:
        """Running: start the actions the stores hold."""
        self._load_actions()
        self.wake_for_timers()

    def wake_for_timers(self) -> None:
        """Wake the epochs when the next timer is due (an idle cluster runs no epoch)."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        due = self.timers.next_due()
        if due is not None and not self.replaying:
            # (on the cluster's clock as the newest epoch showed it, and a little after:
            # an early wake runs an epoch that fires nothing, and every commit re-arms it
            # 2 ms later, until this machine's clock reaches the due time — or fires late
            # by as much as this machine's clock is behind)
            delay = max(0.002, due - (self._wall() + self._skew) + 0.001)
            self._wake = asyncio.get_running_loop().call_later(delay, self._timer_due)

    def _timer_due(self) -> None:
        self._wake = None
        self._wake_epochs()

    def _on_record(self, operator: str, key: str, value: bytes | None) -> None:
        if tracing.ON:
            self.traced.on_record(key, value)
        self.timers.on_record(operator, key, value)
        self.actions.on_record(operator, key, value)

    def _engine(self) -> Engine:
        eng = self._state.engine
        assert eng is not None
        return eng

    # -- an epoch ---------------------------------------------------------------------------
    def before_begin(self, now: float) -> None:
        """A live epoch begins at ``now``: queue the timers due by then. The first after a
        recovery ends its replay (every worker's: a replayed epoch of another worker may
        still write records here until then)."""
        loop = self._state.loop
        assert loop is not None
        self._skew = now - self._wall()
        if self.replaying:
            self.replay_over()
        if self._state.open_reads() and self._reads is not None:
            self._reads.answer_held_reads()
        if not self.timers.due(now):
            return
        room = max(0, self._state.max_batch - len(loop.queue))
        for operator, key in self.timers.take_due(now, room):
            loop.queue.append(Pending.runtime(operator, internal.owner_key(key),
                                              internal.FIRE_TIMER, [key]))

    def install(self, batch: list[tuple[int, Pending]]) -> None:
        """The epoch's runs see their requests' journals."""
        fx = self.effects
        fx.begin_epoch()
        if tracing.ON:
            self.traced.begin(batch, self._state.recovery)
        for tid, item in batch:
            req = item.request
            fx.begin(tid, req.rid, item.journal, req.idempotency_key,
                     effect_scope(req.rid, str(req.operator), req.key, req.function,
                                  req.idempotency_key))

    def for_call(self, tid: int) -> tuple[str, dict[str, Any]]:
        """What a call of ``tid`` to a peer carries: the prefix of its effect keys (the
        request id, or an idempotent request's scope: ``effects.effect_scope``) and journal."""
        fx = self.effects
        return fx.scopes.get(tid, ""), fx.journals.get(tid, {})

    def trace_of(self, tid: int) -> str | None:
        """With tracing on: the trace context a call of ``tid`` to a peer carries (the
        root request's span, when its trace is sampled), else None."""
        return self.traced.of.get(tid)

    def on_call(self, msg: wire.Call) -> None:
        """A peer's call: its function sees the transaction's journal (and its spans go
        into the root request's trace)."""
        if tracing.ON:
            self.traced.joined(msg)
        if msg.scope:
            self.effects.begin(msg.tid, msg.scope, msg.journal)

    def committed(self, fates: list[Fate[Pending]], replay: bool) -> None:
        """The epoch committed: start the effects it suspended at (not in a replay), redo
        a timer whose call aborted."""
        self.effects.launch(live=not replay)
        for f in fates:
            req = f.item.request
            if not f.committed and req.idempotency_key is not None:
                # an idempotent request aborted: its abort is its outcome from now on
                rkey = internal.idem_key(req.key, req.function, req.idempotency_key)
                self._queue(req.operator, rkey, internal.IDEM_ABORT,
                            [str(f.value[0]), str(f.value[1]), f.item.now])
            if f.committed or not isinstance(req.operator, internal.RuntimeCall):
                continue
            if req.function == internal.FIRE_TIMER:
                key = req.args[0]
                log.warning("timer %s: its call aborted: %s", internal.timer_id(req.operator, key),
                            f.value[1], extra={"worker": self._state.index})
                self._queue(str(req.operator), key, internal.DROP_TIMER)
        self.wake_for_timers()

    # -- effects -----------------------------------------------------------------------------
    def _deliver(self, tid: int, key: str, outcome: Outcome) -> None:
        """An effect finished here: to the worker whose request it is (and everyone)."""
        ok, value = outcome
        msg = wire.EffectDone(self._state.index, tid, key, ok,
                              value if ok else list(value))
        self._links.send_all(msg)
        self.on_effect_done(msg)

    def on_effect_done(self, msg: wire.EffectDone) -> None:
        """An effect finished somewhere: journal it if its request waits here."""
        loop = self._state.loop
        if self.replaying or loop is None:
            return  # (after the replay the run suspends again; it is delivered again)
        item = loop.find(msg.tid)
        if item is None:
            return
        item.journaled(msg.key, [msg.ok, msg.value])
        if loop.resume(msg.tid):
            self._wake_epochs()

    # -- actions ------------------------------------------------------------------------------
    def _action_done(self, operator: str, key: str) -> None:
        self._queue(operator, key, internal.ACTION_DONE)

    def _queue(self, operator: str, key: str, function: str, more: list[Any] | None = None,
               ) -> None:
        loop = self._state.loop
        assert loop is not None
        loop.queue.append(Pending.runtime(operator, internal.owner_key(key), function,
                                          [key, *(more or [])]))
        self._wake_epochs()

    def _load_actions(self) -> None:
        n = self.actions.load(self._engine().stores)
        if n:
            log.info("%d post-commit actions recorded and not done: running them", n,
                     extra={"worker": self._state.index})

    # -- recovery and rescale -------------------------------------------------------------------
    def recovering(self) -> None:
        """A recovery rolls back: stop the actions, follow the replay without acting."""
        self.replaying = True
        self._state.close_reads()  # the stores go back to the round: behind the replies
        self.actions.live = False
        self.actions.stop_all()
        self.effects.begin_epoch()

    def restored(self) -> None:
        """The stores are back at the round: index their timers (the replay follows)."""
        self.timers.load(dict(self._engine().stores))

    def replay_over(self) -> None:
        """Live again (the first live Begin): start the recorded actions, let the parked
        runs go on."""
        self.replaying = False
        self.actions.live = True
        self._load_actions()
        self.wake_for_timers()
        loop = self._state.loop
        assert loop is not None
        parked = list(loop.parked)
        for tid in parked:
            loop.resume(tid)
        if parked:
            self._wake_epochs()

    def moved(self) -> None:
        """Partitions moved in or out (a rescale): follow the stores held now."""
        eng = self._engine()
        self.timers.load(eng.stores)
        self.actions.stop_all()
        self._load_actions()
        self.wake_for_timers()

    async def close(self) -> None:
        """Stop the effects and actions running (a restart runs the actions again)."""
        if self._wake is not None:
            self._wake.cancel()
        await self.effects.close()
        await self.actions.close()

    # -- what /metrics shows ----------------------------------------------------------------------
    def gauges(self) -> dict[str, float]:
        fx, acts = self.effects, self.actions
        loop = self._state.loop
        return {
            "effects_running": len(fx.running),
            "effects_started": fx.started,
            "effects_failed": fx.failed,
            "parked": len(loop.parked) if loop is not None else 0,
            "actions_pending": acts.pending,
            "actions_ran": acts.ran,
            "action_tries_failed": acts.tries_failed,
            "timers": len(self.timers),
            "timers_fired": self.timers.fired,
        }
