"""A worker's part of a recovery: roll back to a round, prepare the epoch log's replay.

On ``wire.Recover(attempt, round, peers)`` every worker — survivors and the replacement of
a dead one alike — does the same (global rollback, Styx's way):

1. stop: cancel ingest and every execution in flight, fail calls waiting on peers;
   let replies already handed to Kafka finish (they are correct: deterministic);
2. reconnect peers whose address changed (a replaced worker) — an attempt whose
   ``Recover`` is followed by a later one gives up here (:class:`Superseded`, no answer):
   it may name a dead peer the later one replaced; the round's manifest is read meanwhile;
3. restore every store to the round (``restore`` downloads only files the local directory
   lacks; round 0 = the empty state before any round), giving up first the uploads of
   newer rounds (``statestores.snapshots.abandon_uploads``: they will never complete, and a
   MinIO coming back from an outage kept the rollback waiting seconds behind their retries);
4. read the epoch log after the round (``sfaas.runtime.epochlog``) at least up to this
   worker's fence record, written first (a record sent before it and landing after it is
   void: "Fences" there), this worker's ingress from the round's positions, and the
   egress topic from the round's positions, ``read_committed`` (request ids already
   answered: their replies are not produced again; a dead predecessor's open transaction
   was aborted when this slot's producer started, ``worker.egress``) — these reads and
   the stores' restores (a thread each) run at once;
5. rebuild the epoch loop: logged batches wait for their replay epochs; requests the round
   holds are done; the round's waiting re-runs go back to the sequencer with their tids;
   everything else is queued in offset order;
6. seek ingress past what was read, restart ingest, and report ``wire.Recovered`` with the
   logged epochs to replay (the coordinator then has them replayed as a lease:
   ``wire.ReplayLogged``, ``worker.protocols.lease``).

A round's report is sent only once the replies of every request it holds are acknowledged
(``worker.epochs.EpochRunner``), so a rollback never needs a reply it cannot reproduce.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from remotes.manifest import ManifestError
from sfaas.app import App
from sfaas.errors import ConfigError, DiskFailed
from sfaas.runtime import wire
from sfaas.runtime.liveness import Turns
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.rounds import RoundError, RoundManifest, Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import open_stores, rounds_remote
from statestores.errors import (
    BackgroundBusy,
    BackgroundDied,
    LockedError,
    StoreClosedError,
    StoreError,
)
from statestores.snapshots import abandon_uploads, adopt, restore_empty
from worker.links import CoordinatorLink, PeerLinks
from worker.needs import Quiet, WorldRollback
from worker.protocols.replay import Logs, Raw, Replay, direct_items, replay_batch
from worker.protocols.rescale import StoreMoves
from worker.state import WorkerState

if TYPE_CHECKING:
    from statestores import Store

log = logging.getLogger("sfaas.worker.recovery")

T = TypeVar("T")

__all__ = ["Recovery", "RollBack", "Superseded", "check_round_layout", "direct_items", "permanent",
           "replay_batch"]


def _empty_round(partitions: int) -> RoundManifest:
    return RoundManifest(0, 0, 0, partitions, (), {p: 0 for p in range(partitions)}, {}, {}, (), 0)


#: the recovery's three reads (:meth:`worker.protocols.replay.Replay.reads`), as logged
_READS = ("log read", "ingress read", "replies read")


class _Steps:
    """Where a recovery's time went (logged at its end)."""

    def __init__(self) -> None:
        self.took: dict[str, float] = {}
        self.t = time.perf_counter()

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.took[name] = now - self.t
        self.t = now

    async def beside(self, name: str, work: Awaitable[T]) -> T:
        """``work``'s result; its seconds noted as ``name`` (a part running beside others)."""
        t0 = time.perf_counter()
        try:
            return await work
        finally:
            self.took[name] = time.perf_counter() - t0

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.took.items())


class Recovery:
    """This worker's part of each recovery (see the module docstring): the rollback's
    steps 1–3 are :class:`RollBack`'s, the reads and the rebuild (4–6)
    ``worker.protocols.replay.Replay``'s."""

    def __init__(self, settings: Settings, app: App, state: WorkerState, *,
                 uplink: CoordinatorLink, rollback: RollBack, replay: Replay) -> None:
        self._settings = settings
        self._app = app
        self._state = state
        self._uplink = uplink
        self._rollback = rollback
        self._replay = replay
        #: the app's rounds in MinIO (made at the first recovery)
        self._rounds: Rounds | None = None

    async def run(self, msg: wire.Recover) -> None:
        """Recover for ``msg``; answer ``Recovered`` (with the error, if it failed)."""
        st = self._state
        st.recovering(msg.attempt)
        try:
            epochs = await self.recover(msg)
        except Superseded as exc:  # (its answer no longer matters: the coordinator moved on)
            log.warning("recovery %d given up: %s", msg.attempt, exc, extra={"worker": st.index})
            return
        except DiskFailed:
            # (answering the error would have the coordinator retry on the same dead disk for
            # ever: the sim's --disk; a fresh process may find it working again)
            log.critical("recovery %d: this worker's disk failed; leaving", msg.attempt,
                         extra={"worker": st.index})
            raise
        except Exception as exc:
            if self._uplink.closed:  # (FenceLease.held_open: the inbox loop rejoins now)
                log.warning("recovery %d given up: the coordinator's channel closed (%s); "
                            "rejoining", msg.attempt, exc, extra={"worker": st.index})
                return
            log.exception("recovery %d failed", msg.attempt, extra={"worker": st.index})
            error = f"{type(exc).__name__}: {exc}"[:2000]
            self._uplink.send(wire.Recovered(msg.attempt, st.index, [], error, permanent(exc)))
            return
        # (a fenced worker answers nothing, worker.fence; nor one whose coordinator is gone:
        # the inbox then sees its channel closed and rejoins the next one)
        if not await self._uplink.held_unless_closed():
            log.warning("recovery %d done, but the coordinator's channel closed: rejoining",
                        msg.attempt, extra={"worker": st.index})
            return
        self._uplink.send(wire.Recovered(msg.attempt, st.index, epochs, "", False))

    def replayed(self) -> None:
        """The leased replay committed its last epoch: live again."""
        self._replay.replayed()

    async def recover(self, msg: wire.Recover) -> list[wire.LoggedEpoch]:
        """Roll back to round ``msg.round``; returns the logged epochs to replay."""
        st = self._state
        assert st.engine is not None and st.loop is not None
        steps = _Steps()
        reading = asyncio.ensure_future(self._read_round(msg))  # 3. beside 1. and 2.
        try:
            await self._rollback.stop(msg, steps.step)  # 1. stop; 2. peers and the partition map
        except BaseException:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        steps.step("peers")
        m = await reading  # 3. the round
        check_round_layout(m, {k: store.engine for k, store in st.engine.stores.items()},
                           st.partitions)
        steps.step("round")
        raw_log, raw_in, raw_out = await self._stores_and_reads(m, msg.attempt, steps)  # 3., 4.
        steps.step("stores+reads")
        # (the heartbeats go on while the records are decoded and taken: decoding 60,000
        # in one go held the loop past the heartbeat timeout, the coordinator declared the
        # worker lost and started the recovery over — which read as much again, a storm)
        turn = Turns()
        logs = await self._replay.decode(m, raw_log, raw_out, turn)
        await self._replay.rebuild(m, raw_in, logs, turn)  # 5. the epoch loop
        epochs = sorted({(r.epoch, r.now) for r in logs.later})
        self._replay.live(m, raw_in, logs.cuts, bool(epochs))  # 6. live again after the replay
        steps.step("rebuild")
        self._logged(msg, m, epochs, logs, turn, steps)
        return [wire.LoggedEpoch(e, now) for e, now in epochs]

    async def _read_round(self, msg: wire.Recover) -> RoundManifest:
        """Round ``msg.round``'s manifest (round 0: the empty state): the one the
        coordinator sent, else read from MinIO."""
        round_id = msg.round
        if round_id <= 0:
            return _empty_round(self._state.partitions)
        if msg.manifest is not None:
            sent = RoundManifest.decode(msg.manifest, f"the manifest of round {round_id} in "
                                                      f"Recover {msg.attempt}")
            if sent.round != round_id:
                raise RoundError(f"Recover {msg.attempt} names round {round_id} but sent the "
                                 f"manifest of round {sent.round}")
            return sent
        return await asyncio.to_thread(self._rounds_kept().read, round_id)

    def _rounds_kept(self) -> Rounds:
        """The app's rounds, through one remote kept for every recovery: a new remote
        connects and checks its bucket on its first call (0.12 s of a promoted standby's
        recovery on a busy host)."""
        if self._rounds is None:
            self._rounds = Rounds(rounds_remote(self._settings, self._app.name))
        return self._rounds

    async def warm_rounds(self) -> None:
        """Open the rounds' remote now (a standby's: its first act once promoted is a
        recovery, which reads a round); only a head start, so a failure is logged."""
        try:
            await asyncio.to_thread(self._rounds_kept().ids)
        except Exception as exc:
            log.info("could not reach the snapshot rounds ahead of a recovery: %s", exc)

    async def _stores_and_reads(self, m: RoundManifest, attempt: int,
                                steps: _Steps) -> tuple[Raw, Raw, Raw]:
        """Every store back to round ``m`` (threads: file moves, MinIO) while the log after
        the round, this worker's ingress and the replies already out are read; every part
        ends before this returns, failed or not (the first error raised)."""
        out_parts = await self._replay.reply_partitions()
        restores = self._rollback.restores(m, steps.t)
        reads = self._replay.reads(m, out_parts, attempt)
        got = await asyncio.gather(
            restores, *(steps.beside(name, read) for name, read in zip(_READS, reads, strict=True)),
            return_exceptions=True)
        parts = [*(got[0] if isinstance(got[0], list) else [got[0]]), *got[1:]]
        errors = [x for x in parts if isinstance(x, BaseException)]
        if errors:
            raise errors[0]
        steps.took["stores"] = max(cast("list[float]", got[0]), default=0.0)  # (beside the reads)
        raw_log, raw_in, raw_out = cast("list[Raw]", got[1:])
        return raw_log, raw_in, raw_out

    def _logged(self, msg: wire.Recover, m: RoundManifest, epochs: list[tuple[int, float]],
                logs: Logs, turn: Turns, steps: _Steps) -> None:
        loop = self._state.loop
        assert loop is not None
        log.info("recovery %d: rolled back to round %d (epoch %d); %d logged epochs to replay, %d "
                 "requests queued, %d replies already out, %d turns given to the loop (%s)",
                 msg.attempt, m.round, m.epoch, len(epochs), len(loop.queue), len(logs.answered),
                 turn.given, steps, extra={"worker": self._state.index})


class RollBack:
    """Steps 1–3 of a recovery: stop (``quiet``: ingest and executions; ``world``: its
    actions), reconnect the peers, adopt the partition map, and every store back to the
    round."""

    def __init__(self, settings: Settings, app: App, state: WorkerState, *, quiet: Quiet,
                 world: WorldRollback, moving: StoreMoves, links: PeerLinks,
                 newer: Callable[[int], Awaitable[None]]) -> None:
        self._settings = settings
        self._app = app
        self._state = state
        self._quiet = quiet
        self._world = world
        self._moving = moving
        self._links = links
        #: returns once a later attempt's ``Recover`` arrived (``CoordinatorLink.newer_recover``)
        self._newer = newer

    async def stop(self, msg: wire.Recover,
                   stopped: Callable[[str], None] = lambda _: None) -> None:
        """1. stop (then ``stopped("stop")``); 2. peers, and the partition map (a rescale may
        have changed it)."""
        st = self._state
        await self._quiet.quiesce()
        self._world.recovering()
        self._moving.stop()  # a rescale in progress is abandoned (the coordinator starts it over)
        self._moving.resume_merges()
        st.drop_expected()
        stopped("stop")
        self._links.drop_from(len(msg.peers))
        await self._connect(msg)
        await asyncio.to_thread(self._adopt_map, msg.owners)
        st.set_owners(msg.owners, len(msg.peers), msg.peers)

    async def _connect(self, msg: wire.Recover) -> None:
        """2. the peers of ``msg`` — given up (:class:`Superseded`) once a later attempt's
        ``Recover`` arrives. A peer named here may be a dead worker that attempt replaced:
        the coordinator can hear of a peer's closed channel from a survivor before its own
        closes, and the survivor then waited out the links' timeout (3.5 s) for the dead
        address while the next attempt's ``Recover`` waited behind it in the inbox."""
        connect = asyncio.ensure_future(self._links.connect(msg.peers, self._state.index))
        newer = asyncio.ensure_future(self._newer(msg.attempt))
        try:
            await asyncio.wait({connect, newer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (connect, newer):
                t.cancel()
            await asyncio.gather(connect, newer, return_exceptions=True)
        if connect.cancelled():
            raise Superseded(f"recovery {msg.attempt}'s peers were not all reached before a "
                             "later recovery's Recover arrived")
        connect.result()  # (StartAgain: a peer not reached)

    def _adopt_map(self, owners: list[int]) -> None:
        """(a thread) Close the stores of partitions ``owners`` no longer gives this worker,
        open those it now owns (the restore that follows fills them from the round)."""
        st = self._state
        assert st.engine is not None
        mine = set(owned(owners, st.index))
        have = {p for _, p in st.engine.stores}
        gone = have - mine
        self._moving.detach(gone, len(owners)).close()
        if mine - have:
            opened = open_stores(self._settings, self._app, sorted(mine - have), len(owners))
            st.engine.stores.update(opened.items())
            self._moving.ship_to_standbys(opened)  # (the coordinator tells them to follow)
            log.warning("recovery under a new partition map: opened partitions %s, closed %s",
                        sorted(mine - have), sorted(gone), extra={"worker": st.index})

    def restores(self, m: RoundManifest,
                 since: float) -> asyncio.Future[list[float | BaseException]]:
        """3. every store back to round ``m``, a thread each; each one's seconds from
        ``since`` (``perf_counter``) until it was done, or its exception."""
        st = self._state
        assert st.engine is not None
        me = st.index
        # (stores a promotion opened at a snapshot, untouched while no epoch began here: the
        # round's files are in place, and installing them again cost a promoted standby
        # 0.13-0.19 s per store, its loop starved meanwhile; once: the replay writes them)
        opened_at = st.take_opened_at()

        def restore(op: str, p: int, store: Store) -> float:
            """(a thread) Store ``(op, p)`` back to the round; :class:`DiskFailed` if its
            files could not be written (the remote's errors are ``RemoteError``s)."""
            try:
                return restore_one(op, p, store)
            except OSError as exc:
                raise DiskFailed(f"{op}/p{p}: the store's disk failed: "
                                 f"{type(exc).__name__}: {exc}") from exc

        def restore_one(op: str, p: int, store: Store) -> float:
            gave_up = abandon_uploads(store, m.round)
            if m.round > 0:
                info = adopt(store, store.remote, m.round) if opened_at.get((op, p)) == \
                    m.round and store.remote is not None else None
                how = "; adopted as promoted, nothing installed again" if info else ""
                info = info or store.restore(m.round)
                log.info("restored %s/p%d to round %d: %d of %d files downloaded; %d uploads of "
                         "later rounds given up%s", op, p, m.round, info.files_downloaded,
                         info.files_total, gave_up, how, extra={"worker": me})
            elif store.remote is not None:  # no round yet: back to empty, new files
                restore_empty(store, store.remote)  # named above what failed rounds left
            else:
                store.write_batch([(k, None) for k, _ in store.items()])
            return time.perf_counter() - since

        return asyncio.gather(*(asyncio.to_thread(restore, op, p, store)
                                for (op, p), store in st.engine.stores.items()),
                              return_exceptions=True)


class Superseded(Exception):
    """A recovery attempt given up for a later one waiting behind it."""


def permanent(exc: BaseException) -> bool:
    """Whether a failed rollback cannot succeed by trying again: the round or the stores
    disagree with this run's configuration, or a file or manifest is corrupt. A lost
    connection, an unreachable MinIO or a busy background process can."""
    if isinstance(exc, (BackgroundBusy, BackgroundDied, LockedError, StoreClosedError)):
        return False
    return isinstance(exc, (ConfigError, StoreError, ManifestError, RoundError))


def check_round_layout(m: RoundManifest, engines: Mapping[tuple[str, int], str],
                       partitions: int) -> None:
    """Refuse to roll back to round ``m`` when it was taken in another partition count or
    with another engine than this worker's stores (``engines``) — its keys would read as
    absent — naming both."""
    if m.round > 0 and m.partitions != partitions:
        raise ConfigError(
            f"round {m.round} was taken in {m.partitions} partitions; this cluster runs "
            f"{partitions}: its keys would be looked up in the wrong partitions. Use the "
            "partition count the state was written with, or a fresh namespace")
    for cut in m.stores:
        have = engines.get((cut.operator, cut.partition))
        if cut.engine and have is not None and have != cut.engine:
            raise ConfigError(
                f"round {m.round} holds operator {cut.operator!r} (partition "
                f"{cut.partition}) written by engine {cut.engine!r}; this run opens it with "
                f"engine {have!r}. Use the engine the state was written with, or a fresh "
                "namespace")
