"""What the epoch protocols need of the other parts of the coordinator, and no more.

The eager epoch loop (``coordinator.epochs``), the barrier (``coordinator.barrier``) and
leased runs (``coordinator.protocols.lease``) reach the workers, the snapshot rounds and a
rescale only through these: each part can be built, and read, without the others' insides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sfaas.runtime import wire

__all__ = ["EpochObserver", "Markers", "Switches", "Workers"]

#: Told of every committed epoch: seconds waited for work before its Begin, seconds from
#: its Begin until every report was in.
EpochObserver = Callable[[float, float], None]


class Workers(Protocol):
    """The membership, as the epoch protocols talk to it."""

    def broadcast(self, msg: wire.Message) -> None:
        """Send ``msg`` to every member (a closed channel is a loss)."""

    def lose_slot(self, index: int, why: str) -> None:
        """The worker in slot ``index`` broke the protocol: treat it as lost."""


class Markers(Protocol):
    """Snapshot rounds, as the epoch protocols start them."""

    def marker(self, epoch: int, txns: int, force: bool = False) -> int | None:
        """The round id to put on epoch ``epoch``'s Commit (or EpochLease), or None."""


class Switches(Protocol):
    """A rescale, as the epoch protocols switch it in at an epoch boundary."""

    def due(self) -> bool:
        """Should the switch happen at this epoch's end?"""

    def arm(self, round_id: int) -> None:
        """Round ``round_id`` is the switch's."""

    async def switch(self, round_id: int) -> None:
        """Switch the new membership in once round ``round_id`` is published."""


def end_of_epoch(rescale: Switches, rounds: Markers, epoch: int,
                 txns: int) -> tuple[int | None, bool]:
    """The marker for epoch ``epoch``'s end and whether a rescale switches at it (then the
    round is armed as the switch's)."""
    switch = rescale.due()
    marker = rounds.marker(epoch, txns, force=switch)
    switching = switch and marker is not None
    if switching:
        assert marker is not None
        rescale.arm(marker)
    return marker, switching
