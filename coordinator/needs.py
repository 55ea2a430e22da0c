"""The coordinator's ports: what each part needs of the others, and no more.

Each part reaches another only through one of these, so it can be built, and read, without
the others' insides, and every event between parts is a method named here (no closure
hides where it goes). Who fills each port (``coordinator.service`` wires them):

- the epoch protocols — the eager epoch loop (``coordinator.epochs``), the barrier
  (``coordinator.barrier``), leased runs (``coordinator.protocols.lease``) — need
  :class:`Workers` (the membership), :class:`Markers` (the snapshot rounds) and
  :class:`Switches` (a rescale);
- the listener (``coordinator.listener``) hands each channel to :class:`Registrations`
  (the membership), :class:`ScaleRequests` (a rescale) or :class:`Clients` (the placements);
- the membership (``coordinator.membership``) changes :class:`StandbyRoles` (the
  standbys) and :class:`Joining` (a rescale), and tells :class:`MemberEvents` (the bulletin,
  ``coordinator.bulletin``) what the members said beside the inbox;
- the watchdog (``coordinator.watchdog``) tells :class:`Losses` (the membership) whom it
  lost;
- the placements (``coordinator.protocols.reads``) ask :class:`Rescaling` (a rescale)
  whether one is under way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sfaas.runtime import channels, wire

if TYPE_CHECKING:
    from coordinator.protocols.standby import Standby
    from coordinator.state import Member

__all__ = ["Clients", "EpochObserver", "Joining", "Losses", "Markers", "MemberEvents",
           "Registrations", "Rescaling", "ScaleRequests", "StandbyRoles", "Switches", "Workers"]

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


# -- the listener's ---------------------------------------------------------------------------
class Registrations(Protocol):
    """The membership, as a worker's channel reaches it."""

    async def register(self, reg: wire.Register, chan: channels.Channel) -> None:
        """Serve the channel of a worker that sent ``reg`` until it closes."""


class ScaleRequests(Protocol):
    """A rescale, as an ``sfaas scale`` channel reaches it."""

    async def request(self, msg: wire.Scale, chan: channels.Channel) -> None:
        """Serve the channel that sent ``msg``: answer once the target is reached."""


class Clients(Protocol):
    """The placements, as a client's channel for direct reads reaches them."""

    async def serve(self, chan: channels.Channel, first: list[wire.Message]) -> None:
        """Answer the client's ``Where``s (``first`` the first frame's) until it closes."""


# -- the membership's --------------------------------------------------------------------------
class StandbyRoles(Protocol):
    """The standbys, as registrations and losses change them."""

    def slot_for(self, reg: wire.Register) -> int | None: ...
    def add(self, reg: wire.Register, chan: channels.Channel, slot: int) -> Standby: ...
    def remove(self, sb: Standby) -> None: ...
    def reserved_for(self, slot: int) -> str | None: ...
    def registered(self, slot: int, name: str) -> None: ...
    def feed(self, slot: int) -> None: ...
    def promote(self, slot: int) -> bool: ...


class Joining(Protocol):
    """A rescale, as registrations and losses reach it."""

    def wants_joiner(self) -> bool: ...
    def add_joiner(self, m: Member) -> None: ...
    def is_joiner(self, m: Member) -> bool: ...
    def lost(self, m: Member) -> None: ...
    def abandon(self, why: str) -> None: ...
    def on_message(self, msg: wire.Message) -> None: ...
    def joining(self) -> list[Member]: ...


class MemberEvents(Protocol):
    """What the membership tells the rest of the coordinator beside the inbox (the epoch
    protocols' reports and recovery answers go there)."""

    def heartbeat(self, m: Member, beat: wire.Heartbeat) -> None:
        """Member ``m`` sent ``beat`` (its latency counts)."""

    def diverged(self, msg: wire.Diverged) -> None:
        """A member's replay answered a request otherwise than before a crash."""

    def snapshotted(self, msg: wire.Snapshotted) -> None:
        """A member's report of a snapshot round."""

    def member_lost(self, why: str) -> None:
        """A member was lost: the round in flight cannot complete."""

    def changed(self) -> None:
        """The membership or the standbys changed (the ready file says so)."""

    def recovered(self, info: dict[str, Any]) -> None:
        """A recovery finished (``ClusterState.last_recovery``)."""


class Losses(Protocol):
    """The membership, as the watchdog loses a member."""

    def lose(self, m: Member, why: str) -> None:
        """Member ``m`` is gone: stop the epochs and recover."""


# -- the placements' ---------------------------------------------------------------------------
class Rescaling(Protocol):
    """A rescale, as the placements ask whether one is under way."""

    def under_way(self) -> bool: ...
