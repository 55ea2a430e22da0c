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
    ``partitions`` partitions) — those of the partitions in ``owned``, which the
    coordinator's partition map gives it — shipped from ``host:port``. Sent again when
    that primary was replaced (a new address) or a rescale changed its partitions. An
    empty ``owned`` says the slot is gone (a scale-down retired it): the standby exits
    with ``EXIT_RETIRED``, and its supervisor does not restart it."""

    TAG: ClassVar[int] = 15
    index: int
    n_workers: int
    partitions: int
    owned: list[int]
    host: str
    port: int


@dataclass(slots=True)
class Promote(Message):
    """Coordinator → a standby: worker ``index`` died; become it. ``round``: the newest
    complete snapshot round (its files are local: the recovery restores without a
    download); ``owned``: the slot's partitions by the map in force (the same list a
    ``Follow`` names, unless the primary died before the standby was told a rescale's)."""

    TAG: ClassVar[int] = 16
    index: int
    round: int
    owned: list[int]
