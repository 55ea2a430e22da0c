"""The worker process: Kafka ingress, transaction execution, peer calls (``worker.peers``), Kafka egress.

Life of a worker: register with the coordinator, receive its index and the membership,
connect to every peer, assign itself its ingress partitions, then follow the
coordinator's epochs:

``Begin n``   take a bounded batch of requests (re-runs first), give each a tid, run all
              roots concurrently; calls to keys of other workers go over peer channels.
              When my roots are done, ``Report`` my conflicts, user aborts and call
              counters; report again after each call I serve later (see ``wire.Report``)
``Commit n``  apply surviving writes (one ``write_batch`` per operator store); run the
              *fallback phase* (``worker.protocols.fallback``): every conflicting root of the epoch,
              on every worker, re-runs at once against the just-committed state under
              ordered locks — a key is used by the re-runs in tid order — so a hot-key chain
              commits whole, also across workers; requeue the re-runs that deviated (used a
              key their first run did not), produce replies to
              the egress topic, then :meth:`Worker.on_epoch_committed`: when the Commit
              carries a snapshot round's marker, every store is frozen there — a
              consistent cut — and uploads while epochs go on (``worker.protocols.rounds``).

Ingress offsets are committed to the consumer group only up to the lowest request not yet
completed (its reply acknowledged by the broker; see ``sfaas.runtime.txn.offsets``), so a restart
never skips a request that was still waiting to re-run. A second tracker, ``applied``,
completes a request when its fate is in the state (at its epoch's commit): its watermarks
are where a replay from a snapshot must start.

State lives in one store per (operator, owned partition), opened by ``sfaas.runtime.state``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from sfaas.app import App
from sfaas.errors import EXIT_RETIRED, AuthenticationError, ChannelClosed, ClusterError
from sfaas.runtime import channels, wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.partitioning import owned
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores, open_stores
from sfaas.runtime.txn.engine import Engine
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.loop import Fate, Participant
from sfaas.runtime.txn.offsets import OffsetTracker
from worker import membership
from worker.egress import Egress
from worker.ingress import Ingress
from worker.metrics import WorkerMetrics
from worker.peers import Peers
from worker.protocols.fallback import CrossFallback
from worker.protocols.lease import Lease
from worker.protocols.rescale import Moving
from worker.protocols.rounds import RoundTaker
from worker.replication import Shipping

log = logging.getLogger("sfaas.worker")

__all__ = ["Worker", "run_worker"]


def _request_of(item: _Pending) -> tuple[str, str, str, Any]:
    r = item.request
    return r.operator, r.key, r.function, r.args


@dataclass(slots=True)
class _Pending:
    """A request waiting to commit (it may re-run several epochs)."""

    request: wire.Request
    #: ingress partition and offset the request was read from (see ``OffsetTracker``)
    partition: int = -1
    offset: int = -1
    now: float = 0.0
    attempts: int = 0


class Worker:
    """One worker process (see module docstring)."""

    def __init__(self, settings: Settings, app: App, name: str | None = None) -> None:
        self.settings = settings
        self.app = app
        self.name = name or f"worker-{os.getpid()}"
        self.secret = settings.shared_secret()
        self.index = -1
        self.engine: Engine | None = None
        self.peers: dict[int, channels.Channel] = {}
        #: the channel to the coordinator (set by ``membership.join``)
        self.coord: channels.Channel
        self.shipping: Shipping | None = None
        self.producer: Any = None  # Kafka clients, started once the slot is known (see run)
        self.consumer: Any = None
        self.consumer_group = ""  # the group ``consumer`` was started in
        #: the epoch loop's state (queue, batch, re-runs, counters); made once assigned
        self.loop: Participant[_Pending] | None = None
        #: calls to and from peers within an epoch (the engine's router)
        self.calls = Peers(self)
        #: epochs this worker begins and commits itself, under the coordinator's lease
        self.lease = Lease(self)
        self.egress = Egress(self)
        self.ingress = Ingress(self)
        # the coordinator starts idle: the first records must wake it up
        self._idle_reported = True
        #: ingress offsets: a request counts as completed once its reply is acknowledged
        self.offsets = OffsetTracker()
        #: ingress offsets whose request's fate is in the state (see module docstring)
        self.applied = OffsetTracker()
        #: per owned ingress partition, the consumer's position when this worker started
        self.start_offsets: dict[int, int] = {}
        #: the epoch log (on with snapshot rounds): its topic, and one past this worker's
        #: newest acknowledged record (where a replay after the current cut may start)
        self._log_topic = settings.epoch_log_topic(app.name) if settings.snapshot_interval > 0 else ""
        self._log_pos = 0
        #: recovery (``worker.protocols.recovery``): request ids whose replies are already in the
        #: egress topic, and the logged batches waiting for their replay epochs
        self.answered: set[str] = set()
        self.replay_batches: dict[int, list[tuple[int, _Pending]]] = {}
        self._ingest_task: asyncio.Task[None] | None = None
        self._peer_addrs: dict[int, tuple[str, int]] = {}
        self.lost_coordinator = False
        #: the last recovery this worker rolled back for (see ``wire.Call.recovery``)
        self.recovery = 0
        self._tasks: list[asyncio.Task[Any]] = []
        #: the fallback phase (SFAAS_FALLBACK): "cross" (default; also "1"), every conflicting
        #: root re-runs in its epoch under ordered locks across workers (``worker.protocols.fallback``);
        #: "local", only roots whose first run stayed on this worker; "0", none (conflicts
        #: re-run next epoch)
        mode = os.environ.get("SFAAS_FALLBACK", "cross")
        self.fallback_mode = {"1": "cross", "0": "off"}.get(mode, mode)
        if self.fallback_mode not in ("cross", "local", "off"):
            raise ClusterError(f"SFAAS_FALLBACK must be cross, local or 0, got {mode!r}")
        #: the epoch loop's own (local) fallback phase
        self.fallback_enabled = self.fallback_mode == "local"
        self.fallback = CrossFallback(lambda: self.index, lambda: self.engine, self.send_peers, self._send_peer,
                                      lambda coro: self.tasks_add(asyncio.ensure_future(coro)), lambda: self.recovery,
                                      lambda: self.calls.room())
        self._age_sum = 0.0
        self._age_n = 0
        #: rescaling (``worker.protocols.rescale``): stores moving in, and whether this worker left
        self.moving = Moving(self)
        #: set once ``assign`` (this worker's slot and the membership) is known
        self.assigned = asyncio.Event()
        self.retired = False
        #: gained partitions: offsets a snapshot round holds (skipped when read again) and
        #: the round's waiting re-runs, ``(partition, offset) → (tid, now)``
        self._skip: dict[int, set[int]] = {}
        self._retry_at: dict[tuple[int, int], tuple[int, float]] = {}
        self.metrics = WorkerMetrics(self)
        #: partitions of the egress topic (a request's reply partition must be one)
        self.egress_partitions = 0
        #: malformed ingress records, ``"answered"`` (with an error reply) or ``"dropped"``
        self.rejected: collections.Counter[str] = collections.Counter()

    # -- snapshots -------------------------------------------------------------------------------
    def on_epoch_committed(self, epoch: int, marker: int | None) -> None:
        """Called after epoch ``epoch`` committed and its writes were applied.

        With ``marker`` set, take this worker's part of snapshot round ``marker``: no
        transaction is in flight here, so the stores and positions are a consistent cut.
        """
        if marker is None:
            return
        assert self.engine is not None and self.loop is not None
        if self.settings.snapshot_interval <= 0:
            log.warning("round %d requested but snapshot rounds are off here", marker)
            self.coord.send(wire.Snapshotted(marker, self.index, epoch, [], {}, {}, {}, [], 0,
                                             "snapshot rounds are off on this worker (snapshot_interval=0)"))
            return
        ingress = dict(self.start_offsets)
        ingress.update(self.applied.watermarks())
        retries = [[tid, item.partition, item.offset, item.now] for tid, item in self.loop.sequencer.retries()]
        # (the round waits until every reply made so far is acknowledged: a round holding a
        # request must never need its reply again, a recovery could not reproduce it)
        self.rounds.take(marker, epoch, self.engine.stores, ingress, self.applied.completed_above(),
                         dict(self.egress.acked), retries, self._log_pos, self.egress.durable)

    def complete(self, partition: int, offset: int) -> None:
        """The request read at ingress ``partition:offset`` completed (see ``worker.egress``)."""
        self.offsets.complete(partition, offset)
        self.ingress.completed()

    def report(self) -> None:
        assert self.engine is not None and self.loop is not None
        conflicts, aborts = self.loop.votes()
        pending = self.loop.pending
        self._idle_reported = pending == 0
        if self.coord.closed:  # the coordinator is gone: this epoch is rolled back anyway
            return
        rep = wire.Report(
            self.engine.epoch, self.index, len(self.loop.batch), [[t, b] for t, b in conflicts.items()],
            [[t, e, r] for t, (e, r) in aborts.items()], list(self.calls.sent), list(self.calls.served), pending,
            self.lease.run,
        )
        self.coord.send(rep)
        if self.lease.active:
            self.send_peers(rep)
        self.lease.on_report(rep)

    def send_peers(self, msg: wire.Message) -> None:
        """``msg`` to every peer (a closed channel is a loss the coordinator handles)."""
        for ch in self.peers.values():
            try:
                ch.send(msg)
            except ChannelClosed:
                pass

    def _send_peer(self, index: int, msg: wire.Message) -> None:
        """``msg`` to peer ``index`` (a closed channel is a loss the coordinator handles)."""
        ch = self.peers.get(index)
        if ch is not None:
            try:
                ch.send(msg)
            except ChannelClosed:
                pass

    def tasks_add(self, task: asyncio.Future[Any]) -> None:
        # keep a reference so the task is not garbage collected mid-flight
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    # -- setup -----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Join the cluster and process epochs until the coordinator stops us or goes away."""
        self._running: set[asyncio.Future[Any]] = set()
        s = self.settings
        server = await channels.serve(s.host, s.port, self.secret, self.calls.serve)
        my_port = server.sockets[0].getsockname()[1]
        await self.metrics.start()
        # rescaling ships stores too: every worker with snapshot rounds runs the server
        self.shipping = Shipping(s, self.secret) if s.standbys > 0 or s.snapshot_interval > 0 else None
        assign, promoted, takeover = await membership.join(self, my_port)
        self.index = assign.index
        self.assign = assign
        self.assigned.set()
        log.info("joined as worker %d of %d", assign.index, assign.n_workers,
                 extra={"worker": assign.index})
        mine = owned(assign.owners, self.index)
        if promoted is not None and set(promoted) != {(op, p) for op in self.app.operators for p in mine}:
            log.warning("the promoted stores are not this slot's; opening the slot's own", extra={"worker": self.index})
            promoted.close()
            promoted = None
        stores = promoted if promoted is not None else self._open_stores(assign, mine)
        if self.shipping is not None and s.standbys > 0:
            self.shipping.attach(stores)
        self.engine = Engine(self.app, assign.index, assign.n_workers, assign.partitions, stores, self.calls, assign.owners)
        shipping = self.shipping
        held = (lambda r: asyncio.to_thread(shipping.wait_marks, r)) if shipping is not None else None
        self.rounds = RoundTaker(self.index, lambda m: self.coord.send(m), held, self.settings.snapshot_interval)
        self.loop = Participant(self.engine, Sequencer(assign.index), _request_of, s.max_batch,
                                fallback=self.fallback_enabled)
        await self.reconnect_peers(assign.peers)
        await membership.start_clients(self, assign)
        if takeover is not None:  # a joining worker: its partitions resume where the rescale's round left them
            await self.resume_ingest(takeover.ingress, takeover.skip, takeover.retries)
        else:
            tps = [TopicPartition(assign.ingress_topic, p) for p in mine]
            self.consumer.assign(tps)
            if promoted is None:  # (a promoted standby's recovery, next, seeks and starts the ingest)
                for tp in tps:
                    self.start_offsets[tp.partition] = await self.consumer.position(tp)
                self.start_ingest()
        self._tasks = [
            asyncio.create_task(self.egress.run(), name="egress"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self.egress.commit_loop(), name="offsets"),
        ]
        self.coord.send(wire.Ready(self.index))
        try:
            while True:
                await self._follow_coordinator()
                if not self.lost_coordinator or s.snapshot_interval <= 0:
                    break
                # with rounds on, a restarted coordinator rolls everyone back to the newest
                # round: keep the stores and wait for it instead of restarting this process
                await self.stop_activity()
                if not await membership.rejoin(self, my_port):
                    break
                self.lost_coordinator = False
                if self._ingest_task is None:  # no recovery follows when nothing ever ran
                    self.start_ingest()
        finally:
            tasks = self._tasks + ([self._ingest_task] if self._ingest_task else [])
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.egress.flush()
            await self.producer.stop()  # waits for outstanding deliveries
            await self.egress.commit_offsets()
            await self.consumer.stop()
            await self.rounds.close()
            self.moving.stop()
            for ch in self.peers.values():
                ch.close()
            self.coord.close()
            server.close()
            if self.shipping is not None:
                self.shipping.close()
            await self.metrics.close()
            self.engine.close()

    def start_ingest(self) -> None:
        """(Re)start taking requests from the ingress partitions."""
        self._ingest_task = asyncio.create_task(self.ingress.run(), name="ingest")

    async def pause_ingest(self) -> None:
        """Stop taking requests (what was taken stays queued)."""
        if self._ingest_task is not None:
            self._ingest_task.cancel()
            await asyncio.gather(self._ingest_task, return_exceptions=True)
            self._ingest_task = None

    async def resume_ingest(self, gained: dict[int, int], skip: dict[int, list[int]] | None = None,
                            retries: list[list[Any]] | None = None) -> None:
        """Take requests from the partitions the map gives this worker: kept ones where
        ingest stopped, ``gained`` ones from the given offsets (``skip``: offsets already
        in the state; ``retries``: ``[tid, partition, offset, now]`` re-runs keeping their
        tids and first runs' ``now``)."""
        mine = owned(self.assign.owners, self.index)
        topic = self.assign.ingress_topic
        self.consumer.assign([TopicPartition(topic, p) for p in mine])
        for p in mine:
            if p in gained:
                nxt = gained[p]
                self.start_offsets[p] = nxt
            else:
                taken = self.offsets.next_offset(p)
                nxt = taken if taken is not None else self.start_offsets[p]
            self.consumer.seek(TopicPartition(topic, p), nxt)
        for p, offs in (skip or {}).items():
            self._skip.setdefault(p, set()).update(offs)
        for tid, p, off, now in retries or []:
            self._retry_at[(p, off)] = (tid, now)
        self.start_ingest()

    async def reconnect_peers(self, peers: list[list[Any]]) -> None:
        """Connect to every peer whose channel is missing, closed or at a new address."""
        for j, (host, port) in enumerate(peers):
            if j == self.index:
                continue
            old = self.peers.get(j)
            if old is not None and not old.closed and self._peer_addrs.get(j) == (host, port):
                continue
            if old is not None:
                old.close()
            # a peer that stays unreachable was lost too: fail soon, the coordinator recovers
            ch = await self._connect_retry(host, port, timeout=2 * self.settings.heartbeat_timeout + 2.0)
            ch.send(wire.Hello(self.index))
            self.peers[j] = ch
            self._peer_addrs[j] = (host, port)

    async def stop_activity(self) -> None:
        """Stop ingest and every execution in flight; wait until the replies already made
        are acknowledged (recovery starts from a quiet worker)."""
        self.lease.reset()  # no epoch begins on its own any more
        await self.pause_ingest()
        running = list(self._running)
        for t in running:
            t.cancel()
        self.calls.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self.calls.reset()
        self.fallback.reset()
        self.replay_batches = {}
        try:
            await self.egress.durable()
        except Exception as exc:
            log.warning("flushing replies before the recovery failed: %s", exc, extra={"worker": self.index})

    async def _recover(self, msg: wire.Recover) -> None:
        from worker.protocols.recovery import recover

        self.recovery = msg.attempt
        try:
            epochs = await recover(self, msg)
        except Exception as exc:
            log.exception("recovery %d failed", msg.attempt, extra={"worker": self.index})
            self.coord.send(wire.Recovered(msg.attempt, self.index, [], f"{type(exc).__name__}: {exc}"[:2000]))
            return
        self.coord.send(wire.Recovered(msg.attempt, self.index, epochs, ""))

    def _open_stores(self, assign: wire.Assign, mine: list[int]) -> PartitionStores:
        return open_stores(self.settings, self.app, mine, assign.partitions)

    async def _connect_retry(self, host: str, port: int, timeout: float = 30.0) -> channels.Channel:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await channels.connect(host, port, self.secret)
            except AuthenticationError as exc:
                if "shared-secret" in str(exc):
                    raise
                err: Exception = exc
            except OSError as exc:
                err = exc
            if time.monotonic() > deadline:
                raise ClusterError(f"cannot reach {host}:{port}: {err}")
            await asyncio.sleep(0.1)

    # -- epochs ----------------------------------------------------------------------------------------------
    async def _follow_coordinator(self) -> None:
        """Act on the coordinator's messages in order. A Commit runs as a task the next
        messages wait for — its fallback phase may wait on peers — except a Recover, which
        cancels it (a lost peer never finishes its re-runs) and goes first."""
        inbox: collections.deque[wire.Message] = collections.deque()
        recv: asyncio.Task[list[wire.Message]] | None = None
        commit: asyncio.Task[None] | None = None
        try:
            while True:
                if not inbox or commit is not None:
                    if recv is None:
                        recv = asyncio.ensure_future(self.coord.recv())
                    if commit is None:
                        try:
                            await recv  # (cheaper than asyncio.wait; its outcome is read below)
                        except Exception:  # noqa: S110 - ChannelClosed, handled below
                            pass
                    else:
                        await asyncio.wait({recv, commit}, return_when=asyncio.FIRST_COMPLETED)
                    if recv.done():
                        got, recv = recv, None
                        try:
                            inbox.extend(got.result())
                        except ChannelClosed:
                            log.error("lost the coordinator", extra={"worker": self.index})
                            self.lost_coordinator = True
                            return
                    if commit is not None and any(isinstance(m, wire.Recover) for m in inbox):
                        commit.cancel()  # the recovery rolls its epoch back anyway
                        await asyncio.gather(commit, return_exceptions=True)
                        commit = None
                        first = next(i for i, m in enumerate(inbox) if isinstance(m, wire.Recover))
                        # Begins and Commits before it: epochs the recovery rolls back
                        kept = [m for m in list(inbox)[:first] if not isinstance(m, (wire.Begin, wire.Commit))]
                        inbox = collections.deque([*kept, *list(inbox)[first:]])
                    if commit is not None:
                        if not commit.done():
                            continue
                        done, commit = commit, None
                        if not done.cancelled():
                            done.result()  # a failed commit is a bug: stop loudly
                    if not inbox:
                        continue
                msg = inbox.popleft()
                if isinstance(msg, wire.Commit) and not (msg.conflicts and self.fallback_mode == "cross"):
                    await self._commit(msg)  # no cross-worker phase: nothing to wait for on peers
                elif isinstance(msg, wire.Commit):
                    commit = asyncio.ensure_future(self._commit(msg))
                    self.tasks_add(commit)  # a recovery cancels it
                elif not await self._on_coordinator(msg):
                    return
        finally:
            if recv is not None:
                recv.cancel()

    async def _on_coordinator(self, msg: wire.Message) -> bool:
        """Act on one message of the coordinator (but a Commit); False: stop following."""
        if isinstance(msg, wire.Begin):
            self.start_epoch(msg)
        elif isinstance(msg, wire.Lease):
            self.lease.grant(msg)
        elif isinstance(msg, wire.Recover):
            await self._recover(msg)  # awaited: the replay's Begins come after it
        elif isinstance(msg, wire.Ship):
            self.coord.send(self.moving.ship(msg))
        elif isinstance(msg, wire.Move):
            self.moving.follow(msg)
        elif isinstance(msg, wire.Hold):
            self.moving.hold(msg)
        elif isinstance(msg, wire.Release):
            self.coord.send(await self.moving.release(msg))
        elif isinstance(msg, wire.Reassign):
            await self.moving.reassign(msg)
        elif isinstance(msg, wire.Stop):
            log.info("stopping: %s", msg.reason, extra={"worker": self.index})
            return False
        else:
            log.warning("unexpected %s from coordinator", type(msg).__name__)
        return True

    def start_epoch(self, begin: wire.Begin) -> None:
        """Begin epoch ``begin.epoch`` now (the coordinator's Begin, or the lease's) and run
        its roots in a task."""
        t0 = self._open_epoch(begin)
        if t0 is not None:
            self.tasks_add(asyncio.ensure_future(self._run_epoch(begin, t0)))

    async def _execute(self, begin: wire.Begin) -> None:
        """Begin epoch ``begin.epoch`` and run its roots (the tests' harnesses drive this)."""
        t0 = self._open_epoch(begin)
        if t0 is not None:
            await self._run_epoch(begin, t0)

    def _open_epoch(self, begin: wire.Begin) -> float | None:
        assert self.engine is not None and self.loop is not None
        if begin.epoch <= self.engine.epoch and not begin.replay:
            log.warning("ignoring a Begin of epoch %d: epoch %d began here", begin.epoch, self.engine.epoch,
                        extra={"worker": self.index})
            return None
        t0 = time.perf_counter()
        if begin.replay:  # the batch as logged, each item with the now it ran with (worker.protocols.recovery)
            self.loop.begin_replay(begin.epoch, self.replay_batches.pop(begin.epoch, []))
        else:
            self.loop.begin(begin.epoch, begin.now)
        self.lease.began(begin.epoch)
        self.calls.begin(begin.epoch, self.assign.n_workers)
        return t0

    async def _run_epoch(self, begin: wire.Begin, t0: float) -> None:
        assert self.engine is not None and self.loop is not None
        for _, item in self.loop.batch:
            if item.attempts == 0:
                self._age_sum += begin.now - item.request.sent_at
                self._age_n += 1
        ack = None
        if self._log_topic and self.loop.batch and not begin.replay:
            # the epoch-log write overlaps execution; the report (hence every reply of
            # this epoch, anywhere) waits for it to be durable
            rec = EpochRecord.of(begin.epoch, self.index, begin.now, self.loop.batch)
            ack = await self.producer.send(self._log_topic, rec.encode(), partition=0)
        await self.loop.execute()
        if ack is not None:
            try:
                md = await ack
            except Exception as exc:
                # without the record no reply of this epoch may leave: stop loudly
                log.error("writing epoch %d to the epoch log failed: %s; leaving the cluster", begin.epoch, exc,
                          extra={"worker": self.index})
                self.coord.close()
                return
            self._log_pos = md.offset + 1
        self.calls.reported_epoch = begin.epoch
        self.metrics.executed(t0)
        self.report()

    async def _commit(self, msg: wire.Commit) -> None:
        await self.commit_epoch(msg.epoch, {t: b for t, b in msg.conflicts}, {t: (e, r) for t, e, r in msg.aborts},
                                msg.marker)

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int], aborts: dict[int, tuple[str, str]],
                           marker: int | None) -> None:
        """Commit epoch ``epoch`` with the merged votes (the coordinator's Commit, or the lease's)."""
        assert self.loop is not None
        t0 = time.perf_counter()
        loop = self.loop
        if self.fallback_mode == "cross" and conflicts:
            candidates = loop.apply(conflicts, aborts)
            # the epoch's own commits and aborts are final now: their replies leave while
            # the conflicting ones re-run (a replay after a crash reproduces both)
            fates = loop.decided(conflicts, aborts)
            self._reply(fates)
            fb = await self.fallback.run(epoch, loop, candidates, set(conflicts))
            late = loop.settle(conflicts, aborts, fb, decided_done=True)
            self._reply(late)
            fates += late
        else:
            fates = await loop.commit(conflicts, aborts)
            self._reply(fates)
        self.metrics.committed(fates, self.answered, t0)
        self.on_epoch_committed(epoch, marker)

    def _reply(self, fates: list[Fate[_Pending]]) -> None:
        """Queue the replies of decided ``fates`` (a replay's already out: only mark them done)."""
        for f in fates:
            req = f.item.request
            if req.rid in self.answered:  # a replay: this reply is already in the egress topic
                self._applied(f.item)
                if f.item.offset >= 0:
                    self.complete(f.item.partition, f.item.offset)
                continue
            if f.committed:
                reply = wire.Reply(req.rid, True, f.value)
            else:
                reply = wire.Reply(req.rid, False, None, str(f.value[0]), str(f.value[1]))
            self.egress.add(req.reply_partition, reply.encode(), f.item.partition, f.item.offset)
            self._applied(f.item)

    def _applied(self, item: _Pending) -> None:
        if item.offset >= 0:
            self.applied.complete(item.partition, item.offset)

    # -- liveness --------------------------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        beat = self.settings.heartbeat_timeout / 4
        last_log = time.monotonic()
        while True:
            await asyncio.sleep(beat)
            lp = self.loop
            assert lp is not None
            if not self.coord.closed:  # (while the coordinator restarts, nobody listens)
                self.coord.send(wire.Heartbeat(self.index, lp.committed, self.metrics.heartbeat_latency()))
            if self._age_n and time.monotonic() - last_log >= 5.0:
                last_log = time.monotonic()
                log.info("epochs=%d committed=%d reruns=%d fallbacks=%d mean request age at epoch start %.1f ms",
                         lp.epochs, lp.committed, lp.reruns, lp.fallbacks, 1000 * self._age_sum / self._age_n)
                self._age_sum, self._age_n = 0.0, 0


async def run_worker(settings: Settings, app: App, name: str | None = None) -> None:
    """Run one worker until it is stopped; raises :class:`ClusterError` if it lost the coordinator."""
    w = Worker(settings, app, name)
    await w.run()
    if w.retired:
        log.info("retired by a rescale; exiting with code %d", EXIT_RETIRED)
        raise SystemExit(EXIT_RETIRED)
    if w.lost_coordinator:
        raise ClusterError("lost the coordinator")
