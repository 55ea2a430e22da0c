"""The coordinator's side of direct state reads: tell a client where the partitions are.

A client (``sfaas.reads``) connects to the coordinator's port with the cluster's secret and
sends ``Where``; it gets a ``Placement`` — every worker's address and the partition map —
and may ask again on the same channel when a worker said a partition is not there. While
a recovery or a rescale is under way the placement is empty: the client reads through
Kafka meanwhile (the workers' state is being rolled back or moved).
"""

from __future__ import annotations

import logging

from coordinator.needs import Rescaling
from coordinator.state import ClusterView
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire

log = logging.getLogger("sfaas.coordinator.reads")

__all__ = ["Placements"]

#: Messages one client channel may send before it is dropped unanswered: a client asks
#: again only after a worker turned it away.
MAX_ASKS_PER_FRAME = 16


class Placements:
    """Answers ``Where`` (see the module docstring); ``rescale``: says whether one is under
    way."""

    def __init__(self, state: ClusterView, app: str, rescale: Rescaling) -> None:
        self._state = state
        self._app = app
        self._rescale = rescale
        #: placements answered (for tests and /metrics)
        self.answered = 0

    def placement(self, app: str) -> wire.Placement:
        st = self._state
        if app != self._app or st.recovering or st.recovery_stopped or self._rescale.under_way() \
                or not st.joined or not all(m.alive for m in st.members):
            return wire.Placement([], [])
        return wire.Placement([m.peer for m in st.members], list(st.owners))

    async def serve(self, chan: channels.Channel, first: list[wire.Message]) -> None:
        """Answer this client's ``Where``s until it closes the channel."""
        msgs = first
        while True:
            if len(msgs) > MAX_ASKS_PER_FRAME or not all(isinstance(m, wire.Where) for m in msgs):
                log.warning("client %s sent something other than Where; dropping", chan.peer)
                return
            for m in msgs:
                assert isinstance(m, wire.Where)
                chan.send(self.placement(m.app))
                self.answered += 1
            try:
                msgs = await chan.recv()
            except ChannelClosed:
                return
