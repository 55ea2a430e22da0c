"""Admitting ingress records: decode each request; reject — and answer — a malformed one.

A record that does not decode into a valid request (``wire.Request.decode`` raises
:class:`~sfaas.errors.BadRequest`), or whose reply partition the egress topic lacks, is
*rejected*: logged, counted in ``Worker.rejected`` (``"answered"`` / ``"dropped"``), and,
when it names a request id and a reply partition that exists, answered with a
``BadRequest`` error reply, so its client gets an error instead of a timeout. Like any
request's, its ingress offset completes once that reply is acknowledged; its fate is in
the state at once (it has none), so a snapshot round never replays it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sfaas import wire
from sfaas.errors import BadRequest

if TYPE_CHECKING:
    from .service import Worker

log = logging.getLogger("sfaas.worker")

__all__ = ["admit"]


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
        w.offsets.complete(partition, offset)
        return
    rid, reply_partition = address
    reply = wire.Reply(rid, False, None, "BadRequest", exc.reason)
    w._replies.append((reply_partition, reply.encode(), partition, offset))
    w._reply_event.set()
