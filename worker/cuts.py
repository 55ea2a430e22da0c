"""This worker's part of a snapshot round, taken at the Commit that carries its marker.

No transaction is in flight then, so the stores and positions are a consistent cut: the
ingress positions (``WorkerState.cut``), the direct requests waiting (written to the epoch
log as a ``CutRecord``), the replies' offsets; the stores freeze there and upload while
epochs go on (``worker.protocols.rounds``). The round's report waits until every reply
made so far is acknowledged — a round holding a request must never need its reply again,
a recovery could not reproduce it — and until the direct requests' cut is in the log.
"""

from __future__ import annotations

import asyncio
import logging

from sfaas.runtime import wire
from sfaas.runtime.settings import Settings
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.links import CoordinatorLink
from worker.protocols.rounds import RoundTaker
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["RoundCut"]


class RoundCut:
    """Takes this worker's part of each snapshot round (see the module docstring)."""

    def __init__(self, settings: Settings, state: WorkerState, *, rounds: RoundTaker,
                 direct: DirectIngress, egress: Egress, kafka: KafkaClients,
                 uplink: CoordinatorLink) -> None:
        self._settings = settings
        self._state = state
        self._rounds = rounds
        self._direct = direct
        self._egress = egress
        self._kafka = kafka
        self._uplink = uplink

    def take(self, epoch: int, marker: int) -> None:
        """Epoch ``epoch`` committed carrying round ``marker``: no transaction is in flight
        here, so the stores and positions are a consistent cut — take this worker's part."""
        st = self._state
        assert st.engine is not None
        if self._settings.snapshot_interval <= 0:
            log.warning("round %d requested but snapshot rounds are off here", marker)
            self._uplink.send(wire.Snapshotted(
                marker, st.index, epoch, [], {}, {}, {}, [], 0,
                "snapshot rounds are off on this worker (snapshot_interval=0)"))
            return
        cut = st.cut(epoch, dict(self._egress.acked))
        direct = [r.encode() for r in self._direct.cut(marker, epoch)]

        async def durable() -> None:
            # (the round waits until every reply made so far is acknowledged — a round
            # holding a request must never need its reply again, a recovery could not
            # reproduce it — and until the direct requests' cut is in the epoch log)
            acks = [await self._kafka.producer.send(st.log_topic, r, partition=0)
                    for r in direct]
            await self._egress.durable()
            await asyncio.gather(*acks)

        self._rounds.take(marker, cut, st.engine.stores, durable)
