"""The epoch barrier: wait until an epoch finished executing on every worker.

Each worker reports the epoch's conflicts, user aborts and call counters (``wire.Report``);
when the counters show no call in flight (``execution_finished``) the epoch is over and its
reports go into the ``Commit``. Used by live epochs (``coordinator.epochs``) and by a
recovery's replay when it runs epoch by epoch (``coordinator.protocols.recovery``: after a
leased replay stalled).
"""

from __future__ import annotations

import logging

from coordinator.inbox import Inbox, Interrupted, Lost
from coordinator.needs import Workers
from coordinator.state import ClusterView
from sfaas.runtime import wire
from sfaas.runtime.txn.epochs import execution_finished

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Barrier"]


class Barrier:
    """Takes reports from ``inbox`` for one epoch at a time, one from each of ``state``'s
    members."""

    def __init__(self, inbox: Inbox, state: ClusterView, workers: Workers) -> None:
        self._inbox = inbox
        self._state = state
        self._workers = workers

    async def wait(self, epoch: int) -> list[wire.Report]:
        """Wait until epoch ``epoch`` finished executing everywhere; raises
        :class:`~coordinator.inbox.Interrupted` when a worker is lost meanwhile."""
        n = len(self._state.members)
        latest: dict[int, wire.Report] = {}
        while True:
            msg = await self._inbox.get()
            if isinstance(msg, Lost):
                raise Interrupted(f"a worker was lost during epoch {epoch}")
            if not isinstance(msg, wire.Report):
                log.warning("ignoring %s during epoch %d", type(msg).__name__, epoch)
                continue
            if msg.epoch < epoch:
                log.warning("ignoring a late report of epoch %d from worker %d",
                            msg.epoch, msg.index)
                continue
            if msg.epoch != epoch:  # a worker that runs ahead of the barrier broke the protocol
                self._workers.lose_slot(msg.index, f"protocol error: it reported epoch "
                                                   f"{msg.epoch} during epoch {epoch}")
                continue
            latest[msg.index] = msg
            if execution_finished(n, {i: (r.sent, r.served) for i, r in latest.items()}):
                # in worker order: merge_votes keeps the first abort reported per tid, and a
                # replay (and a leased worker) merges in this order too
                return [latest[i] for i in sorted(latest)]
