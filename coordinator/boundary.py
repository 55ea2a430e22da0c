"""An epoch's end: whether it carries a snapshot round's marker, and a rescale's switch.

Live epochs (``coordinator.epochs``) and leased runs (``coordinator.protocols.lease``) ask
at each epoch's end (or each lease's): a rescale whose receivers caught up switches at the
next marker, so a due switch forces a round now; the round is then armed as the switch's,
and once its Commit is out the epochs wait for :meth:`Boundary.switch`.
"""

from __future__ import annotations

from coordinator.needs import Markers, Switches

__all__ = ["Boundary"]


class Boundary:
    """Fills :class:`~coordinator.needs.EpochEnds` from the snapshot rounds and a rescale."""

    def __init__(self, rounds: Markers, rescale: Switches) -> None:
        self._rounds = rounds
        self._rescale = rescale

    def end(self, epoch: int, txns: int) -> tuple[int | None, bool]:
        """The marker for epoch ``epoch``'s end and whether a rescale switches at it (then
        the round is armed as the switch's)."""
        switch = self._rescale.due()
        marker = self._rounds.marker(epoch, txns, force=switch)
        switching = switch and marker is not None
        if switching:
            assert marker is not None
            self._rescale.arm(marker)
        return marker, switching

    async def switch(self, round_id: int) -> None:
        """No epoch begins until the new membership runs (round ``round_id`` published)."""
        await self._rescale.switch(round_id)
