"""The worker's ports: what each part needs of the others, and no more.

Each part reaches another only through one of these, so it can be built, and read, without
the others' insides, and every event between parts is a method named here: no closure
hides where it goes (the run-time loops — a reply acknowledged completes its request in
the ingress, work arriving wakes the epochs, a peer's call reports the epoch again — are
these ports, filled once the parts exist). Who fills each (``worker.service`` wires them;
``worker.replication.Opened``, which that module needs of ``worker.startup.Stores``, lives
beside its user so that this module imports no part):

=======================  ===============================  ========================================
port                     needed by                        filled by
=======================  ===============================  ========================================
:class:`WorkArrived`     ingress, direct ingress, world   ``EpochRunner`` (``worker.epochs``)
:class:`Completions`     egress, replies                  ``Ingress`` (``worker.ingress``)
:class:`HeldReads`       world                            ``Ingress``
:class:`PeerSends`       world, fallback                  ``PeerLinks`` (``worker.links``)
:class:`Spawner`         peers, fallback, inbox           ``Tasks`` (``worker.tasks``)
:class:`Room`            fallback                         ``PeerCalls`` (``worker.calls``)
:class:`CallsSeen`       fallback                         ``World`` (``worker.world``)
:class:`Votes`           peers                            ``EpochRunner``
:class:`Commits`         inbox                            ``EpochCommitter`` (``worker.commits``)
:class:`Directions`      inbox                            ``Worker`` (``worker.service``)
:class:`Halting`         quiescer                         ``PeerCalls``
:class:`LeaseEnd`        quiescer, departures             ``EpochLeaseHolder`` (the lease)
:class:`Quiet`           rollback, the rejoin             ``Quiescer`` (``worker.quiesce``)
:class:`Settling`        quiescer                         ``EpochLogWriter`` (``worker.epoch_log``)
:class:`Fencing`         replay                           ``EpochLogWriter``
:class:`WorldRollback`   rollback, replay                 ``World``
:class:`FencedReplies`   replay                           ``Egress`` (``worker.egress``)
:class:`Standbys`        rescale                          ``Replication`` (``worker.replication``)
:class:`Rescaled`        rescale                          ``Departures`` (``worker.quiesce``)
:class:`Latency`         heartbeat                        ``WorkerMetrics`` (``worker.metrics``)
:class:`SlowView`        heartbeat                        ``SlowRequests`` (``worker.slowest``)
:class:`Divergences`     replies                          ``WorkerMetrics``
:class:`EngineStarter`   stores (start-up)                ``Worker``
=======================  ===============================  ========================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from sfaas.runtime import wire

if TYPE_CHECKING:
    from sfaas.runtime.epochlog import CutRecord
    from sfaas.runtime.state import PartitionStores
    from sfaas.runtime.txn.engine import Engine
    from worker.replication import Shipping

__all__ = ["FencedReplies", "CallsSeen", "Commits", "Completions", "Directions", "Divergences",
           "EngineStarter", "Halting", "HeldReads", "Latency", "LeaseEnd", "PeerSends", "Quiet",
           "Settling", "Fencing",
           "Rescaled", "Room", "SlowView", "Spawner", "Standbys", "Votes", "WorkArrived",
           "WorldRollback"]


# -- work and replies --------------------------------------------------------------------------
class WorkArrived(Protocol):
    """The epochs, as the parts that queue work wake them."""

    def work_arrived(self) -> None:
        """Requests were queued: begin an epoch for them (leased), or wake the coordinator."""


class Completions(Protocol):
    """The ingress, as a request's reply is acknowledged."""

    def complete(self, partition: int, offset: int) -> None:
        """The request read at ``partition``:``offset`` is done (its offset may commit)."""


class HeldReads(Protocol):
    """The ingress, as the world opens the state to reads."""

    def answer_held_reads(self) -> None:
        """State reads may be answered now: answer those held until then."""


# -- peers and tasks ---------------------------------------------------------------------------
class PeerSends(Protocol):
    """The peer links, as a part sends to the other workers."""

    def send_all(self, msg: wire.Message) -> None: ...
    def send_to(self, index: int, msg: wire.Message) -> None: ...


class Spawner(Protocol):
    """The worker's tasks a recovery cancels."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]: ...
    def add(self, task: asyncio.Future[Any]) -> None: ...

    def cancel(self) -> list[asyncio.Future[Any]]:
        """Cancel every task running; returns them (to wait for)."""


class Room(Protocol):
    """The peers, as the fallback phase frees room for calls held."""

    def room(self) -> None:
        """Calls held for an epoch not begun may be taken again."""


class CallsSeen(Protocol):
    """The world, as the fallback phase serves a peer's call."""

    def on_call(self, msg: wire.Call) -> None:
        """A peer's call (its journal's effects are known here from now on)."""


class Votes(Protocol):
    """The epochs, as a call served or a peer's leased run reaches them."""

    def report(self) -> None:
        """Report this worker's votes of the current epoch again."""

    def leased(self, msg: wire.Report | wire.Wake) -> None:
        """A peer's Report or Wake of a leased run (``worker.protocols.lease``)."""


# -- following the coordinator -----------------------------------------------------------------
class Commits(Protocol):
    """The epochs, as the inbox hands them a Commit."""

    async def commit(self, msg: wire.Commit) -> None: ...

    def waits_on_peers(self, msg: wire.Commit) -> bool:
        """Does this Commit's fallback phase wait on peers (so it runs as a task)?"""


class Directions(Protocol):
    """What acts on the coordinator's messages but Commits."""

    async def handle(self, msg: wire.Message) -> bool:
        """Act on ``msg``; False: stop following."""


# -- recovery and rescale ----------------------------------------------------------------------
class Quiet(Protocol):
    """Stopping every execution, as a recovery or a rejoin starts from a quiet worker."""

    async def quiesce(self, replies: bool = True) -> None:
        """Stop ingest and executions; wait until the replies made are acknowledged
        (``replies=False``: do not wait for them — a rejoin, whose lease they need)."""


class WorldRollback(Protocol):
    """The world, as a recovery rolls the stores back and restores them."""

    def recovering(self) -> None:
        """The stores go back to a round: stop acting, follow the replay."""

    def restored(self) -> None:
        """The stores are back at the round (the replay follows)."""


class FencedReplies(Protocol):
    """The egress, as a recovery bounds its read of the replies already out."""

    async def fence(self, partitions: Iterable[int]) -> dict[int, int]:
        """Egress partition → the offset of a fence record written there now (aborted)."""


class Standbys(Protocol):
    """The replication server, as a rescale ships stores (None: no server here)."""

    @property
    def shipping(self) -> Shipping | None: ...


class Rescaled(Protocol):
    """What a rescale tells the rest of the worker."""

    def lease_over(self) -> None:
        """The epochs' lease is over: the next run begins under the new membership."""

    def moved(self) -> None:
        """Stores arrived or left: the world indexes its timers and actions again."""

    def dropped(self, rids: list[str]) -> None:
        """The direct requests ``rids`` of partitions leaving were dropped."""

    def arriving(self) -> None:
        """A joining worker: no direct request is taken until :meth:`arrived`."""

    def arrived(self, cuts: list[CutRecord], gained: set[int]) -> None:
        """The partitions ``gained`` arrived with their previous owners' ``cuts`` of the
        switch's round: their direct requests' replies and waiting re-runs."""


class LeaseEnd(Protocol):
    """The epochs' lease, as a recovery or a rescale ends it."""

    def end_lease(self) -> None:
        """No epoch begins on its own any more."""


class Settling(Protocol):
    """The epoch log, as a recovery starts from a quiet worker."""

    async def settle(self) -> None:
        """Wait until every record handed to Kafka is in the log or failed."""


class Fencing(Protocol):
    """The epoch log, as a recovery reads it (``sfaas.runtime.epochlog``, "Fences")."""

    async def fence(self, attempt: int) -> int:
        """Write this worker's fence for recovery ``attempt``; one past its offset."""


class Halting(Protocol):
    """The epochs' executions and calls, as a recovery stops them."""

    async def halt(self) -> None:
        """Cancel every execution and call in flight; forget the fallback's held messages."""


# -- the metrics' ------------------------------------------------------------------------------
class Latency(Protocol):
    """The metrics, as a heartbeat carries the latencies and logs the requests' ages."""

    def heartbeat_latency(self) -> list[int]: ...
    def mean_age(self) -> float | None: ...
    def reset_ages(self) -> None: ...


class SlowView(Protocol):
    """The slowest and aborted requests of the last minute, as a heartbeat carries them."""

    def fresh(self, wall: float) -> list[wire.SlowRequest] | None: ...


class Divergences(Protocol):
    """The metrics, as a replay diverges."""

    divergences_total: int


# -- the start-up's ----------------------------------------------------------------------------
class EngineStarter(Protocol):
    """The worker, as its stores open: the engine and the parts attached to it."""

    def start_engine(self, stores: PartitionStores) -> Engine: ...
