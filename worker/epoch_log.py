"""Writing each epoch's batch to the epoch log (with snapshot rounds on).

The write overlaps the epoch's execution; the report (hence every reply of the epoch,
anywhere) waits until the record is durable. Without the record no reply of the epoch may
leave: a write that fails makes the worker leave the cluster. Records are written only
under the coordinator's lease (``worker.fence``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord, FenceRecord
from worker.clients import KafkaClients, Sent
from worker.fence import FenceLease
from worker.links import CoordinatorLink
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["EpochLogWriter"]


class EpochLogWriter:
    """Writes this worker's batches to the epoch log (see the module docstring)."""

    def __init__(self, state: WorkerState, kafka: KafkaClients, uplink: CoordinatorLink,
                 fence: FenceLease | None = None) -> None:
        self._state = state
        self._kafka = kafka
        self._uplink = uplink
        #: the coordinator's lease on this process: the log is written only under it
        self._fence = fence
        #: the deliveries of the records handed to Kafka and not yet in the log or failed
        self._in_flight: set[asyncio.Future[Any]] = set()
        #: the log offset of this process's newest fence record (-1: none yet), named by
        #: every record sent after it (``sfaas.runtime.epochlog``, "Fences")
        self.fenced_at = -1

    async def send(self, begin: wire.Begin,
                   journals: Mapping[int, dict[str, Any]]) -> Sent | None:
        """Hand epoch ``begin.epoch``'s batch to Kafka (None: nothing to log); ``journals``:
        the world's, as installed at the Begin."""
        st = self._state
        assert st.loop is not None
        if not (st.log_topic and st.loop.batch and not begin.replay):
            return None
        rec = EpochRecord.of(begin.epoch, st.index, begin.now, st.loop.batch, st.generation,
                             self.fenced_at)
        if rec.journals:  # (what the runs see: the journals as installed at the Begin)
            seen = journals
            rec = dataclasses.replace(rec, journals=tuple(
                (tid, seen[tid]) for tid, _ in rec.journals if seen.get(tid)))
        fence = self._fence
        if fence is not None and not fence.valid():
            await fence.held()
        sent = await self._kafka.send(st.log_topic, rec.encode(), 0)
        self._in_flight.add(sent.delivery)
        sent.delivery.add_done_callback(self._in_flight.discard)
        return sent

    async def settle(self) -> None:
        """Wait until every record handed to Kafka is in the log or failed (``Settling``,
        ``worker.needs``). A recovery reads the log after this: a record still in flight
        when the epochs halted must not land after that read — the recovery would not
        replay its epoch and take its requests again as new ones, and a later recovery
        would find the record and run them twice."""
        if self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    async def fence(self, attempt: int) -> int:
        """Write this worker's fence record for recovery ``attempt`` (after :meth:`settle`)
        and wait until it is in the log; returns one past its offset, an end the
        recovery's read must reach. Records this process or an earlier one of its slot
        sent before it and landing after it are void (``sfaas.runtime.epochlog``,
        "Fences"). Raises if it cannot be written (the recovery fails and is retried)."""
        st = self._state
        rec = FenceRecord(st.index, st.generation, attempt)
        if self._fence is not None and not self._fence.valid():
            await self._fence.held_open()  # (a recovery's step: see FenceLease.held_open)
        md = await self._kafka.delivered(await self._kafka.send(st.log_topic, rec.encode(), 0),
                                         self._fence)
        self.fenced_at = md.offset
        return int(md.offset) + 1

    async def durable(self, epoch: int, sent: Sent) -> bool:
        """Wait until the record ``sent`` is in the log; False (the worker leaves the
        cluster): it could not be written."""
        st = self._state
        try:
            # (a stuck producer is replaced and the record sent again: the broker took
            # none of it, and a copy that did land twice replays once — worker.clients)
            md = await self._kafka.delivered(sent, self._fence)
        except Exception as exc:
            # without the record no reply of this epoch may leave: stop loudly
            log.error("writing epoch %d to the epoch log failed: %s; leaving the cluster",
                      epoch, exc, extra={"worker": st.index})
            self._uplink.close()
            return False
        st.logged(md.offset + 1)
        return True
