"""Standbys: a registered standby follows a primary's stores and takes its slot when it
dies (``coordinator.protocols.standby``, ``worker.protocols.standby``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sfaas.runtime.protocols.base import Message

__all__ = ["Follow", "Promote"]


@dataclass(slots=True)
class Follow(Message):
    """Coordinator → a standby: follow the stores of worker ``index`` (of ``n_workers``,
    ``partitions`` partitions), shipped from ``host:port``. Sent again when that primary
    was replaced (a new address)."""

    TAG: ClassVar[int] = 15
    index: int
    n_workers: int
    partitions: int
    host: str
    port: int


@dataclass(slots=True)
class Promote(Message):
    """Coordinator → a standby: worker ``index`` died; become it. ``round``: the newest
    complete snapshot round (its files are local: the recovery restores without a
    download)."""

    TAG: ClassVar[int] = 16
    index: int
    round: int
