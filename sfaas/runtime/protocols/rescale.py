"""Rescaling: partitions move between workers, their stores shipped ahead and switched at
a snapshot round (``coordinator.protocols.rescale``, ``worker.protocols.rescale``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from sfaas.runtime.protocols.base import Message
from sfaas.runtime.protocols.membership import Peer
from sfaas.runtime.protocols.rounds import Retry

__all__ = [
    "StoreVersion", "Source", "Scale", "Scaled", "Ship", "Shipped", "Move", "Following",
    "Release", "Released", "Reassign", "Hold",
]


class StoreVersion(NamedTuple):
    """A store's version when shipping began: a receiver is caught up with the store once
    its follower holds that version."""

    operator: str
    partition: int
    version: int


class Source(NamedTuple):
    """A shipping worker: where its stores are followed, and which partitions move."""

    host: str
    port: int  # its replication port
    partitions: list[int]


@dataclass(slots=True)
class Scale(Message):
    """Operator (``sfaas scale``) → coordinator, as the first message on a channel: run
    ``workers`` workers. Answered with :class:`Scaled` once done (or refused)."""

    TAG: ClassVar[int] = 17
    workers: int


@dataclass(slots=True)
class Scaled(Message):
    """Coordinator → operator: the rescale ended (``ok``) or why not (``detail``)."""

    TAG: ClassVar[int] = 18
    ok: bool
    detail: str


@dataclass(slots=True)
class Ship(Message):
    """Coordinator → a worker: ship the stores of ``partitions`` (they are moving away);
    answered with :class:`Shipped`."""

    TAG: ClassVar[int] = 19
    partitions: list[int]


@dataclass(slots=True)
class Shipped(Message):
    """Worker → coordinator: shipping; ``seqs``: the version of each store now."""

    TAG: ClassVar[int] = 23
    index: int
    seqs: list[StoreVersion]


@dataclass(slots=True)
class Move(Message):
    """Coordinator → a receiving worker: follow the stores of the partitions moving to you.
    ``sources``: one per shipping worker; ``seqs`` as in :class:`Shipped`. ``index``: the
    receiver's slot after the move (a joining worker's first message). Answered with
    :class:`Following` once caught up."""

    TAG: ClassVar[int] = 24
    index: int
    n_workers: int
    sources: list[Source]
    seqs: list[StoreVersion]


@dataclass(slots=True)
class Following(Message):
    """Receiver → coordinator: caught up with every moving store (``error``: why not)."""

    TAG: ClassVar[int] = 25
    index: int
    error: str


@dataclass(slots=True)
class Release(Message):
    """Coordinator → every worker, at an epoch boundary right after snapshot round
    ``round`` completed: close the stores and ingress of every partition ``owners`` no
    longer gives you. Answered with :class:`Released`."""

    TAG: ClassVar[int] = 26
    round: int
    owners: list[int]


@dataclass(slots=True)
class Released(Message):
    """Worker → coordinator: the partitions moving away are closed here."""

    TAG: ClassVar[int] = 27
    index: int
    error: str


@dataclass(slots=True)
class Reassign(Message):
    """Coordinator → every worker of the new membership: take over at round ``round``.

    Your slot is ``index`` of ``n_workers`` at ``peers``, the map is ``owners``. For each
    partition you gain, the round's ingress watermark (``ingress``), the completed offsets
    above it (``skip``) and its waiting re-runs (``retries``) say where its requests
    resume; ``handed`` names each gained partition's owner before the switch, whose cut
    records in the epoch log (from offset ``epoch_log``, the round's) hold its direct
    requests' unacknowledged replies and waiting re-runs. Answered with ``Ready``.
    """

    TAG: ClassVar[int] = 28
    round: int
    index: int
    n_workers: int
    peers: list[Peer]
    owners: list[int]
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    retries: list[Retry]
    handed: dict[int, int]
    epoch_log: int


@dataclass(slots=True)
class Hold(Message):
    """Coordinator → receiving workers: round ``round`` is the switch's; stop following
    the moving stores once they hold it (what the old owners write or merge after it will
    not be needed)."""

    TAG: ClassVar[int] = 29
    round: int
