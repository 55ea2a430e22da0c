"""Leased epochs: the workers begin and commit epochs themselves, up to a bound the
coordinator grants (``worker.protocols.lease``, ``coordinator.protocols.lease``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sfaas.runtime.protocols.base import Message

__all__ = ["EpochLease", "Wake"]


@dataclass(slots=True)
class EpochLease(Message):
    """Coordinator → workers: begin and commit epochs up to ``upto`` yourselves (see
    ``worker.protocols.lease``): each worker sends its Reports to its peers too, commits an
    epoch once every peer's report is in and the counters show no call in flight, and
    begins the next unless the reports say the cluster is idle. With ``marker`` set, epoch
    ``upto`` commits with that snapshot round's marker. Leases only grow within a ``run``
    (the coordinator's random id of a leased run, which every leased Report and Wake
    carries: a message from an earlier run — before a recovery, or a restarted
    coordinator — is stale)."""

    TAG: ClassVar[int] = 6
    upto: int
    marker: int | None
    run: int


@dataclass(slots=True)
class Wake(Message):
    """Worker → peers, under a lease: I begin epoch ``epoch`` after an idle commit (work
    arrived, or a round's marker lies ahead); begin it too."""

    TAG: ClassVar[int] = 7
    index: int
    epoch: int
    run: int
