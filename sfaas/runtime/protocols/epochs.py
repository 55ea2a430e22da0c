"""The epoch protocol without a lease: the coordinator begins an epoch, every worker reports
its view of it, the coordinator commits it (see ``sfaas.runtime.protocols.lease`` for the
epochs the workers begin and commit themselves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from sfaas.runtime.protocols.base import Message

__all__ = ["Conflict", "Aborted", "Begin", "Report", "Commit", "Wakeup"]


class Conflict(NamedTuple):
    """Transaction ``tid`` conflicted: it re-runs after ``blocker`` (the highest tid it
    read from or wrote over)."""

    tid: int
    blocker: int


class Aborted(NamedTuple):
    """Transaction ``tid`` aborted itself (or failed): the error's type and reason."""

    tid: int
    error_type: str
    reason: str


@dataclass(slots=True)
class Begin(Message):
    """Coordinator → workers: run epoch ``epoch``.

    ``marker``: unused on Begin (rounds ride ``Commit.marker``). ``replay``: re-run the
    epoch from the epoch log (each worker's batch as logged) during a recovery.
    """

    TAG: ClassVar[int] = 4
    epoch: int
    now: float
    marker: int | None = None
    replay: bool = False


@dataclass(slots=True)
class Report(Message):
    """Worker → coordinator (and, under an ``EpochLease``, → every peer): my view of epoch
    ``epoch`` (sent when my roots finished, and again after every call I served later,
    *before* its result goes back).

    ``sent[j]``/``served[j]`` count calls this worker sent to / finished serving for worker
    ``j`` this epoch. The epoch's execution is over when every worker reported and, for all
    pairs, ``sent_i[j] == served_j[i]``: then no call is in flight anywhere, and the latest
    reports hold every conflict. This saves the round trip of a separate vote phase.
    """

    TAG: ClassVar[int] = 5
    epoch: int
    index: int
    roots: int  # root transactions this worker ran this epoch
    conflicts: list[Conflict]
    aborts: list[Aborted]
    sent: list[int]
    served: list[int]
    pending: int  # requests waiting for a later epoch
    run: int = 0  # the leased run it belongs to (``EpochLease.run``); 0: not leased


@dataclass(slots=True)
class Commit(Message):
    """Coordinator → workers: the union of the reports' conflicts and aborts; commit the rest.

    ``idle``: no worker reported waiting work (the next epoch starts on a Wakeup).
    """

    TAG: ClassVar[int] = 8
    epoch: int
    conflicts: list[Conflict]
    aborts: list[Aborted]
    idle: bool
    marker: int | None = None


@dataclass(slots=True)
class Wakeup(Message):
    """Worker → coordinator: I have work though I last reported none."""

    TAG: ClassVar[int] = 9
    index: int
