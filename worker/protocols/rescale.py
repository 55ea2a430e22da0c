"""A worker's side of a rescale (see ``coordinator.protocols.rescale``): partitions moving
away and in.

* ``Ship(partitions)``: ship those partitions' stores (``worker.replication``), answer
  ``Shipped`` with each store's version; their merges wait until they leave (a merge
  would ship the state again), at most :data:`MERGE_HOLD` seconds.
* ``Move(index, n, sources, seqs)``: follow every moving store from its old owner into
  ``{home}/moving/{namespace}/{app}/{name}/`` (:class:`statestores.replica.Follower`: the
  old owner's own run files with their indexes, hints; no merge here) until it holds the
  version in ``seqs`` (live files only); answer ``Following``. Flushes keep arriving after
  that, until ``Hold(round)``: each replica stops once it holds the switch's round.
* ``Release(round, owners)`` (epochs paused right after round ``round``): stop ingest of
  the partitions lost, drop their waiting requests and offsets, stop shipping and close
  their stores; answer ``Released``. A worker left with no partition is retiring.
* ``Reassign(round, …)``: promote each replica at the round's snapshot into the
  partition's directory (a rename; only what a replica lacks is downloaded), add the stores,
  and resume each gained partition's ingress at the round's watermark — offsets the round
  holds are skipped, its waiting re-runs keep their tids; answer ``Ready``. With standbys
  the gained stores are shipped to them too (the coordinator tells them to follow).

A joining worker (scale-up) gets ``Move`` as the coordinator's first answer, follows, and
becomes a worker at ``Reassign`` (:func:`join_as_receiver`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition

import statestores
from sfaas.app import App
from sfaas.errors import ChannelClosed, ClusterError
from sfaas.runtime import ports, wire
from sfaas.runtime.epochlog import CutRecord, decode_record
from sfaas.runtime.kafka import read_range
from sfaas.runtime.partitioning import owned
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores, StoreKey, store_engine, store_remote, stores_root
from statestores.replica import Follower, TcpSource
from worker.ingress import Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.needs import Rescaled, Standbys
from worker.replication import store_name
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker.moving")

__all__ = ["StoreMoves", "join_as_receiver", "switch_cuts", "CUTS_PATIENCE", "FOLLOW_TIMEOUT",
           "MERGE_HOLD"]

#: Seconds a receiver may take to catch up with a moving store's version.
FOLLOW_TIMEOUT = 240.0
#: Seconds a store shipped for a move holds its merges at most (the switch comes sooner).
MERGE_HOLD = 60.0
#: Seconds a takeover waits for the switch round's cut records to show in the epoch log.
CUTS_PATIENCE = 10.0


class StoreMoves:
    """The moving stores of one worker (see the module docstring).

    ``standbys``: the worker's replication server (its ``shipping`` None without one);
    ``rescaled``: told when the epochs' lease is over (a new membership begins a new run),
    stores moved, direct requests were dropped (ports of ``worker.needs``).
    """

    def __init__(
        self, settings: Settings, app: App, name: str, secret: str, state: WorkerState, *,
        uplink: CoordinatorLink, links: PeerLinks, ingress: Ingress, standbys: Standbys,
        rescaled: Rescaled,
    ) -> None:
        self._settings = settings
        self._app = app
        self._secret = secret
        self._state = state
        self._uplink = uplink
        self._links = links
        self._ingress = ingress
        self._standbys = standbys
        self._rescaled = rescaled
        self.root = os.path.join(settings.home, "moving", settings.namespace, app.name, name)
        self.followers: dict[StoreKey, Follower] = {}
        self._task: asyncio.Task[None] | None = None
        #: stores shipped for a move: their merges wait until they leave (or the move is off)
        self._merges_held: dict[StoreKey, Callable[[], None]] = {}
        self._unhold: asyncio.TimerHandle | None = None
        #: what the last takeover cost (for logs and the rescale benchmark)
        self.last: dict[str, Any] = {}

    # -- leaving -----------------------------------------------------------------------------
    def ship(self, msg: wire.Ship) -> wire.Shipped:
        shipping = self._standbys.shipping
        if shipping is None:
            raise ClusterError("asked to ship stores, but this worker runs no replication server")
        engine = self._state.engine
        assert engine is not None
        stores = {k: st for k, st in engine.stores.items() if k[1] in set(msg.partitions)}
        for k, st in stores.items():
            if k not in self._merges_held:
                self._merges_held[k] = st.pause_merges()
        if self._unhold is not None:
            self._unhold.cancel()
        # a move that never switches must not leave the stores unmerged for long
        self._unhold = asyncio.get_running_loop().call_later(MERGE_HOLD, self.resume_merges)
        seqs = shipping.attach(stores)
        versions = [wire.StoreVersion(op, p, seq) for (op, p), seq in sorted(seqs.items())]
        return wire.Shipped(self._state.index, versions)

    async def release(self, msg: wire.Release) -> wire.Released:
        """Close the partitions ``msg.owners`` no longer gives this worker."""
        st = self._state
        assert st.engine is not None
        keep = set(owned(msg.owners, st.index))
        lost = sorted({p for _, p in st.engine.stores} - keep)
        if not lost:
            return wire.Released(st.index, "")
        await self._ingress.pause()
        drop = set(lost)
        self._rescaled.dropped(st.drop_waiting(drop))
        self.resume_merges()  # (the stores leaving close next; the others were never held)
        await asyncio.to_thread(self.detach(drop, len(msg.owners)).close)
        st.set_owners(msg.owners)
        self._rescaled.moved()
        if keep:
            await self._ingress.resume({})
        else:
            st.retire()
        log.info("released partitions %s at round %d", lost, msg.round, extra={"worker": st.index})
        return wire.Released(st.index, "")

    def detach(self, partitions: set[int], n_partitions: int) -> PartitionStores:
        """Forget ``partitions`` here — their ingress offsets, shipping and stores (a
        rescale's release, or a recovery under a new map); returns the stores to close."""
        st = self._state
        assert st.engine is not None
        st.forget(partitions)
        keys = [k for k in st.engine.stores if k[1] in partitions]
        shipping = self._standbys.shipping
        if shipping is not None:
            shipping.detach(keys)
        return PartitionStores({k: st.engine.stores.pop(k) for k in keys}, n_partitions)

    # -- arriving ------------------------------------------------------------------------------
    def follow(self, msg: wire.Move) -> None:
        """Start following (in the background) and answer ``Following`` when caught up."""
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._follow(msg), name="moving-follow")

    async def _follow(self, msg: wire.Move) -> None:
        try:
            await asyncio.to_thread(self._open, msg)
            error = ""
        except Exception as exc:
            log.exception("following the moving stores failed", extra={"worker": msg.index})
            error = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            self._uplink.send(wire.Following(msg.index, error))
        except ChannelClosed:
            pass

    def _open(self, msg: wire.Move) -> None:
        """(a thread) Follow every moving store; wait until each holds its version."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        seqs = {(str(op), int(p)): int(seq) for op, p, seq in msg.seqs}
        for host, port, parts in msg.sources:
            for p in parts:
                for op in self._app.operators:
                    engine, opts = store_engine(self._app, op, self._settings.store)
                    source = TcpSource(host, port, store_name(op, p), self._secret)
                    # promoted at a round still to come: the old owner's newest snapshot is
                    # not needed
                    self.followers[(op, p)] = statestores.follow(
                        engine, os.path.join(self.root, op, f"p{p}"), source, live_only=True,
                        **opts)
        clock = ports.current().clock
        t0 = clock.monotonic()
        for key, fol in self.followers.items():
            fol.wait(seq=seqs.get(key, 0), timeout=FOLLOW_TIMEOUT)
        got = sum(f.stats()["bytes_received"] for f in self.followers.values())
        log.info("following %d moving stores: caught up in %.2f s, %.1f MB received",
                 len(self.followers), clock.monotonic() - t0, got / 1e6,
                 extra={"worker": msg.index})

    def hold(self, msg: wire.Hold) -> None:
        """The switch is at round ``msg.round``: each replica stops once it holds it."""
        for fol in list(self.followers.values()):
            fol.stop_at(msg.round)

    def resume_merges(self) -> None:
        """Let the stores held by :meth:`ship` merge again."""
        if self._unhold is not None:
            self._unhold.cancel()
            self._unhold = None
        held, self._merges_held = self._merges_held, {}
        for resume in held.values():
            resume()

    def stop(self) -> None:
        """Stop following (an abandoned rescale, or a recovery)."""
        for fol in self.followers.values():
            fol.close()
        self.followers.clear()

    def take_over(self, round_id: int, index: int, partitions: int) -> PartitionStores:
        """(a thread) Each replica becomes its partition's store at round ``round_id``."""
        s, app = self._settings, self._app
        stores: dict[StoreKey, statestores.Store] = {}
        received = downloaded = held_bytes = 0
        t0 = ports.current().clock.monotonic()
        try:
            for (op, p), fol in list(self.followers.items()):
                received += fol.stats()["bytes_received"]
                held = fol.snapshots()
                store = fol.promote(round_id if round_id in held else None,
                                    directory=os.path.join(stores_root(s, app.name), op, f"p{p}"))
                del self.followers[(op, p)]
                store.remote = store_remote(s, app.name, op, p)
                stores[(op, p)] = store
                held_bytes += sum(os.path.getsize(os.path.join(store.directory, e.name))
                                  for e in store.version()[1])
                if round_id not in held:  # it fell behind: the round's files from MinIO
                    log.warning("the replica of %s/p%d lacks round %d (holds %s): restoring it", op,
                                p, round_id, held, extra={"worker": index})
                    info = store.restore(round_id)
                    downloaded += info.bytes_downloaded
        except BaseException:
            PartitionStores(stores, partitions).close()
            raise
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
        self.last = {"stores": len(stores), "bytes_received": received,
                     "bytes_downloaded": downloaded, "bytes_held": held_bytes}
        if stores:
            log.info("took over %d stores at round %d: %d bytes shipped, %d bytes in their files, "
                     "%d bytes downloaded (%.3f s)", len(stores), round_id, received, held_bytes,
                     downloaded, ports.current().clock.monotonic() - t0, extra={"worker": index})
        return PartitionStores(stores, partitions)

    async def reassign(self, msg: wire.Reassign) -> None:
        """A live worker's ``Reassign``: take over the gained partitions, resume."""
        st = self._state
        assert st.engine is not None
        self._rescaled.lease_over()  # the next run begins under the new membership
        gained = await asyncio.to_thread(self.take_over, msg.round, msg.index, len(msg.owners))
        cuts = await switch_cuts(self._settings, self._app.name, msg)
        st.engine.stores.update(gained.items())
        self.ship_to_standbys(gained)
        # (the map and the previous owners' replies in one turn of the loop: a client's
        # copy of a request they committed never finds the partition here without its reply)
        st.set_owners(msg.owners, msg.n_workers, msg.peers)
        self._rescaled.arrived(cuts, set(msg.handed))
        self._rescaled.moved()
        self._links.drop_from(msg.n_workers)
        await self._links.connect(msg.peers, st.index)
        await self._ingress.pause()
        await self._ingress.resume(msg.ingress, msg.skip, msg.retries)
        self._uplink.send(wire.Ready(st.index))

    def arriving(self) -> None:
        """A joining worker takes no direct request until :meth:`arrive`."""
        self._rescaled.arriving()

    async def arrive(self, msg: wire.Reassign) -> None:
        """A joining worker's takeover, its epoch loop running: the gained partitions'
        direct replies and re-runs from the switch round's cut."""
        cuts = await switch_cuts(self._settings, self._app.name, msg)
        self._rescaled.arrived(cuts, set(msg.handed))

    def ship_to_standbys(self, stores: Mapping[StoreKey, statestores.Store]) -> None:
        """Stores this worker gained under a new map: with standbys, ship them too (the
        coordinator tells the standbys to follow them: a new ``Follow``)."""
        shipping = self._standbys.shipping
        if shipping is not None and self._settings.standbys > 0 and stores:
            shipping.attach(stores)

    def abandon(self) -> None:
        """Stop following and forget the followers (a join that failed)."""
        if self._task is not None:
            self._task.cancel()
        self.stop()


async def switch_cuts(settings: Settings, app_name: str, msg: wire.Reassign) -> list[CutRecord]:
    """The cut records of the switch's round that the gained partitions' previous owners
    (``msg.handed``) wrote to the epoch log: their direct requests' replies not yet
    acknowledged and waiting re-runs. Each previous owner wrote at least one before the
    round was published; a read missing one (a stale leader's short end) is made again,
    for :data:`CUTS_PATIENCE` seconds at most, then :class:`ClusterError` names them."""
    if not msg.handed:
        return []
    tp = TopicPartition(settings.epoch_log_topic(app_name), 0)
    clock = ports.current().clock
    give_up = clock.monotonic() + CUTS_PATIENCE
    while True:
        raw = await read_range(settings.kafka, {tp: msg.epoch_log})
        cuts = [r for o, v in raw[0]
                if isinstance(r := decode_record(v, f"{tp.topic}@{o}"), CutRecord)
                and r.round == msg.round]
        missing = set(msg.handed.values()) - {c.worker for c in cuts}
        if not missing:
            return cuts
        if clock.monotonic() > give_up:
            raise ClusterError(f"the epoch log holds no cut of round {msg.round} by workers "
                               f"{sorted(missing)}, the previous owners of partitions "
                               f"{sorted(p for p, o in msg.handed.items() if o in missing)}")
        await asyncio.sleep(0.2)


async def join_as_receiver(
    mv: StoreMoves, uplink: CoordinatorLink, first: wire.Move,
    on_slot: Callable[[wire.Reassign], None],
) -> tuple[wire.Reassign, PartitionStores]:
    """A joining worker: follow the partitions coming to it until ``Reassign``; returns it
    and the stores taken over. ``on_slot(reassign)`` takes the slot before the takeover:
    the running workers connect at once."""
    mv.arriving()
    mv.follow(first)
    try:
        while True:
            try:
                msgs = await uplink.recv()
            except ChannelClosed:
                raise ClusterError("lost the coordinator while joining") from None
            for msg in msgs:
                if isinstance(msg, wire.Move):
                    mv.follow(msg)
                elif isinstance(msg, wire.Hold):
                    mv.hold(msg)
                elif isinstance(msg, wire.Reassign):
                    # the running workers connect at once: this worker's slot must be known first
                    on_slot(msg)
                    stores = await asyncio.to_thread(mv.take_over, msg.round, msg.index,
                                                     len(msg.owners))
                    return msg, stores
                elif isinstance(msg, wire.Stop):
                    raise ClusterError(f"coordinator stopped this worker while it joined: "
                                       f"{msg.reason}")
                else:  # e.g. a Recover: the cluster rolled back before this worker took over
                    raise ClusterError(f"{type(msg).__name__} while joining: starting over")
    except BaseException:
        mv.abandon()
        raise
