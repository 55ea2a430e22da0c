"""One worker's side of the cross-worker fallback phase (``sfaas.runtime.txn.engine._Fallback``).

After an epoch's Commit every worker knows the same set of conflicting tids. Each applies
the surviving writes, then begins the phase on its engine (ordered locks over the first
run's read/write sets) and re-runs its own conflicting roots, all at once; their calls
to other workers go as ``wire.Call`` with ``fallback`` set and wait there for their turn.
When a root's re-run is over, its worker applies (or drops) its writes and tells every
peer with ``wire.Finished``, which does the same there and lets the higher tids waiting
for it go on. A worker's phase ends when every tid of the set finished — its own and its
peers' — then it runs its roots that deviated once more, alone on its own keys
(``Participant.rerun_deviated``), and only then does it reply and take the next Begin.

A peer may begin the phase before this worker read its Commit: its fallback calls and
``Finished`` messages for the current epoch wait here until the phase begins; together
with the calls deferred for a later epoch they are bounded by
``worker.calls.DEFERRED_BATCHES`` (the peers' channels are not read meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from sfaas.runtime import tracing, wire
from sfaas.runtime.txn.loop import Participant
from worker.needs import CallsSeen, PeerSends, Room, Spawner
from worker.state import WorkerState
from worker.traces import call_span

log = logging.getLogger("sfaas.worker")

__all__ = ["CrossFallback"]


class CrossFallback:
    """Runs the cross-worker fallback phase of each epoch on one worker (see module docstring).

    ``state``: this worker's slot, engine and recovery count (read); ``links``: to the
    peers; ``tasks``: tasks the worker cancels on recovery; ``world``: told of each call
    served; ``room``: the peers, told when held calls were taken (given here or by
    :meth:`frees_room_in`) — ports of ``worker.needs``.
    """

    def __init__(self, state: WorkerState, links: PeerSends, tasks: Spawner,
                 world: CallsSeen, room: Room | None = None) -> None:
        self._state = state
        self._links = links
        self._tasks = tasks
        self._room_port = room
        self._world = world
        #: the epoch whose phase runs here now (None: none)
        self.epoch: int | None = None
        self._remaining: set[int] = set()
        self._all_done = asyncio.Event()
        #: a peer's calls and Finished messages of an epoch whose phase has not begun here
        self._held: list[wire.Call | wire.Finished] = []
        self.phases = 0

    async def run(
        self, epoch: int, loop: Participant[Any], candidates: Sequence[tuple[int, Any]],
        tids: set[int],
    ) -> dict[int, tuple[str, Any]]:
        """The phase of ``epoch``: re-run ``candidates`` (this worker's conflicting roots);
        return once every tid of ``tids`` (the epoch's conflicting tids) finished everywhere."""
        eng = self._state.engine
        assert eng is not None
        eng.begin_fallback(tids)
        self.epoch = epoch
        self._remaining = set(tids)
        self._all_done = asyncio.Event()
        self.phases += 1
        held, self._held = self._held, []
        try:
            for msg in held:
                self._take(msg)
            if held:
                self._room()
            recovery = self._state.epoch_recovery  # (the epoch's, as its calls')

            async def finish(tid: int, commit: bool) -> None:
                self._finish(tid, commit)
                self._links.send_all(wire.Finished(epoch, self._state.index, tid, commit, recovery))

            out = await loop.run_fallback(candidates, finish)
            if self._remaining:
                await self._all_done.wait()
            return out
        finally:
            self.epoch = None
            eng.end_fallback()

    def frees_room_in(self, peers: Room) -> None:
        """Held calls taken free room in ``peers`` (a loop between parts: ``worker.service``)."""
        self._room_port = peers

    def _room(self) -> None:
        assert self._room_port is not None, "CrossFallback.frees_room_in: not wired"
        self._room_port.room()

    @property
    def held(self) -> int:
        """Peers' messages held for a phase not begun here yet."""
        return len(self._held)

    def reset(self) -> None:
        """Forget what is held (a recovery: those epochs are replayed anew)."""
        self._held = []
        self._room()

    # -- peers' messages --------------------------------------------------------------------------
    def on_call(self, msg: wire.Call) -> None:
        """A peer's fallback call: served once this worker's phase of its epoch runs."""
        self._route(msg)

    def on_finished(self, msg: wire.Finished) -> None:
        """A peer's root finished its re-run."""
        self._route(msg)

    def _route(self, msg: wire.Call | wire.Finished) -> None:
        eng = self._state.engine
        if eng is None or msg.recovery != self._state.recovery:
            return  # from before a recovery this worker went through: its epoch is replayed
        if self.epoch == msg.epoch:
            self._take(msg)
        elif msg.epoch >= eng.epoch:
            self._held.append(msg)  # this worker's Commit of that epoch is still to come
        else:
            log.error("fallback %s for past epoch %d (now %d) from worker %d", type(msg).__name__,
                      msg.epoch, eng.epoch, msg.src)
            if isinstance(msg, wire.Call):
                stale = ["StaleEpoch", "fallback call for a past epoch"]
                self._links.send_to(msg.src, wire.Result(msg.call_id, False, stale))

    def _take(self, msg: wire.Call | wire.Finished) -> None:
        if isinstance(msg, wire.Finished):
            self._finish(msg.tid, msg.committed)
        else:
            self._tasks.spawn(self._serve(msg))

    async def _serve(self, msg: wire.Call) -> None:
        eng = self._state.engine
        assert eng is not None
        self._world.on_call(msg)  # (the transaction's journal)
        start_ns = time.time_ns() if tracing.ON and msg.traceparent is not None else 0
        ok, value = await eng.serve(msg.tid, msg.now, msg.operator, msg.key, msg.function,
                                    msg.args, msg.depth)
        if start_ns:
            call_span(msg, start_ns, ok, value, self._state.index)
        self._links.send_to(msg.src, wire.Result(msg.call_id, ok, value if ok else list(value)))

    def _finish(self, tid: int, commit: bool) -> None:
        eng = self._state.engine
        if tid not in self._remaining or eng is None:
            return
        eng.finish_fallback(tid, commit)
        self._remaining.discard(tid)
        if not self._remaining:
            self._all_done.set()
