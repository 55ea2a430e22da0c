"""A worker's commit of an epoch: apply, the fallback phase, the replies, a round's cut.

``Commit n`` (the coordinator's, or the lease's merge of every worker's report): apply the
surviving writes (one ``write_batch`` per operator store); run the *fallback phase*
(``worker.protocols.fallback``): every conflicting root of the epoch, on every worker,
re-runs at once against the just-committed state under ordered locks — a key is used by
the re-runs in tid order — so a hot-key chain commits whole, also across workers; the
re-runs that deviated (used a key their first run did not) run again once the phase ended
everywhere, one at a time on their worker, and only those that would leave it are requeued
(``Participant.rerun_deviated``); hand the replies on (``worker.replies``); tell the world
(``worker.world``: effects, actions, timers); and when the Commit carries a snapshot
round's marker, freeze every store there — a consistent cut — that uploads while epochs
go on (``worker.cuts``). The epoch's begin, execution and report are ``worker.epochs``'.
"""

from __future__ import annotations

import time

from sfaas.runtime import tracing, wire
from worker.cuts import RoundCut
from worker.protocols.fallback import CrossFallback
from worker.replies import Replies
from worker.state import WorkerState
from worker.watch import EpochWatch
from worker.world import World

__all__ = ["EpochCommitter"]


class EpochCommitter:
    """Commits this worker's epochs (see the module docstring): the inbox's ``Commits``
    (``worker.needs``) and the lease's."""

    def __init__(self, mode: str, state: WorkerState, *, fallback: CrossFallback,
                 replies: Replies, cut: RoundCut, world: World, watch: EpochWatch) -> None:
        #: "cross", "local" or "off": the epochs' fallback phase (``Settings.fallback_phase``)
        self.mode = mode
        self._state = state
        self._fallback = fallback
        self._replies = replies
        self._cut = cut
        self._world = world
        self._watch = watch

    def waits_on_peers(self, msg: wire.Commit) -> bool:
        """Does this Commit's fallback phase wait on peers (so it runs as a task)?"""
        return bool(msg.conflicts) and self.mode == "cross"

    async def commit(self, msg: wire.Commit) -> None:
        """The coordinator's Commit."""
        await self.commit_epoch(msg.epoch, {c.tid: c.blocker for c in msg.conflicts},
                                {a.tid: (a.error_type, a.reason) for a in msg.aborts},
                                msg.marker)

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int],
                           aborts: dict[int, tuple[str, str]], marker: int | None) -> None:
        """Commit epoch ``epoch`` with the merged votes (the coordinator's Commit, or the
        lease's)."""
        st = self._state
        loop = st.loop
        assert loop is not None
        t0 = time.perf_counter()
        self._watch.committing(epoch)
        batch = loop.batch  # (the epoch's, for its spans: settle starts a new list)
        if self.mode == "cross" and conflicts:
            candidates = loop.apply(conflicts, aborts)
            # the epoch's own commits and aborts are final now: their replies leave while
            # the conflicting ones re-run (a replay after a crash reproduces both)
            fates = loop.decided(conflicts, aborts)
            self._replies.reply(fates)
            phase_ns = time.time_ns() if tracing.ON else 0
            fb = await self._fallback.run(epoch, loop, candidates, set(conflicts))
            ended_ns = time.time_ns() if phase_ns else 0
            await loop.rerun_deviated(fb)  # (the phase ended everywhere: alone, in tid order)
            if phase_ns:
                self._watch.phase(epoch, phase_ns, ended_ns)
            late = loop.settle(conflicts, aborts, fb, decided_done=True)
            self._replies.reply(late)
            fates += late
        else:
            fates = await loop.commit(conflicts, aborts)
            self._replies.reply(fates)
        self._watch.committed(epoch, fates, answered=st.answered, started=t0,
                              replay=st.replaying, index=st.index, batch=batch,
                              conflicts=conflicts, recovery=st.recovery)
        self._world.committed(fates, st.replaying)
        if marker is not None:
            self._cut.take(epoch, marker)
