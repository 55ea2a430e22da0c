"""The bulletin: what the members said and what happened to them, passed to those that keep
count of it — the metrics, the snapshot rounds and the ready file.

It fills the membership's port :class:`~coordinator.needs.MemberEvents`, and the ports
:class:`~coordinator.needs.Changes` (the standbys', a rescale's) and
:class:`~coordinator.needs.Recoveries` (the recovery's), so each of those parts names one
collaborator for all of them, and each event goes to its part through a method named here,
not a closure.
"""

from __future__ import annotations

from typing import Any

from coordinator.needs import Counts, ReadyWriter, RoundReports
from coordinator.state import Member
from sfaas.runtime import wire

__all__ = ["Bulletin"]


class Bulletin:
    """Fills :class:`~coordinator.needs.MemberEvents`, :class:`~coordinator.needs.Changes`
    and :class:`~coordinator.needs.Recoveries` (see the module docstring)."""

    def __init__(self, metrics: Counts, rounds: RoundReports, ready_file: ReadyWriter) -> None:
        self._metrics = metrics
        self._rounds = rounds
        self._ready_file = ready_file

    def heartbeat(self, m: Member, beat: wire.Heartbeat) -> None:
        self._metrics.heartbeat(m, beat)

    def diverged(self, msg: wire.Diverged) -> None:
        self._metrics.diverged(msg)

    def snapshotted(self, msg: wire.Snapshotted) -> None:
        self._rounds.on_report(msg)

    def member_lost(self, why: str) -> None:
        self._rounds.abort(why)

    def changed(self) -> None:
        self._ready_file.write()

    def recovered(self, info: dict[str, Any]) -> None:
        self._metrics.recovered(info)
        self._rounds.recovered(int(info.get("epochs_replayed", 0)))
        self._ready_file.write()
