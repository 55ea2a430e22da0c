"""PeerCalls: calls between workers within an epoch, over the authenticated peer channels.

A root running here that touches a key of another worker calls it (:meth:`PeerCalls.remote_call`,
the engine's router); a call from a peer runs here as part of the same epoch
(:meth:`PeerCalls.on_call`). Per epoch each worker counts the calls it sent to and served for
every peer; its ``wire.Report`` carries both, so the coordinator's barrier knows when no
call is still travelling. A call served after this worker reported its epoch needs a fresh
report, sent before the call's result (:meth:`PeerCalls.flush_late`).

A call for an epoch this worker has not begun (a peer began it first) is *deferred* until
its Begin — and a fallback call or ``Finished`` for an epoch whose Commit this worker has
not read is held until its fallback phase begins (``worker.protocols.fallback``) — at most
:data:`DEFERRED_BATCHES` × ``max_batch`` of them together: above that the worker stops
reading its peers' channels (their messages wait in TCP) until the Begin or the phase
takes them. Nothing a peer needs to finish the current epoch comes after such a call on its
channel, so the wait cannot block an epoch.

A channel's ``Hello`` names the sender's generation (``wire.Assign.generation``); a channel
whose generation is older than the one this worker's membership names for that index —
checked at the hello and again before each frame, since a recovery's membership may name a
newer one later — is a fenced process's (``worker.fence``): it is refused and closed.

A channel from a current peer that closes otherwise (a reset, a partition between the two
workers) may have taken calls, results or a leased run's reports with it; the epoch
waiting for them would wait for ever while every worker stays alive and heartbeats. So
the worker tells the coordinator (``wire.PeerBroken``), which recovers: the rollback
connects the peers again and the epochs since the round are replayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, tracing, wire
from sfaas.runtime.codec import check_arguments
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.engine import Engine, Outcome
from worker.links import PeerLinks
from worker.needs import Spawner, Votes
from worker.state import WorkerState
from worker.traces import call_span

log = logging.getLogger("sfaas.worker")

__all__ = ["PeerCalls", "DEFERRED_BATCHES", "FallbackInbox", "stale_generation"]

#: Calls from peers for an epoch not begun yet, held until its Begin: at most this many ×
#: ``max_batch`` (see the module docstring).
DEFERRED_BATCHES = 16


def stale_generation(state: WorkerState, src: int, gen: int, peer: str) -> bool:
    """Is a channel of worker ``src`` at generation ``gen`` a fenced process's (older than
    the one the membership names)? Logs the refusal."""
    known = state.peer_generation(src)
    if gen >= known:
        return False
    log.warning("refusing the channel of worker %d at %s: its generation %d is older than %d, "
                "the membership's (a fenced process)", src, peer, gen, known,
                extra={"worker": state.index})
    return True


class FallbackInbox(Protocol):
    """What this part hands to the fallback phase (``worker.protocols.fallback``)."""

    @property
    def held(self) -> int: ...

    def on_call(self, msg: wire.Call) -> None: ...

    def on_finished(self, msg: wire.Finished) -> None: ...

    def reset(self) -> None:
        """Forget what is held (a recovery)."""


class PeersWorld(Protocol):
    """What calls need of ``worker.world.World``: the journals calls carry, and where
    finished effects go."""

    def for_call(self, tid: int) -> tuple[str, dict[str, Any]]: ...

    def trace_of(self, tid: int) -> str | None: ...

    def on_call(self, msg: wire.Call) -> None: ...

    def on_effect_done(self, msg: wire.EffectDone) -> None: ...


class PeerCalls:
    """One worker's calls to and from its peers (see the module docstring).

    ``tasks``: where a call served runs (a recovery cancels them); ``epochs``: report this
    worker's epoch again, a peer's Report or Wake of a leased run (``worker.needs.Votes``,
    given here or by :meth:`reports_to`).
    """

    def __init__(
        self, settings: Settings, state: WorkerState, links: PeerLinks, fallback: FallbackInbox,
        tasks: Spawner, epochs: Votes | None = None, world: PeersWorld | None = None,
        broken: Callable[[int, int], None] | None = None,
    ) -> None:
        self._settings = settings
        #: told ``(peer, its generation)`` when a channel a member opened to this worker
        #: closes (``wire.PeerBroken``: the coordinator recovers)
        self._broken = broken
        self._state = state
        self._links = links
        self._fallback = fallback
        self._tasks = tasks
        self._epochs = epochs
        self._world = world
        self._calls: dict[int, asyncio.Future[Outcome]] = {}
        self._call_ids = 0
        self._deferred: dict[int, list[wire.Call]] = {}
        #: calls held for an epoch not begun (see DEFERRED_BATCHES)
        self.deferred_n = 0
        self._deferred_room = asyncio.Event()
        #: the epoch this worker last reported (a call served later needs a fresh report)
        self.reported_epoch = 0
        #: this epoch's calls sent to and served for each peer (``wire.Report``'s counters)
        self.sent: list[int] = []
        self.served: list[int] = []
        self._late: list[tuple[int, wire.Result]] = []

    def reports_to(self, epochs: Votes) -> None:
        """Calls served report again, and leased runs' messages go, to ``epochs`` (a loop
        between parts: ``worker.service``)."""
        self._epochs = epochs

    def _votes(self) -> Votes:
        assert self._epochs is not None, "PeerCalls.reports_to: not wired"
        return self._epochs

    def begin(self, epoch: int, n_workers: int) -> None:
        """Epoch ``epoch`` begins here: reset the counters, serve the calls held for it."""
        self.sent = [0] * n_workers
        self.served = [0] * n_workers
        for call in self.take_deferred(epoch):
            self.on_call(call)

    def cancel(self) -> None:
        """Cancel this worker's calls waiting for a result (a recovery stops everything)."""
        for fut in self._calls.values():
            if not fut.done():
                fut.cancel()

    def reported(self, epoch: int) -> None:
        """This worker reported epoch ``epoch``: a call served for it from now on makes it
        report again (:meth:`flush_late`)."""
        self.reported_epoch = epoch

    def gauges(self) -> dict[str, float]:
        """What ``worker.metrics`` shows of the calls: those deferred."""
        return {"deferred_calls": self.deferred_n}

    async def halt(self) -> None:
        """Cancel every execution and call in flight, wait for them; forget the fallback
        phase's held messages (a recovery starts from a quiet worker;
        ``worker.needs.Halting``)."""
        running = self._tasks.cancel()
        self.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self.reset()
        self._fallback.reset()

    def reset(self) -> None:
        """Forget every call in flight, once the epoch's tasks ended (a recovery: their
        epochs are rolled back)."""
        self.cancel()
        self._calls.clear()
        self._deferred.clear()
        self.deferred_n = 0
        self._deferred_room.set()
        self._late.clear()
        self.reported_epoch = 0

    # -- this worker's calls (the engine's router) ---------------------------------------------
    async def remote_call(
        self, dest: int, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int,
    ) -> Outcome:
        """Send a call to worker ``dest`` and wait for its result."""
        st = self._state
        argv = list(args)
        check_arguments(argv, f"arguments of {operator}.{function}")
        self._call_ids += 1
        cid = self._call_ids
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        eng = self._engine()
        fallback = eng.in_fallback  # (outside the execution barrier's counters)
        if not fallback:
            self.sent[dest] += 1
        chan = self._links.channels[dest]
        scope, journal = self._world.for_call(tid) if self._world is not None else ("", {})
        trace = self._world.trace_of(tid) if tracing.ON and self._world is not None else None
        chan.send(wire.Call(eng.epoch, st.index, cid, tid, now, operator, key, function, argv,
                            depth, st.epoch_recovery, fallback, scope, journal, trace))
        try:
            await chan.wait_room()  # a peer reading slower than we call: wait (channels.HIGH_WATER)
            return await fut
        finally:
            self._calls.pop(cid, None)

    # -- peers' calls ----------------------------------------------------------------------------
    async def serve(self, chan: channels.Channel, first: list[wire.Message] | None = None) -> None:
        """Read one peer's channel (``first``: its first frame, if read already) until it
        closes."""
        st = self._state
        if first is None:
            first = await chan.recv()
        if not first or not isinstance(first[0], wire.Hello):
            log.warning("peer %s did not say hello; dropping", chan.peer)
            return
        src, gen = first[0].index, first[0].generation
        # a worker joining a rescale: running peers may connect while it reads its Reassign
        await asyncio.wait_for(st.assigned.wait(), 2 * self._settings.heartbeat_timeout + 10.0)
        if not 0 <= src < st.n_workers or src == st.index:
            raise wire.ProtocolError(f"peer {chan.peer} says it is worker {src} (of "
                                     f"{st.n_workers}; this is worker {st.index})")
        chan.gate = self._links.gate  # (results leave under this worker's lease)
        rest = first[1:]
        limit = DEFERRED_BATCHES * self._settings.max_batch
        try:
            while True:
                if stale_generation(st, src, gen, chan.peer):
                    chan.close()
                    return
                for msg in rest:
                    self._take(src, msg)
                while self.deferred_n + self._fallback.held >= limit:
                    self._deferred_room.clear()  # see DEFERRED_BATCHES
                    await self._deferred_room.wait()
                rest = await chan.recv()
        except ChannelClosed:
            if self._broken is not None and src < st.n_workers:
                self._broken(src, gen)
            raise

    def _take(self, src: int, msg: wire.Message) -> None:
        """One message of peer ``src``."""
        if isinstance(msg, wire.Result):
            fut = self._calls.get(msg.call_id)
            if fut is not None and not fut.done():
                fut.set_result((msg.ok, msg.value if msg.ok else tuple(msg.value)))
        elif isinstance(msg, (wire.Call, wire.Finished)):
            if msg.src != src:
                raise wire.ProtocolError(f"worker {src} sent a {type(msg).__name__} as worker "
                                         f"{msg.src}")
            if isinstance(msg, wire.Finished):
                self._fallback.on_finished(msg)
            elif msg.fallback:
                self._fallback.on_call(msg)
            else:
                self.on_call(msg)
        elif isinstance(msg, wire.EffectDone):
            if msg.src != src:
                raise wire.ProtocolError(f"worker {src} sent an EffectDone as worker {msg.src}")
            if self._world is not None:
                self._world.on_effect_done(msg)
        elif isinstance(msg, (wire.Report, wire.Wake)):  # leased epochs (protocols.lease)
            if msg.index != src:
                raise wire.ProtocolError(f"worker {src} sent a {type(msg).__name__} as worker "
                                         f"{msg.index}")
            if isinstance(msg, wire.Wake) or len(msg.sent) == self._state.n_workers:
                self._votes().leased(msg)
            # (else a Report from before a rescale changed the membership: stale)
        else:
            log.warning("unexpected %s from peer %d", type(msg).__name__, src)

    def room(self) -> None:
        """Messages held for a later phase were taken: reading the peers may resume."""
        self._deferred_room.set()

    def take_deferred(self, epoch: int) -> list[wire.Call]:
        """The calls held for ``epoch``, which begins now; reading the peers resumes."""
        calls = self._deferred.pop(epoch, [])
        self.deferred_n -= len(calls)
        self._deferred_room.set()
        return calls

    def _engine(self) -> Engine:
        eng = self._state.engine
        assert eng is not None
        return eng

    def on_call(self, msg: wire.Call) -> None:
        recovery = self._state.recovery
        epoch = self._engine().epoch
        if msg.recovery != recovery:
            # sent before a recovery this worker went through: its epoch is replayed anew
            # (a newer one cannot come: replays start once every worker has rolled back)
            log.info("dropping a call of worker %d from before recovery %d", msg.src, recovery)
            return
        if msg.epoch == epoch:
            self._tasks.spawn(self._serve_call(msg))
        elif msg.epoch > epoch:
            # the peer began the next epoch before our Begin arrived: hold the call
            self._deferred.setdefault(msg.epoch, []).append(msg)
            self.deferred_n += 1
        else:
            log.error("call for past epoch %d (now %d) from worker %d", msg.epoch, epoch, msg.src)
            stale = wire.Result(msg.call_id, False, ["StaleEpoch", "call for a past epoch"])
            self._links.channels[msg.src].send(stale)

    async def _serve_call(self, msg: wire.Call) -> None:
        if self._world is not None:
            self._world.on_call(msg)
        start_ns = time.time_ns() if tracing.ON and msg.traceparent is not None else 0
        ok, value = await self._engine().serve(msg.tid, msg.now, msg.operator, msg.key,
                                               msg.function, msg.args, msg.depth)
        if start_ns:
            call_span(msg, start_ns, ok, value, self._state.index)
        self.served[msg.src] += 1
        result = wire.Result(msg.call_id, ok, value if ok else list(value))
        if self.reported_epoch == msg.epoch:
            # served after my report: the coordinator needs fresh votes and counters
            if not self._late:
                asyncio.get_running_loop().call_soon(self.flush_late)
            self._late.append((msg.src, result))
        else:
            chan = self._links.channels[msg.src]
            chan.send(result)
            await chan.wait_room()

    def flush_late(self) -> None:
        """Report again, then send the results of the calls served since the last report."""
        late, self._late = self._late, []
        self._votes().report()
        for src, result in late:
            self._links.channels[src].send(result)
