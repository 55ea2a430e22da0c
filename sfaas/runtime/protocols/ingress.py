"""Direct ingress: a trusted client sends requests straight to the worker owning their
key over an authenticated channel and gets each reply on it (``sfaas.direct``,
``worker.direct``), instead of two trips through Kafka each way.

The contract (docs/guide/clients.md, "Direct calls"): a worker answers a request only
once the epoch it ran in is durable in the epoch log; a client resends a request it has
no answer to — same request id — to the partition's owner after a closed channel or a
``NOT_HERE`` answer, and every copy of one request id gets the one reply; the client
acknowledges each reply it got, and a worker keeps a reply nobody acknowledged, through a
snapshot round and a recovery, for ``direct_retention`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sfaas.runtime.protocols.base import Message

__all__ = ["Submit", "Answer", "Acked"]


@dataclass(slots=True)
class Submit(Message):
    """Client → worker: run the request ``request`` (a ``wire.Request`` record, as a Kafka
    producer would write it; its reply partition is not used)."""

    TAG: ClassVar[int] = 40
    request: bytes


@dataclass(slots=True)
class Answer(Message):
    """Worker → client: ``reply`` (a ``wire.Reply`` record) to a submitted request; a
    reply whose ``error_type`` is ``NOT_HERE`` says the worker did not take the request
    (another worker owns the partition, or a recovery or a rescale is under way): ask
    where the partition is and send it again."""

    TAG: ClassVar[int] = 41
    reply: bytes


@dataclass(slots=True)
class Acked(Message):
    """Client → worker: the replies to these request ids arrived (the worker may forget
    them)."""

    TAG: ClassVar[int] = 42
    rids: list[str]
