"""A standby worker: follow a primary's partition stores, take its place when it dies.

A worker the coordinator answers with ``wire.Follow`` (it asked with ``--standby-of``, or
the cluster was missing a standby) opens a :class:`statestores.replica.Follower` per
partition store of that primary, under ``{home}/standby/{namespace}/{app}/{name}/``, fed
by the primary's replication server (its replica port's: ``tcp``). The followers install
the primary's own files — no flush, merge or index build here — and hold each snapshot
round's files. A new standby first downloads the newest round's files of each store from
MinIO (``seed``), so its catch-up costs the primary only what changed since that round.

On ``wire.Promote(index, round, owned)`` (the primary died) every follower of the slot's
partitions ``owned`` is promoted to that round's files and moved (a rename) into the
directory the primary's stores use, and the worker registers for the primary's slot;
the recovery that follows restores the round from those local files — nothing is
downloaded — and replays the epoch log. (That restore is why a follower that received
nothing yet — MinIO down while it seeded, its primary dead before shipping a file — is
promoted empty rather than refused: the recovery downloads the whole round into it, as
into a replacement's stores, and the slot need not wait for one.) A new
``Follow`` (the primary was replaced, at another address) re-points the followers; they
resume where they stand and receive only the files they lack.

A standby whose coordinator goes away (killed, paused past its watchdog) keeps its
followers going — they talk to the primary, not the coordinator — and registers with the
coordinator's restart until it answers the same ``Follow`` (:data:`REJOIN_PATIENCE`), as a
primary rejoins with its stores; it used to exit, which deleted its replicas, and its next
process followed from scratch.

``Follow`` names the primary's partitions (the coordinator's map: after a rescale it is
not round robin). A rescale that changes them sends it again: the followers of the
partitions the primary lost are closed and their replicas deleted, those of partitions it
kept go on untouched (same address) and each gained partition gets a new follower, which
seeds from MinIO and then receives the rest from the primary. A ``Follow`` naming no
partition retires the standby (its slot left in a scale-down): it exits with
``EXIT_RETIRED``, which its supervisor does not restart.

A lost primary is not always dead: a paused process (SIGSTOP, a frozen VM) still holds its
store directories' locks, on a machine both share. The promotion does not wait for it —
it would wait as long as the pause lasts: a store whose directory is locked is promoted
where its replica lies, under this standby's directory, which this process then keeps
(the zombie fences itself on waking, ``worker.fence``; the slot's next process restores
the round into the slot's own directory as usual). Such a store outlives its process;
a standby that later starts there deletes it and follows from scratch (``_Standby._follow``),
never while a live process holds it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import statestores
from sfaas.app import App
from sfaas.errors import EXIT_RETIRED, ChannelClosed, ClusterError, StartAgain
from sfaas.runtime import ports, wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import (
    PartitionStores,
    StoreKey,
    open_stores,
    store_engine,
    store_remote,
    stores_root,
)
from statestores.replica import Follower, discard
from worker.links import CoordinatorLink
from worker.replication import store_name

log = logging.getLogger("sfaas.worker.standby")

#: Seconds a standby that lost its coordinator waits for it to come back (and answer its
#: Register with a ``Follow``) before it exits for a fresh start (``worker.membership``'s
#: primaries wait as long).
REJOIN_PATIENCE = 120.0
#: Threads promoting a slot's replicas at once (``Standby.promote``).
PROMOTE_THREADS = 4

__all__ = ["run_standby"]


def _partitions(owned: list[int], partitions: int, what: str) -> list[int]:
    """``owned`` (of a ``Follow`` or ``Promote``, ``what``), checked against the topics'
    ``partitions``."""
    if any(not 0 <= p < partitions for p in owned) or len(set(owned)) != len(owned):
        raise ClusterError(f"{what}: owned partitions {owned} must be distinct and in "
                           f"[0, {partitions})")
    return sorted(owned)


class _Standby:
    def __init__(self, settings: Settings, app: App, name: str, secret: str) -> None:
        self._settings = settings
        self._app = app
        self._secret = secret
        self.root = os.path.join(settings.home, "standby", settings.namespace, app.name, name)
        self.followers: dict[StoreKey, Follower] = {}
        self.follow: wire.Follow | None = None
        #: stores were promoted in place: this process keeps ``root``
        self.kept = False

    @staticmethod
    def _mine(f: wire.Follow) -> list[int]:
        """The partitions ``f`` names (the primary's, by the coordinator's map)."""
        return _partitions(f.owned, f.partitions, f"Follow of worker {f.index}")

    def start(self, f: wire.Follow) -> None:
        """(Re)follow the stores of ``f.index``'s partitions at ``f.host:f.port``: followers
        of partitions it keeps at the same address go on, the others are (re)opened."""
        mine = set(self._mine(f))
        old = self.follow
        if old is not None and old.index != f.index:
            self.stop()
            shutil.rmtree(self.root, ignore_errors=True)  # another primary's stores: start clean
        moved = old is None or (old.host, old.port) != (f.host, f.port)
        app = self._app
        for (op, p), fol in list(self.followers.items()):
            if moved or p not in mine:
                fol.close()
                del self.followers[(op, p)]
            if p not in mine:  # the primary lost it (a rescale): its replica is of no use
                shutil.rmtree(os.path.join(self.root, op, f"p{p}"), ignore_errors=True)
        self.follow = f
        for p in sorted(mine):
            for op in app.operators:
                if (op, p) not in self.followers:
                    self.followers[(op, p)] = self._follow(f, op, p)
        log.info("standby of worker %d: following %d stores of partitions %s at %s:%d", f.index,
                 len(self.followers), sorted(mine), f.host, f.port, extra={"worker": f.index})

    def _follow(self, f: wire.Follow, op: str, p: int) -> Follower:
        """A follower of ``(op, p)``'s store at ``f``'s primary. What an earlier process left
        in its directory and a follower refuses — a store promoted in place (its primary
        was paused) whose process then died, a replica of another engine, a damaged
        ``FOLLOW`` — is deleted and the store followed from scratch: a standby's directory
        is only a cache (a promotion is restored to a round of MinIO's), and refusing it
        would fail every restart. Not while a live store holds it (``LockedError``)."""
        s, app = self._settings, self._app
        engine, opts = store_engine(app, op, s.store)
        where = os.path.join(self.root, op, f"p{p}")

        def follow() -> Follower:
            # a new standby downloads the newest round's files from MinIO first: the
            # primary ships only what changed since (its network and CPU are spared)
            return ports.current().replica.follow(engine, where, (f.host, f.port),
                                                  store_name(op, p), self._secret,
                                                  seed=store_remote(s, app.name, op, p), **opts)

        try:
            return follow()
        except statestores.LockedError:
            raise
        except statestores.StoreError as exc:
            log.warning("standby of worker %d: %s; a leftover of an earlier process: deleting "
                        "it and following %s/p%d from scratch", f.index, exc, op, p,
                        extra={"worker": f.index})
            discard(where)
            return follow()

    def stop(self) -> None:
        for fol in self.followers.values():
            fol.close()
        self.followers.clear()

    def promote(self, msg: wire.Promote) -> PartitionStores:
        """(a thread) Every follower of the slot's partitions (``msg.owned``) becomes its
        store in the primary's directory. Were the partitions followed not the slot's (its
        primary died before this standby was told a rescale's), the others are dropped and
        the missing ones opened in the slot's directory (the recovery restores them)."""
        s, app = self._settings, self._app
        assert self.follow is not None
        wanted = set(_partitions(msg.owned, self.follow.partitions,
                                 f"Promote to worker {msg.index}"))
        stores: dict[StoreKey, statestores.Store] = {}
        opened_at: dict[StoreKey, int] = {}
        try:
            for (op, p), fol in list(self.followers.items()):
                if p not in wanted:
                    fol.close()
                    del self.followers[(op, p)]
            self._promote_all(msg, stores, opened_at)
            missing = sorted(wanted - {p for _op, p in stores})
            if missing:
                log.warning("promoted to worker %d without following its partitions %s (the map "
                            "changed just before its primary died): opening them to restore",
                            msg.index, missing, extra={"worker": msg.index})
                stores.update(open_stores(s, app, missing, self.follow.partitions).items())
        except BaseException:
            PartitionStores(stores, self.follow.partitions).close()
            raise
        return PartitionStores(stores, self.follow.partitions, opened_at)

    def _promote_all(self, msg: wire.Promote, stores: dict[StoreKey, statestores.Store],
                     opened_at: dict[StoreKey, int]) -> None:
        """(a thread) Every follower left promoted into ``stores``, a thread each (their
        renames and syncs wait on the disk: one after the other took 30-80 ms apiece of a
        failover's gap on a busy host); the first failure raised once all ended."""
        chosen = list(self.followers.items())
        if not chosen:
            return
        with ThreadPoolExecutor(min(PROMOTE_THREADS, len(chosen)),
                                thread_name_prefix="promote") as pool:
            got = [(key, pool.submit(self._promote_one, fol, *key, msg)) for key, fol in chosen]
        failed: BaseException | None = None
        for key, fut in got:
            exc = fut.exception()
            if exc is None:
                stores[key], at = fut.result()
                if at == msg.round:
                    opened_at[key] = at
                del self.followers[key]
            elif failed is None:
                failed = exc
        if failed is not None:
            raise failed

    def _promote_one(self, fol: Follower, op: str, p: int,
                     msg: wire.Promote) -> tuple[statestores.Store, int | None]:
        """``(op, p)``'s follower as the slot's store, and the snapshot it was opened at: at
        the round asked if it holds it, else at its newest snapshot, else its newest version
        — the recovery restores the round anyway, downloading what it lacks. A follower
        that installed nothing yet is promoted empty. A failed promotion is logged and
        raised: this process exits, and the coordinator gives the slot to another standby
        or a replacement."""
        s, app = self._settings, self._app
        held = fol.snapshots()
        at = msg.round if msg.round in held else (held[-1] if held else None)
        if at is None and fol.stats()["seq"] == 0:
            log.warning("the replica of %s/p%d holds nothing yet (its seeding from MinIO and "
                        "its primary's stream installed no file; last stream error: %s): "
                        "promoted empty, the recovery downloads round %d", op, p,
                        fol.last_error, msg.round, extra={"worker": msg.index})
        target = os.path.join(stores_root(s, app.name), op, f"p{p}")
        try:
            try:
                store = fol.promote(at, directory=target)
            except statestores.LockedError as exc:
                log.warning("%s; its lost primary may be paused, not dead: promoting %s/p%d "
                            "where its replica lies", exc, op, p, extra={"worker": msg.index})
                store = fol.promote(at)
                self.kept = True
        except Exception as exc:
            log.error("cannot promote the replica of %s/p%d to worker %d (%s): this standby "
                      "exits; the slot goes to another standby or a replacement", op, p,
                      msg.index, exc, extra={"worker": msg.index})
            raise
        # the seeding's remote, if any: its connection is open and its bucket checked (a new
        # one paid both on its first call, in the recovery's restore: 0.1-0.2 s on a busy host)
        store.remote = fol.seed if fol.seed is not None else store_remote(s, app.name, op, p)
        log.info("promoted %s/p%d to snapshot %s (round %d asked), %d files local", op, p, at,
                 msg.round, len(store.version()[1]), extra={"worker": msg.index})
        return store, at


async def _register_again(register: Register, uplink: CoordinatorLink,
                          slot: int) -> list[wire.Message]:
    """The coordinator went away: register with it again (its restart, or the same one
    after a cut) as a standby of ``slot`` holding its replicas (``Register.replicas``) —
    the one it follows, never "any role": a restarted coordinator whose primaries had not
    rejoined yet gave such a registrant their slots, and refused the primaries (the
    ``pauses`` series, seed 3125822761: a 22.78 s gap); after the nemesis' coordinator cut
    the standbys took their lost slots as replacements, left at once and the primaries
    were refused meanwhile (seed 7: 1.5 s of churn) — until it answers ``Follow`` (its
    primary is back) or ``Promote`` (its primary's slot is lost: this standby takes it),
    for up to :data:`REJOIN_PATIENCE` s. A coordinator not back yet, or gone again before
    it answered, is waited for; any other answer ends the standby (``StartAgain``: a fresh
    process registers anew, as before)."""
    log.warning("lost the coordinator while standing by; keeping the replicas and waiting "
                "for it to come back")
    clock = ports.current().clock
    deadline = clock.monotonic() + REJOIN_PATIENCE
    why = "it did not answer"
    while True:
        uplink.close()
        try:
            msgs = await register(slot, True)
            answer = msgs[0] if msgs else None
        except (ClusterError, ChannelClosed, OSError) as exc:
            answer, why = None, str(exc)
        if isinstance(answer, (wire.Follow, wire.Promote)):
            log.info("registered again with the coordinator: %s worker %d",
                     "still a standby of" if isinstance(answer, wire.Follow) else "promoted to",
                     answer.index, extra={"worker": answer.index})
            return msgs
        if answer is not None:
            raise StartAgain("lost the coordinator while standing by; registered again, it "
                             f"answered {type(answer).__name__}")
        if clock.monotonic() >= deadline:
            raise StartAgain(f"lost the coordinator while standing by; {why}")
        await asyncio.sleep(0.2)


def _retire_if_gone(f: wire.Follow) -> None:
    """A ``Follow`` naming no partition: this standby's slot left the cluster (a scale-down);
    the process exits with ``EXIT_RETIRED`` (its supervisor does not restart it)."""
    if not f.owned:
        log.info("the slot this standby followed (worker %d) was retired by a rescale to %d "
                 "workers; exiting with code %d", f.index, f.n_workers, EXIT_RETIRED,
                 extra={"worker": f.index})
        raise SystemExit(EXIT_RETIRED)


#: What registers a standby of the given slot with the (restarted) coordinator again, saying
#: whether it holds replicas of the slot's stores (``Register.replicas``): its answer's
#: messages (a Follow or a Promote, and whatever came in the same frame).
Register = Callable[[int, bool], Awaitable[list[wire.Message]]]


async def run_standby(settings: Settings, app: App, name: str, secret: str, uplink: CoordinatorLink,
                      first: wire.Follow,
                      register: Register | None = None) -> tuple[PartitionStores, int]:
    """Be a standby (``name``) until promoted; returns the promoted stores and the slot to
    take. ``register``: connects ``uplink`` and registers this standby again — a lost
    coordinator is waited for (:func:`_register_again`) with the followers going on, instead
    of the process starting over and its replicas following from scratch."""
    sb = _Standby(settings, app, name, secret)
    _retire_if_gone(first)
    sb.start(first)

    standing = [True]  # (False while registering again: the answer may be a slot)

    async def beat() -> None:
        # the coordinator promotes only a standby it heard from lately (a standby cut off
        # with its primary could not take over)
        while True:
            await asyncio.sleep(settings.heartbeat_timeout / 4)
            if standing[0] and not uplink.closed:
                uplink.send(wire.Heartbeat(-1, 0, [], ports.current().clock.monotonic()))

    beats = asyncio.get_running_loop().create_task(beat(), name="standby-heartbeat")
    try:
        while True:
            try:
                msgs = await uplink.recv()
            except ChannelClosed:
                if register is None:
                    raise StartAgain("lost the coordinator while standing by") from None
                # (a standby's heartbeat on a channel the coordinator took for a worker's —
                # its slot was lost, it answers Assign — is a protocol error there)
                standing[0] = False
                assert sb.follow is not None
                msgs = await _register_again(register, uplink, sb.follow.index)
                standing[0] = True
            for msg in msgs:
                if isinstance(msg, wire.Follow):
                    _retire_if_gone(msg)
                    await asyncio.to_thread(sb.start, msg)
                elif isinstance(msg, wire.Promote):
                    stores = await asyncio.to_thread(sb.promote, msg)
                    return stores, msg.index
                elif isinstance(msg, wire.Stop):
                    raise ClusterError(f"coordinator stopped this standby: {msg.reason}")
    finally:
        beats.cancel()
        sb.stop()
        if not sb.kept:
            shutil.rmtree(sb.root, ignore_errors=True)
