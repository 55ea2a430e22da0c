"""Direct state reads: a client asks the coordinator where the partitions are, then reads
committed state from the worker owning a key over an authenticated channel, instead of two
trips through Kafka (``coordinator.protocols.reads``, ``worker.protocols.reads``,
``sfaas.reads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sfaas.runtime.protocols.base import Message
from sfaas.runtime.protocols.membership import Peer

__all__ = ["Where", "Placement", "Read", "ReadReply", "MOVED", "NOT_HERE"]

#: ``ReadReply.error_type`` of a worker that cannot answer for the partition now (it does
#: not own it, a recovery or a rescale is under way): ask again where it is, or use Kafka.
NOT_HERE = "NotHere"
#: The start of a ``NOT_HERE`` reason for a direct request the worker had taken and gave
#: up when its partition moved (a rescale): the request may still run at the new owner
#: (its waiting re-run moves there), so its client must not send it through Kafka.
MOVED = "the partition moved to another worker"


@dataclass(slots=True)
class Where(Message):
    """Client → coordinator: where are the partitions of ``app``?"""

    TAG: ClassVar[int] = 33
    app: str


@dataclass(slots=True)
class Placement(Message):
    """Coordinator → client: the workers (``peers[i]``: worker ``i``'s address) and the
    partition map (``owners[p]``: the index owning partition ``p``); both empty while a
    recovery or a rescale is under way, or for another app."""

    TAG: ClassVar[int] = 34
    peers: list[Peer]
    owners: list[int]


@dataclass(slots=True)
class Read(Message):
    """Client → worker: read ``key`` of ``operator`` (``key`` empty: scan ``partition``'s
    keys starting with ``prefix``, at most ``limit``). ``id`` pairs the reply."""

    TAG: ClassVar[int] = 35
    id: int
    operator: str
    partition: int
    key: str
    prefix: str
    limit: int


@dataclass(slots=True)
class ReadReply(Message):
    """Worker → client: the value (a get; None: none) or ``[[key, value], ...]`` (a scan),
    or ``error_type`` and ``reason`` (``NOT_HERE``: ask the coordinator again)."""

    TAG: ClassVar[int] = 36
    id: int
    ok: bool
    value: Any
    error_type: str
    reason: str
