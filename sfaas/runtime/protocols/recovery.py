"""Recovery: every worker rolls back to a snapshot round, then the epochs logged after it
are replayed (``coordinator.protocols.recovery``, ``worker.protocols.recovery``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from sfaas.runtime.protocols.base import Message
from sfaas.runtime.protocols.membership import Peer

__all__ = ["Diverged", "LoggedEpoch", "PeerBroken", "Recover", "Recovered", "ReplayLogged",
           "Replayed"]


class LoggedEpoch(NamedTuple):
    """An epoch of the epoch log after the round, with the ``now`` it ran with."""

    epoch: int
    now: float


@dataclass(slots=True)
class Recover(Message):
    """Coordinator → every worker: roll back to snapshot round ``round`` (0: the empty
    state before any round) and prepare to replay the epoch log after it.

    ``peers``: the current membership (a replaced worker has a new address). ``attempt``
    numbers recoveries, so a report of an abandoned one is recognised. ``manifest``: the
    round's manifest as the coordinator published it (``RoundManifest.encode``), so the
    workers need not read it from MinIO — a MinIO node down made that read take 3 s of a
    recovery (the nemesis, seed 101); None: read it there.
    """

    TAG: ClassVar[int] = 13
    OPTIONAL: ClassVar[int] = 1  # (manifest)
    attempt: int
    round: int
    peers: list[Peer]
    #: the partition map to recover under (it changes with a rescale)
    owners: list[int]
    manifest: bytes | None = None


@dataclass(slots=True)
class Recovered(Message):
    """Worker → coordinator: rolled back for recovery ``attempt``; ``epochs``: the logged
    epochs after the round (to replay in order); ``error``: empty or why this worker could
    not recover (the coordinator then retries); ``permanent``: the error is one a retry
    cannot cure (the stores or the round disagree with this run's configuration, a file is
    corrupt) — the coordinator stops after three identical ones."""

    TAG: ClassVar[int] = 14
    attempt: int
    index: int
    epochs: list[LoggedEpoch]
    error: str
    permanent: bool


@dataclass(slots=True)
class ReplayLogged(Message):
    """Coordinator → every worker, once all answered ``Recovered`` for ``attempt``: replay
    ``epochs`` (every worker's logged epochs after the round, in order) yourselves, as a
    lease (``worker.protocols.lease``): each epoch begins once the one before committed,
    each worker's Report goes to its peers only, and every worker commits an epoch on the
    same reports — the Commit the coordinator would have sent, without its two hops per
    epoch. ``run``: this replay's random id, which its Reports carry."""

    TAG: ClassVar[int] = 38
    attempt: int
    run: int
    epochs: list[LoggedEpoch]


@dataclass(slots=True)
class Replayed(Message):
    """Worker → coordinator: committed every epoch of recovery ``attempt``'s replay, the
    last being ``epoch``; live epochs may begin once every worker said so."""

    TAG: ClassVar[int] = 39
    attempt: int
    index: int
    epoch: int


@dataclass(slots=True)
class PeerBroken(Message):
    """Worker → coordinator: the channel worker ``peer`` (at ``generation``) opened to me
    closed while both of us are members, during the epochs after my recovery ``recovery``.
    What it carried (calls, results, a leased run's reports) may be lost, and an epoch
    waiting for it would wait for ever with every worker alive: the coordinator recovers."""

    TAG: ClassVar[int] = 43
    index: int
    peer: int
    generation: int
    recovery: int


@dataclass(slots=True)
class Diverged(Message):
    """Worker → coordinator: replaying a logged epoch after a recovery gave request ``rid``
    (``operator.function`` on ``key``) another reply than the one already in the egress
    topic (``before``, ``after``: short descriptions) — the function is not deterministic.
    Shown on the status page, counted on /metrics."""

    TAG: ClassVar[int] = 32
    index: int
    rid: str
    operator: str
    function: str
    key: str
    before: str
    after: str
