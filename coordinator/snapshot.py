"""A typed, read-only picture of the coordinator at one moment, for those that only look.

The metrics (``coordinator.metrics``), the status page (``coordinator.status``) and the
ready file (``coordinator.ready_file``) read a :class:`ClusterSnapshot`, taken on the event
loop by :func:`take`, instead of the parts themselves: they see plain values, can hold no
reference into a part, and a part can change its insides without them noticing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coordinator.protocols.rescale import Rescaler
from coordinator.protocols.rounds import RoundKeeper, RoundSummary
from coordinator.protocols.standby import Standbys
from coordinator.state import ClusterView, EpochStats
from sfaas.runtime.protocols.rounds import RoundManifest

__all__ = ["ClusterSnapshot", "JoinerView", "MemberView", "RoundsView", "StandbyView", "take"]


@dataclass(frozen=True)
class MemberView:
    """A worker slot. ``promoting``: the standby a lost slot was promoted to ("" if none)."""

    index: int
    name: str
    pid: int
    host: str
    port: int
    alive: bool
    ready: bool
    last_seen: float
    promoting: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class StandbyView:
    """A standby of slot ``of``; ``following``: ``host:port`` it follows ("" before)."""

    of: int
    name: str
    pid: int
    host: str
    following: str


@dataclass(frozen=True)
class JoinerView:
    """A worker waiting to join a rescale."""

    index: int
    name: str
    pid: int
    host: str
    port: int
    last_seen: float


@dataclass(frozen=True)
class RoundsView:
    """The snapshot rounds: counters, the newest complete ones, failures ``(time, round,
    why)`` with the configured secrets blanked out, and the newest manifest."""

    completed: int = 0
    failed: int = 0
    history: tuple[RoundSummary, ...] = ()
    failures: tuple[tuple[float, int, str], ...] = ()
    last_complete: RoundManifest | None = None


@dataclass(frozen=True)
class ClusterSnapshot:
    """See the module docstring. ``slots``: the slots, awaited or formed; ``owners``: the
    partition map in force; ``recoveries``: recovery attempts; ``inbox``: messages waiting
    for the epoch protocols."""

    app: str
    namespace: str
    heartbeat_timeout: float
    owners: tuple[int, ...] = ()
    slots: int = 0
    members: tuple[MemberView, ...] = ()
    standbys: tuple[StandbyView, ...] = ()
    #: standbys per slot, of every slot that had one
    standby_counts: dict[int, int] = field(default_factory=dict)
    promotions: int = 0
    joiners: tuple[JoinerView, ...] = ()
    rescale_target: int | None = None
    last_rescale: dict[str, Any] = field(default_factory=dict)
    stats: EpochStats = field(default_factory=EpochStats)
    recoveries: int = 0
    #: a recovery under way; why recovery stopped retrying ("" : it did not)
    recovering: bool = False
    recovery_stopped: str = ""
    inbox: int = 0
    rounds: RoundsView = field(default_factory=RoundsView)
    #: the Jaeger UI request ids link to (the setting ``jaeger_ui``; empty: no links)
    jaeger_ui: str = ""

    def standbys_of(self, slot: int) -> list[StandbyView]:
        return [sb for sb in self.standbys if sb.of == slot]


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` blanked out."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def take(app: str, namespace: str, heartbeat_timeout: float, secrets: tuple[str, ...],
         state: ClusterView, standbys: Standbys, rescale: Rescaler, rounds: RoundKeeper,
         inbox: int, jaeger_ui: str = "") -> ClusterSnapshot:
    """The snapshot of these parts now (on the event loop that owns them)."""
    s = state.stats
    return ClusterSnapshot(
        app=app, namespace=namespace, heartbeat_timeout=heartbeat_timeout,
        owners=tuple(state.owners), slots=state.slots,
        members=tuple(MemberView(m.index, m.name, m.pid, m.host, m.port, m.alive,
                                 m.ready.is_set(), m.last_seen, standbys.reservation(m.index))
                      for m in state.members),
        standbys=tuple(StandbyView(sb.of, sb.name, sb.pid, sb.host, sb.followed)
                       for sb in standbys.all()),
        standby_counts={slot: len(lst) for slot, lst in standbys.by_slot.items()},
        promotions=standbys.promotions,
        joiners=tuple(JoinerView(j.index, j.name, j.pid, j.host, j.port, j.last_seen)
                      for j in rescale.joiners),
        rescale_target=rescale.target, last_rescale=dict(rescale.last),
        stats=EpochStats(s.epochs, s.txns, s.conflicts), recoveries=state.recoveries,
        recovering=state.recovering,
        recovery_stopped=redact(state.recovery_stopped, secrets), inbox=inbox,
        rounds=RoundsView(rounds.completed, rounds.failed, tuple(rounds.history),
                          tuple((t, r, redact(why, secrets)) for t, r, why in rounds.failures),
                          rounds.last_complete),
        jaeger_ui=jaeger_ui,
    )
