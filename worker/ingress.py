"""Ingress: take requests off Kafka at the worker's own pace; reject malformed ones.

**The in-flight limit.** A worker holds at most :data:`IN_FLIGHT_BATCHES` × ``max_batch``
requests at once: taken from Kafka and not yet completed (queued, in an epoch, waiting to
re-run, or with a reply the broker has not acknowledged; see ``sfaas.runtime.txn.offsets``). At
the limit the ingest task stops fetching and sleeps until completions make a batch's room
(:meth:`Ingress.completed` wakes it; no polling), so load beyond what the epochs commit
stays in Kafka instead of in memory, and every queue that holds requests — the ingress
queue, the re-runs, the replies — is bounded by it. A recovery may take more at once (every
request after the snapshot round); ingest then waits until they drain below the limit.

**Admission.** A record that does not decode into a valid request (``wire.Request.decode`` raises
:class:`~sfaas.errors.BadRequest`), or whose reply partition the egress topic lacks, is
*rejected*: logged, counted in ``Worker.rejected`` (``"answered"`` / ``"dropped"``), and,
when it names a request id and a reply partition that exists, answered with a
``BadRequest`` error reply, so its client gets an error instead of a timeout. Like any
request's, its ingress offset completes once that reply is acknowledged; its fate is in
the state at once (it has none), so a snapshot round never replays it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sfaas.errors import BadRequest
from sfaas.runtime import wire

if TYPE_CHECKING:
    from worker.service import Worker

log = logging.getLogger("sfaas.worker")

__all__ = ["admit", "Ingress", "IN_FLIGHT_BATCHES"]

#: A worker's in-flight limit, in batches of ``max_batch`` requests (see module docstring).
IN_FLIGHT_BATCHES = 20


class Ingress:
    """The ingest task of one worker and its in-flight limit (see module docstring)."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.limit = IN_FLIGHT_BATCHES * w.settings.max_batch
        self.room = asyncio.Event()
        #: how often ingest stopped at the limit
        self.stalls = 0

    def completed(self) -> None:
        """A request completed: wake ingest once a batch fits again."""
        w = self.w
        if not self.room.is_set() and w.offsets.in_flight <= self.limit - w.settings.max_batch:
            self.room.set()

    async def run(self) -> None:
        """Take requests until cancelled (``Worker.start_ingest`` / ``pause_ingest``)."""
        from worker.service import _Pending

        w = self.w
        assert w.loop is not None
        while True:
            room = self.limit - w.offsets.in_flight
            if room <= 0:
                self.stalls += 1
                self.room.clear()
                await self.room.wait()
                continue
            data = await w.consumer.getmany(timeout_ms=500, max_records=min(w.settings.max_batch, room))
            got = False
            for tp, records in data.items():
                for rec in records:
                    w.offsets.take(tp.partition, rec.offset)
                    w.applied.take(tp.partition, rec.offset)
                    if w._skip and rec.offset in w._skip.get(tp.partition, ()):
                        # a gained partition: the rescale's round holds it and its reply is out
                        w.complete(tp.partition, rec.offset)
                        w.applied.complete(tp.partition, rec.offset)
                        continue
                    req = admit(w, tp.partition, rec.offset, rec.value)
                    if req is None:  # rejected (and answered, if it could be)
                        continue
                    item = _Pending(req, tp.partition, rec.offset)
                    retry = w._retry_at.pop((tp.partition, rec.offset), None) if w._retry_at else None
                    if retry is None:
                        w.loop.queue.append(item)
                    else:  # a re-run waiting at the rescale's round: it keeps its tid and now
                        tid, item.now = retry
                        w.loop.sequencer.requeue(tid, item)
                    got = True
            if got and w.lease.active:
                w.lease.work_arrived()
            elif got and w._idle_reported:
                w._idle_reported = False
                if not w.coord.closed:
                    w.coord.send(wire.Wakeup(w.index))


def admit(w: Worker, partition: int, offset: int, value: bytes | None) -> wire.Request | None:
    """The request in ingress record ``partition:offset``, or None when it was rejected."""
    try:
        req = wire.Request.decode(value)  # type: ignore[arg-type]
        if req.reply_partition >= w.egress_partitions:
            raise BadRequest(f"request {req.rid}: reply partition {req.reply_partition} does not exist "
                             f"(the egress topic has {w.egress_partitions})")
    except BadRequest as exc:
        _reject(w, partition, offset, value, exc)
        return None
    return req


def _reject(w: Worker, partition: int, offset: int, value: bytes | None, exc: BadRequest) -> None:
    address = wire.reply_address(value) if isinstance(value, bytes) else None
    answer = address is not None and address[1] < w.egress_partitions
    w.rejected["answered" if answer else "dropped"] += 1
    log.warning("rejected the malformed request at ingress %d:%d (%s): %s", partition, offset,
                "answered with an error" if answer else "no reply address to answer", exc.reason,
                extra={"worker": w.index})
    w.applied.complete(partition, offset)
    if address is None or not answer or address[0] in w.answered:
        w.complete(partition, offset)
        return
    rid, reply_partition = address
    w.egress.add(reply_partition, wire.Reply(rid, False, None, "BadRequest", exc.reason).encode(), partition, offset)
