"""Rescaling a running cluster: partitions move between workers by shipping their stores.

``sfaas scale --workers M`` sends ``wire.Scale(M)``; the coordinator answers ``Scaled`` once
M workers run. In between, with epochs going on until the very end:

1. **join**: for a scale-up, the new worker processes (the supervisor starts them)
   register and wait as *joiners*;
2. **plan**: :func:`sfaas.runtime.partitioning.rebalance` gives the map that moves the fewest
   partitions;
3. **follow**: each old owner of a moving partition ships its stores (``Ship`` →
   ``Shipped`` with each store's version), each receiver follows them over the replica
   ``tcp`` transport until it holds that version (``Move`` → ``Following``). Flushes and
   merges keep shipping as they happen;
4. **switch**, at an epoch boundary: the next Commit carries a snapshot round's marker and
   no epoch begins after it; the receivers are told (``Hold``) to stop following once
   they hold that round. When the round is published (its report waited until the
   receivers acknowledged the round's snapshot of every moving store), every worker
   ``Release``s the partitions it loses, then every worker of the new membership takes
   ``Reassign``: receivers promote their replicas at the round (a rename; nothing
   downloaded), and every gained partition's requests resume from the round's ingress
   watermark, skipping those the round holds and re-running its waiting re-runs with their
   tids — exactly once. Leaving workers are stopped (exit code ``EXIT_RETIRED``: the
   supervisor does not restart them). Epochs resume when every worker is ready.

A lost worker cancels whatever step runs (the recovery that follows uses the map in force:
the new one once ``Release`` went out); the target stays, and the rescale starts over
after the recovery. Rescaling needs snapshot rounds.

With standbys (``coordinator.protocols.standby``) the rescale tells them what changes
(``coordinator.needs.RescaledStandbys``): while a scale-up is under way, registrants
beyond its joiners stand by for the slots it adds (the supervisor starts ``1 + standbys``
processes per new worker) and follow their primary once it took over at the switch.
After the switch every standby of a slot whose partitions changed is told to follow the
new ones (``Follow`` names them): it drops the followers of the partitions its primary
lost and follows the gained ones from the primary's current files; the standbys of the
slots a scale-down retires are retired with them (exit code ``EXIT_RETIRED``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coordinator.needs import Changes, Control, RescaledStandbys, SwitchRounds
from coordinator.state import ClusterState, Member
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, ports, wire
from sfaas.runtime.partitioning import owned, rebalance
from sfaas.runtime.protocols.rounds import RoundManifest

log = logging.getLogger("sfaas.coordinator.rescale")

__all__ = ["Rescaler", "STEP_TIMEOUT", "RESCALE_INBOX"]

#: a worker's answer to a rescale step
A = TypeVar("A", wire.Shipped, wire.Following, wire.Released)

#: Workers' answers (Shipped, Following, Released) waiting for the rescale step; one per
#: worker per step arrives, so beyond it an answer is dropped with a warning and the step
#: times out and starts over.
RESCALE_INBOX = 1024
#: Seconds one step may take (a receiver catching up with a large store takes longest).
STEP_TIMEOUT = 300.0


class _Abandon(Exception):
    """This attempt cannot finish; the target stays and a later attempt starts over."""


@dataclass
class _Plan:
    target: int
    owners: list[int]
    #: the membership after the switch, index = position (old members first, then joiners)
    members: list[Member]
    #: partitions that move: p → (old index, new index)
    moves: dict[int, tuple[int, int]]
    prepared: bool = False
    #: set once the switch's round is published: the new map and membership are in force
    adopted: bool = False
    old: list[Member] = field(default_factory=list)
    #: when it was planned (the coordinator's monotonic clock)
    started: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


class Rescaler:
    """The coordinator's side of a rescale (see the module docstring); owned by its event
    loop. ``control``: wakes the epochs (the switch waits for an epoch boundary) or stops
    them for a recovery; ``changes``: told when the membership changed; ``rounds_on``: a
    rescale needs snapshot rounds; ``standbys``: the standbys per slot, and ``followers``
    the coordinator's standbys (told what a rescale changes; needed when ``standbys`` > 0);
    ``clock``: the monotonic clock its steps' deadlines and timings read (the process's clock
    port's)."""

    def __init__(self, state: ClusterState, rounds: SwitchRounds, control: Control,
                 changes: Changes, *, rounds_on: bool, standbys: int,
                 followers: RescaledStandbys | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._state = state
        self._clock = clock or ports.current().clock.monotonic
        self._rounds = rounds
        self._control = control
        self._changes = changes
        self._rounds_on = rounds_on
        self._standbys = standbys
        self._followers = followers
        self.target: int | None = None
        self.joiners: list[Member] = []
        self._waiters: list[channels.Channel] = []
        self._inbox: asyncio.Queue[wire.Message] = asyncio.Queue(maxsize=RESCALE_INBOX)
        self._plan: _Plan | None = None
        self._prepare: asyncio.Task[None] | None = None
        #: the plan whose switch's round is armed, by round id (adopted once published)
        self._armed: dict[int, _Plan] = {}
        #: the last finished rescale (for logs, ``sfaas ps`` and benchmarks)
        self.last: dict[str, Any] = {}

    # -- requests --------------------------------------------------------------------------
    def refusal(self, workers: int) -> str:
        """Why ``workers`` workers cannot be had; empty when they can."""
        partitions = self._state.partitions
        if not 1 <= workers <= partitions:
            return f"workers must be in [1, {partitions}] (the app's partitions), got {workers}"
        if not self._rounds_on:
            return "rescaling needs snapshot rounds (snapshot_interval > 0)"
        if self._standbys > 0 and self._followers is None:
            return "this coordinator cannot rescale a cluster with standbys (standbys > 0)"
        return ""

    async def request(self, msg: wire.Scale, chan: channels.Channel) -> None:
        """Serve one ``sfaas scale`` channel: accept the target, answer when it is reached."""
        why = self.refusal(msg.workers)
        if why:
            chan.send(wire.Scaled(False, why))
            await chan.drain()
            return
        self.target = msg.workers
        if self._followers is not None:
            self._followers.expect(msg.workers)
        log.warning("rescale requested: %d → %d workers", len(self._state.members), msg.workers)
        if msg.workers == len(self._state.members) and self._plan is None:
            chan.send(wire.Scaled(True, f"already {msg.workers} workers"))
            await chan.drain()
            return
        self._waiters.append(chan)
        try:
            while True:
                await chan.recv()  # the operator only waits; a closed channel ends this
        except ChannelClosed:
            pass
        finally:
            if chan in self._waiters:
                self._waiters.remove(chan)

    def under_way(self) -> bool:
        """Is a rescale requested and not finished?"""
        return self.target is not None

    def wants_joiner(self) -> bool:
        """Should a new registrant wait as a joiner (a scale-up needs it)?"""
        return (self.target is not None
                and self.target > len(self._state.members) + len(self.joiners))

    def add_joiner(self, m: Member) -> None:
        self.joiners.append(m)
        log.info("worker %s (pid %d) joins for the rescale to %d workers",
                 m.name, m.pid, self.target)

    def is_joiner(self, m: Member) -> bool:
        return m in self.joiners

    def joining(self) -> list[Member]:
        return list(self.joiners)

    def lost(self, m: Member) -> None:
        """A joiner's channel closed, or a member was lost: this attempt cannot finish."""
        if m in self.joiners:
            self.joiners.remove(m)
        self.abandon(f"worker {m.name} lost")

    def on_message(self, msg: wire.Message) -> None:
        try:
            self._inbox.put_nowait(msg)
        except asyncio.QueueFull:
            log.warning("rescale inbox full; dropping %s", type(msg).__name__)

    def abandon(self, why: str) -> None:
        """Drop the attempt in progress (receivers stop following at their next Move or Recover)."""
        if self._prepare is not None:
            self._prepare.cancel()
            self._prepare = None
        if self._plan is not None and self._plan.adopted:
            # interrupted after the switch's round: the new map stands (a recovery under it
            # follows); the leaving workers go now, freeing their stores
            for m in self._plan.old[self._plan.target:]:
                self._retire(m)
            log.warning("rescale to %d workers interrupted after its round (%s); "
                        "recovering under the new map", self._plan.target, why)
            self._plan = None
            if self._followers is not None:
                self._followers.rescaled()
            if self.target == len(self._state.members):
                self._finish(f"{self.target} workers (after a recovery)")
        if self._plan is not None:
            log.warning("rescale to %d workers interrupted (%s); starting over later",
                        self._plan.target, why)
            self._plan = None

    # -- the epoch loop's side -----------------------------------------------------------------
    def due(self) -> bool:
        """Called before each Commit: True when the switch should happen at this epoch's end
        (its Commit must carry a round's marker); starts the follow step when it can."""
        members = self._state.members
        if self.target is None:
            return False
        if self._plan is None:
            if self.target == len(members):
                self._finish(f"{self.target} workers")
                return False
            if self.target > len(members) + len(self.joiners):
                return False  # waiting for the new processes to register
            self._plan = self._make_plan(self.target)
            self._prepare = asyncio.get_running_loop().create_task(self._follow(self._plan),
                                                                   name="rescale-follow")
            return False
        return self._plan.prepared

    def _make_plan(self, target: int) -> _Plan:
        state = self._state
        n_old = len(state.members)
        owners = rebalance(state.owners, target)
        members = list(state.members[:target]) + self.joiners[: max(0, target - n_old)]
        state.place_joiners(members, n_old)
        moves = {p: (o, n) for p, (o, n) in enumerate(zip(state.owners, owners, strict=True))
                 if o != n}
        log.warning("rescale %d → %d workers: moving partitions %s", n_old, target,
                    ", ".join(f"{p} ({o}→{n})" for p, (o, n) in sorted(moves.items())) or "none")
        return _Plan(target, owners, members, moves, started=self._clock())

    async def _expect(self, kind: type[A], senders: set[int], what: str) -> dict[int, A]:
        """Wait for one ``kind`` from each of ``senders`` (by ``index``); errors abandon."""
        got: dict[int, A] = {}
        deadline = self._clock() + STEP_TIMEOUT
        while senders - set(got):
            try:
                msg = await asyncio.wait_for(self._inbox.get(),
                                             max(0.0, deadline - self._clock()))
            except TimeoutError:
                raise _Abandon(f"{what}: no answer from worker(s) {sorted(senders - set(got))} "
                               f"within {STEP_TIMEOUT:.0f} s") from None
            if not isinstance(msg, kind):
                continue  # from an abandoned attempt
            error = "" if isinstance(msg, wire.Shipped) else msg.error
            if error:
                raise _Abandon(f"{what}: worker {msg.index}: {error}")
            got[msg.index] = msg
        return got

    async def _follow(self, plan: _Plan) -> None:
        """Step 3: sources ship, receivers follow until caught up."""
        t0 = self._clock()
        try:
            while not self._inbox.empty():
                self._inbox.get_nowait()
            members = self._state.members
            by_source: dict[int, list[int]] = {}
            for p, (o, _n) in plan.moves.items():
                by_source.setdefault(o, []).append(p)
            for o, parts in by_source.items():
                members[o].channel.send(wire.Ship(sorted(parts)))
            shipped = await self._expect(wire.Shipped, set(by_source), "shipping")
            seqs = [s for msg in shipped.values() for s in msg.seqs]
            receivers: dict[int, dict[int, list[int]]] = {}
            for p, (o, n) in plan.moves.items():
                receivers.setdefault(n, {}).setdefault(o, []).append(p)
            for n, sources in receivers.items():
                srcs = [wire.Source(members[o].host, members[o].repl_port, sorted(ps))
                        for o, ps in sources.items()]
                mine = [s for s in seqs
                        if int(s[1]) in {p for ps in sources.values() for p in ps}]
                plan.members[n].channel.send(wire.Move(n, plan.target, srcs, mine))
            await self._expect(wire.Following, set(receivers), "following")
        except _Abandon as exc:
            log.warning("rescale to %d workers: %s; trying again", plan.target, exc)
            if self._plan is plan:
                self._plan = None
            await asyncio.sleep(1.0)
            return
        except ChannelClosed:
            if self._plan is plan:
                self._plan = None
            return
        plan.phases["follow"] = self._clock() - t0
        plan.prepared = True
        log.warning("rescale to %d workers: receivers caught up in %.2f s; "
                    "switching at the next epoch", plan.target, plan.phases["follow"])
        self._control.wake()

    def arm(self, round_id: int) -> None:
        """Round ``round_id`` is the switch's: its manifest names the new map, and its
        publication puts the map and the membership in force (:meth:`adopt`)."""
        plan = self._plan
        assert plan is not None
        self._armed = {round_id: plan}
        self._rounds.arm_switch(round_id, plan.owners, plan.target, self)
        for n in {n for _o, n in plan.moves.values()}:
            try:
                plan.members[n].channel.send(wire.Hold(round_id))
            except ChannelClosed:
                pass  # its loss stops the epochs: the switch will not happen

    def adopt(self, round_id: int) -> None:
        """(on the event loop, when the switch's round is published) The new map and
        membership of the plan armed at round ``round_id`` are the cluster's: a recovery
        from here on restores under them."""
        plan = self._armed.pop(round_id, None)
        if plan is None:
            return
        plan.old = list(self._state.members)
        self._state.adopt(plan.owners, plan.members)
        self.joiners = [j for j in self.joiners if j not in plan.members]
        plan.adopted = True

    def _retire(self, m: Member) -> None:
        try:
            m.channel.send(wire.Stop(f"retired: the cluster scaled to "
                                     f"{len(self._state.members)} workers"))
        except ChannelClosed:
            pass

    async def switch(self, round_id: int) -> None:
        """Step 4, from the epoch loop after the Commit carrying ``round_id``'s marker: no
        epoch begins until this returns."""
        state, plan = self._state, self._plan
        assert plan is not None
        t0 = self._clock()
        manifest = await self._rounds.wait_published(round_id)
        if manifest is None or not plan.adopted:
            log.warning("rescale: round %d did not complete; switching at a later round", round_id)
            return
        t_round = self._clock()
        try:
            old = plan.old
            while not self._inbox.empty():
                self._inbox.get_nowait()
            for m in old:  # (the old indices: only joiners were renumbered)
                m.channel.send(wire.Release(round_id, state.owners))
            await self._expect(wire.Released, set(range(len(old))), "releasing")
            t_release = self._clock()
            for m in old[plan.target:]:
                self._retire(m)
            peers = state.peers()
            state.expect_ready()
            for m in state.members:
                m.channel.send(self._reassign(manifest, m.index, peers))
            await asyncio.wait_for(state.wait_ready(), STEP_TIMEOUT)
        except (_Abandon, TimeoutError) as exc:
            # the map already changed: only a recovery (under the new map) gets out of here
            self._control.force_recovery(f"the rescale's switch failed ({exc}); the new map is "
                                         "in force")
            raise
        t_end = self._clock()
        if self._followers is not None:  # (each primary's Ready already re-fed its standbys)
            self._followers.rescaled()
        plan.phases.update({"round": t_round - t0, "release": t_release - t_round,
                            "takeover": t_end - t_release})
        self.last = {"workers": plan.target, "round": round_id, "moved": sorted(plan.moves),
                     "pause_seconds": t_end - t0, "seconds": t_end - plan.started, **plan.phases}
        log.warning("rescaled to %d workers at round %d: moved %d partitions; epochs paused "
                    "%.2f s (%s); epochs after %d run under the map %s", plan.target, round_id,
                    len(plan.moves), t_end - t0,
                    ", ".join(f"{k} {v:.2f} s" for k, v in plan.phases.items()),
                    manifest.epoch, state.owners)
        self._plan = None
        self._changes.changed()
        if self.target == plan.target:
            self._finish(f"{plan.target} workers; moved partitions {sorted(plan.moves)} at round "
                         f"{round_id}, epochs paused {t_end - t0:.2f} s")

    def _reassign(self, m: RoundManifest, index: int, peers: list[wire.Peer]) -> wire.Reassign:
        state = self._state
        moves = self._plan.moves.items() if self._plan else ()
        gained = {p for p, (_o, n) in moves if n == index}
        mine = set(owned(state.owners, index)) & gained
        return wire.Reassign(
            m.round, index, len(state.members), peers, list(state.owners),
            {p: o for p, o in m.ingress.items() if p in mine},
            {p: list(v) for p, v in m.skip.items() if p in mine},
            [wire.Retry(*r) for r in m.retries if r[1] in mine],
            {p: o for p, (o, _n) in moves if p in mine}, m.epoch_log,
        )

    def _finish(self, detail: str) -> None:
        self.target = None
        if self._followers is not None:
            self._followers.expect(None)
        for chan in self._waiters:
            try:
                chan.send(wire.Scaled(True, detail))
            except ChannelClosed:
                pass
        self._waiters.clear()
