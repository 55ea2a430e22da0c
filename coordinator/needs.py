"""The coordinator's ports: what each part needs of the others, and no more.

Each part reaches another only through one of these, so it can be built, and read, without
the others' insides, and every event between parts is a method named here: no closure
hides where it goes. Who fills each (``coordinator.service`` wires them):

========================  ===============================  =================================
port                      needed by                        filled by
========================  ===============================  =================================
:class:`Workers`          epochs, barrier, leased runs     ``Membership``
:class:`EpochEnds`        epochs, leased runs              ``Boundary`` (``coordinator.boundary``)
:class:`Markers`          the boundary                     ``RoundKeeper``
:class:`Switches`         the boundary                     ``Rescaler``
:class:`EpochObserver`    epochs, leased runs              ``CoordinatorMetrics``
:class:`Registrations`    the listener                     ``Membership``
:class:`ScaleRequests`    the listener                     ``Rescaler``
:class:`Clients`          the listener                     ``Placements``
:class:`StandbyRoles`     membership, watchdog             ``Standbys``
:class:`Joining`          membership                       ``Rescaler``
:class:`MemberEvents`     membership                       ``Bulletin`` (``coordinator.bulletin``)
:class:`Changes`          standbys, rescale                ``Bulletin``
:class:`Recoveries`       recovery                         ``Bulletin``
:class:`Losses`           watchdog                         ``Membership``
:class:`Control`          rescale                          ``Coordinator``
:class:`NewestRound`      standbys                         ``RoundKeeper``
:class:`Rescaling`        placements                       ``Rescaler``
:class:`Switched`         snapshot rounds                  ``Rescaler``
:class:`SwitchRounds`     rescale                          ``RoundKeeper``
:class:`RescaledStandbys` rescale                          ``Standbys``
:class:`Counts`           bulletin                         ``CoordinatorMetrics``
:class:`RoundReports`     bulletin                         ``RoundKeeper``
:class:`ReadyWriter`      bulletin                         ``ReadyFile``
========================  ===============================  =================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sfaas.runtime import channels, wire

if TYPE_CHECKING:
    from coordinator.state import Member
    from sfaas.runtime.protocols.rounds import RoundManifest

__all__ = ["Changes", "Clients", "Control", "Counts", "EpochEnds", "EpochObserver", "Joining",
           "Losses", "Markers", "MemberEvents", "NewestRound", "ReadyWriter", "Recoveries",
           "Registrations", "RescaledStandbys", "Rescaling", "RoundReports", "ScaleRequests",
           "StandbyRoles", "SwitchRounds", "Switched", "Switches", "Workers"]


# -- the epoch protocols' ----------------------------------------------------------------------
class Workers(Protocol):
    """The membership, as the epoch protocols talk to it."""

    def broadcast(self, msg: wire.Message) -> None:
        """Send ``msg`` to every member (a closed channel is a loss)."""

    def lose_slot(self, index: int, why: str) -> None:
        """The worker in slot ``index`` broke the protocol: treat it as lost."""


class EpochEnds(Protocol):
    """What an epoch's end carries beside its votes: a snapshot round's marker, and a
    rescale's switch."""

    def end(self, epoch: int, txns: int) -> tuple[int | None, bool]:
        """The marker for epoch ``epoch``'s end (``txns``: transactions run so far) and
        whether a rescale switches at it."""

    async def switch(self, round_id: int) -> None:
        """Switch the new membership in once round ``round_id`` is published."""


class Markers(Protocol):
    """Snapshot rounds, as an epoch's end starts them."""

    def marker(self, epoch: int, txns: int, force: bool = False) -> int | None:
        """The round id to put on epoch ``epoch``'s Commit (or EpochLease), or None."""


class Switches(Protocol):
    """A rescale, as it switches in at an epoch's end."""

    def due(self) -> bool:
        """Should the switch happen at this epoch's end?"""

    def arm(self, round_id: int) -> None:
        """Round ``round_id`` is the switch's."""

    async def switch(self, round_id: int) -> None:
        """Switch the new membership in once round ``round_id`` is published."""


class EpochObserver(Protocol):
    """Told of every committed epoch."""

    def epoch(self, waited: float, executed: float) -> None:
        """``waited``: seconds waited for work before its Begin; ``executed``: seconds from
        its Begin until every report was in."""


# -- the listener's ----------------------------------------------------------------------------
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


# -- the membership's and the watchdog's -------------------------------------------------------
class StandbyRoles(Protocol):
    """The standbys, as registrations, losses and the watchdog change them."""

    def slot_for(self, reg: wire.Register) -> int | None: ...
    async def stand_by(self, reg: wire.Register, chan: channels.Channel, slot: int) -> None: ...
    def reserved_for(self, slot: int) -> str | None: ...
    def registered(self, slot: int, name: str) -> None: ...
    def feed(self, slot: int) -> None: ...
    def promote(self, slot: int) -> bool: ...


class Joining(Protocol):
    """A rescale, as registrations and losses reach it."""

    def wants_joiner(self) -> bool: ...
    def under_way(self) -> bool: ...
    def add_joiner(self, m: Member) -> None: ...
    def is_joiner(self, m: Member) -> bool: ...
    def lost(self, m: Member) -> None: ...
    def abandon(self, why: str) -> None: ...
    def on_message(self, msg: wire.Message) -> None: ...
    def joining(self) -> list[Member]: ...


class Changes(Protocol):
    """Told when what ``sfaas ps`` shows changes (the ready file is written again)."""

    def changed(self) -> None:
        """The membership or the standbys changed."""


class MemberEvents(Changes, Protocol):
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


class Losses(Protocol):
    """The membership, as the watchdog loses a member."""

    def lose(self, m: Member, why: str) -> None:
        """Member ``m`` is gone: stop the epochs and recover."""


# -- the recovery's, the rescale's, the standbys', the placements' -----------------------------
class Recoveries(Protocol):
    """Told of every recovery done."""

    def recovered(self, info: dict[str, Any]) -> None:
        """A recovery finished (``ClusterState.last_recovery``)."""


class Control(Protocol):
    """The epochs, as a rescale hurries or stops them."""

    def wake(self) -> None:
        """Begin an epoch soon even if no worker has work."""

    def force_recovery(self, why: str) -> None:
        """Stop the epochs and recover although no worker was lost."""


class NewestRound(Protocol):
    """The snapshot rounds, as a promotion asks for the round to promote to."""

    async def newest_complete(self, timeout: float = 5.0) -> int:
        """The newest complete round (-1: none), once a manifest being written landed."""


class Switched(Protocol):
    """A rescale, as the snapshot rounds publish its switch's round."""

    def adopt(self, round_id: int) -> None:
        """Round ``round_id``, the switch's, is published: its map is in force now."""


class Rescaling(Protocol):
    """A rescale, as the placements ask whether one is under way."""

    def under_way(self) -> bool: ...


class SwitchRounds(Protocol):
    """The snapshot rounds, as a rescale switches at one."""

    def arm_switch(self, round_id: int, owners: list[int], workers: int,
                   rescale: Switched) -> None: ...

    async def wait_published(self, round_id: int,
                             timeout: float = 60.0) -> RoundManifest | None: ...


class RescaledStandbys(Protocol):
    """The standbys, as a rescale changes the slots they stand by for."""

    def expect(self, slots: int | None) -> None: ...
    def rescaled(self) -> None: ...


# -- the bulletin's ----------------------------------------------------------------------------
class Counts(Protocol):
    """The metrics, as the bulletin tells them."""

    def heartbeat(self, m: Member, msg: wire.Heartbeat) -> None: ...
    def diverged(self, msg: wire.Diverged) -> None: ...
    def recovered(self, info: dict[str, Any]) -> None: ...


class RoundReports(Protocol):
    """The snapshot rounds, as the bulletin tells them."""

    def on_report(self, msg: wire.Snapshotted) -> None: ...
    def abort(self, why: str) -> None: ...
    def recovered(self, epochs_replayed: int) -> None: ...


class ReadyWriter(Protocol):
    """The ready file, as the bulletin has it written again."""

    def write(self) -> None: ...
