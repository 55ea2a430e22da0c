"""The coordinator's side of a recovery: a global rollback to the last complete round, then
the epoch log replayed in lockstep, then live epochs again.

After a lost worker (a closed channel at once, silence after ``heartbeat_timeout``):

1. wait until every index has a live, ready worker again — a restarted process (``sfaas
   up`` restarts it; any new worker process can take the slot) registers and gets the
   lost index and the membership;
2. find the newest complete round in MinIO (none yet: round 0, the empty state);
3. ``Recover`` to every worker; each rolls back and answers ``Recovered`` with the logged
   epochs after the round (``worker.protocols.recovery``);
4. replay: ``ReplayLogged`` with every logged epoch and its ``now``; the workers run them
   in order themselves, as a lease (``worker.protocols.lease``): each epoch begun as
   ``Begin(epoch, its logged now, replay=True)`` once the one before committed, committed
   when every worker's report (sent to the peers) is in — same batches, same tids, same
   ``now``, the same merged votes, so the same results; replies already in the egress
   topic are not produced again. Each worker answers ``Replayed`` after the last.
   A leased replay that has not answered within :func:`replay_patience` (its reports
   travel between the workers only, so a report lost on a broken peer channel would
   stall it with every worker alive) restarts the recovery, and the attempts that
   follow drive each epoch themselves: ``Begin(epoch, its logged now, replay=True)``, the
   barrier, ``Commit`` — two hops per epoch, slower, but every report comes here;
5. resume live epochs above every epoch used before.

A loss during any step restarts the recovery at once (its first step waits for the slot's
new process); a worker that fails to roll back, or MinIO unreachable, restarts it after a
short pause (:data:`RETRY_PAUSE`); the cluster keeps trying and says why in its log —
except when a worker's rollback fails *the same way* ``SAME_FAILURES`` times in a row
with an error it calls permanent (``Recovered.permanent``: the state was written with
another engine or partition count, a file is corrupt): retrying cannot cure that, so
:class:`~sfaas.errors.RecoveryStopped` ends the recovery, and the coordinator says why
(``coordinator.service``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Callable

from coordinator.barrier import Barrier
from coordinator.inbox import Inbox, Interrupted, Lost
from coordinator.needs import Recoveries
from coordinator.state import ClusterState
from coordinator.traces import steps_span
from remotes import Remote
from sfaas.errors import ChannelClosed, RecoveryStopped
from sfaas.runtime import ports, tracing, wire
from sfaas.runtime.protocols.rounds import RoundManifest, Rounds
from sfaas.runtime.txn.loop import merge_votes

log = logging.getLogger("sfaas.coordinator.recovery")

__all__ = ["Recovery", "RETRY_PAUSE", "SAME_FAILURES", "replay_patience"]

#: Seconds between recovery attempts that failed.
RETRY_PAUSE = 0.5
#: Identical permanent failures in a row after which recovery stops retrying.
SAME_FAILURES = 3
#: How long a leased replay may take before the recovery starts again with a replay the
#: coordinator drives: this many seconds, plus :data:`PATIENCE_PER_EPOCH` per epoch. A
#: replay runs ~550 epochs a second on a quiet 2-core host and live epochs 110–190, so
#: the patience is past a live-speed replay's time even on a loaded one.
PATIENCE_BASE = 4.0
PATIENCE_PER_EPOCH = 0.025


def replay_patience(epochs: int) -> float:
    """Seconds a leased replay of ``epochs`` epochs may take (see :data:`PATIENCE_BASE`)."""
    return PATIENCE_BASE + PATIENCE_PER_EPOCH * epochs


class _Stalled(Exception):
    """A leased replay did not finish in time (:func:`replay_patience`)."""


class _Retry(Exception):
    """This attempt cannot finish; start over (``permanent``: nor can any other)."""

    def __init__(self, why: str, permanent: bool = False, error: str = "") -> None:
        super().__init__(why)
        self.permanent = permanent
        self.error = error or why


class Recovery:
    """Recovers the cluster (see the module docstring). ``rounds_remote``: where the
    snapshot rounds are published; ``recoveries``: told the phases of each recovery done."""

    def __init__(self, state: ClusterState, inbox: Inbox, barrier: Barrier,
                 rounds_remote: Callable[[], Remote], recoveries: Recoveries,
                 known_round: Callable[[], RoundManifest | None] = lambda: None) -> None:
        self._state = state
        self._inbox = inbox
        self._barrier = barrier
        #: leased replays that stalled (the later attempts of their recovery drive it)
        self.stalls = 0
        self._rounds_remote = rounds_remote
        self._recoveries = recoveries
        #: the newest complete round as this coordinator published it, when it knows
        #: (``coordinator.protocols.rounds.RoundKeeper.known_latest``): no MinIO read then
        self._known_round = known_round

    async def run(self) -> None:
        """Recover; returns once live epochs may run."""
        state = self._state
        clock = ports.current().clock  # (the process's: virtual in the simulator)
        t0, t0_ns = clock.monotonic(), time.time_ns()
        last, same = "", 0  # the last permanent failure, and how often in a row
        driven = False  # a leased replay stalled: this recovery's next attempts drive theirs
        while True:
            attempt = state.begin_recovery()
            self._inbox.rearm()
            try:
                await self.members_ready(attempt)
                phases: dict[str, float] = {"detect+restart": clock.monotonic() - t0}
                steps = [time.time_ns()]
                t = clock.monotonic()
                latest = await self._latest_round()
                round_id = latest.round if latest is not None else 0
                epochs = await self._roll_back(attempt, latest)
                phases["restore"] = clock.monotonic() - t
                steps.append(time.time_ns())
                t = clock.monotonic()
                if driven:
                    await self._driven_replay(epochs)
                else:
                    await self._replay(attempt, epochs)
                phases["replay"] = clock.monotonic() - t
                steps.append(time.time_ns())
            except _Stalled as exc:
                self.stalls += 1
                driven = True
                log.warning("recovery %d: %s; trying again with a replay driven epoch by "
                            "epoch", attempt, exc)
                await asyncio.sleep(RETRY_PAUSE)
                continue
            except Interrupted as exc:  # (no pause: the next attempt waits for the slots)
                log.warning("recovery %d interrupted (%s); starting again", attempt, exc)
                continue
            except _Retry as exc:
                if exc.permanent:
                    # "the same way": the same error but for the numbers in it (which
                    # worker answered first, which partition it names)
                    shape = re.sub(r"\d+", "#", exc.error)
                    same = same + 1 if shape == last else 1
                    last = shape
                    if same >= SAME_FAILURES:
                        why = f"recovery failed {same} times in a row the same way: {exc}"
                        state.stop_recovering(why)
                        raise RecoveryStopped(why) from None
                log.warning("recovery %d did not finish (%s); trying again", attempt, exc)
                await asyncio.sleep(RETRY_PAUSE)
                continue
            info = {"attempt": attempt, "round": round_id, "epochs_replayed": len(epochs),
                    "seconds": clock.monotonic() - t0, **phases}
            state.recovered(info)
            self._recoveries.recovered(info)
            if tracing.ON:
                steps_span("recovery", t0_ns, [("detect+restart", t0_ns, steps[0]),
                                               ("restore", steps[0], steps[1]),
                                               ("replay", steps[1], steps[2])], {
                    "sfaas.attempt": attempt, "sfaas.round": round_id,
                    "sfaas.epochs_replayed": len(epochs)})
            log.warning("recovery %d done in %.2f s: rolled back to round %d, replayed %d epochs "
                        "(%s)", attempt, clock.monotonic() - t0, round_id, len(epochs),
                        ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
            return

    def _broadcast(self, msg: wire.Message) -> None:
        for m in self._state.members:
            try:
                m.channel.send(msg)
            except ChannelClosed:
                if not m.alive:  # (a loss: the next attempt waits for the slot's new process)
                    raise Interrupted(f"worker {m.index} was lost") from None
                raise _Retry(f"worker {m.index}'s channel closed") from None

    async def members_ready(self, attempt: int) -> None:
        """Wait until every slot has a ready process; then what the inbox holds is from
        before this attempt (stale reports, loss markers) and dropped, and so is its loss
        flag: every loss so far took a slot's process, and the slot has a new one now
        (``lose`` marks the member lost before it interrupts, and nothing awaits between
        the check and here). A loss during the wait once left the flag set, and the next
        live epoch started a second recovery nobody needed (the simulator's seeds 438,
        503 and 577)."""
        await self._wait_for_members(attempt)
        self._inbox.discard()
        self._inbox.rearm()

    async def _wait_for_members(self, attempt: int) -> None:
        state = self._state
        waited = 0.0
        while not state.all_ready():
            if waited >= 10.0:
                starting = [m.index for m in state.members if m.alive and not m.ready.is_set()]
                if starting:  # (registered: opening its stores, connecting to Kafka)
                    log.warning("recovery %d: still waiting for worker(s) %s to get ready "
                                "(registered: opening their stores and connecting to Kafka)",
                                attempt, starting)
                lost = [m.index for m in state.members if not m.alive]
                if lost:
                    log.warning("recovery %d: still waiting for worker(s) %s to be restarted "
                                "(sfaas up restarts them; any worker process of this app can "
                                "take the slot)", attempt, lost)
                waited = 0.0
            if not await state.wait_change(1.0):
                waited += 1.0

    async def _latest_round(self) -> RoundManifest | None:
        """The newest complete round (None: none); new epochs will be numbered above its
        epoch."""
        latest = self._known_round()  # (two reads of MinIO less: 20-50 ms of the gap)
        if latest is None:
            try:
                latest = await asyncio.to_thread(Rounds(self._rounds_remote()).latest)
            except Exception as exc:
                raise _Retry(f"cannot read the snapshot rounds from MinIO: {exc}") from None
        if latest is None:
            return None
        # a restarted coordinator counts epochs from 0: live epochs must come after the round's
        # (and after every logged one, see _replay), or the log would reuse epoch numbers
        self._state.reach_epoch(latest.epoch)
        return latest

    async def _roll_back(self, attempt: int,
                         latest: RoundManifest | None) -> list[wire.LoggedEpoch]:
        """Step 3: every worker back to round ``latest`` (None: round 0, the empty state),
        its manifest sent along; the logged epochs after it, as the workers found them."""
        state = self._state
        round_id, manifest = (0, None) if latest is None else (latest.round, latest.encode())
        self._broadcast(wire.Recover(attempt, round_id, state.peers(), list(state.owners),
                                     manifest))
        got: dict[int, wire.Recovered] = {}
        while len(got) < len(state.members):
            msg = await self._inbox.get()
            if isinstance(msg, Lost):
                raise Interrupted("a worker was lost while rolling back")
            if isinstance(msg, wire.Recovered) and msg.attempt == attempt:
                if msg.error:
                    raise _Retry(f"worker {msg.index} could not roll back: {msg.error}",
                                 msg.permanent, msg.error)
                got[msg.index] = msg
            # anything else is from before the rollback (stale reports of the lost epoch)
        epochs: dict[int, float] = {}
        for r in got.values():
            for e, now in r.epochs:
                epochs[int(e)] = float(now)
        return [wire.LoggedEpoch(e, epochs[e]) for e in sorted(epochs)]

    async def _replay(self, attempt: int, epochs: list[wire.LoggedEpoch]) -> None:
        """Step 4: the workers replay ``epochs`` as a lease (``wire.ReplayLogged``,
        ``worker.protocols.lease``) — no Begin and Commit of the coordinator's per epoch,
        whose two hops were most of a replayed epoch's time — and each answers once it
        committed the last (``wire.Replayed``); raises :class:`_Stalled` when they have not
        within :func:`replay_patience`."""
        if not epochs:
            return
        run = 1 + secrets.randbelow(2**62)
        self._broadcast(wire.ReplayLogged(attempt, run, epochs))
        last = epochs[-1].epoch
        patience = replay_patience(len(epochs))
        loop = asyncio.get_running_loop()  # (its clock: the process's, virtual when simulated)
        deadline = loop.time() + patience
        done: set[int] = set()
        while len(done) < len(self._state.members):
            try:
                msg = await asyncio.wait_for(self._inbox.get(), deadline - loop.time())
            except TimeoutError:
                raise _Stalled(f"the leased replay of {len(epochs)} epochs did not finish in "
                               f"{patience:.1f} s (answered: {sorted(done)})") from None
            if isinstance(msg, Lost):
                raise Interrupted("a worker was lost during the replay")
            if isinstance(msg, wire.Replayed) and msg.attempt == attempt:
                if msg.epoch != last:  # (a bug: every worker was given the same epochs)
                    raise _Retry(f"worker {msg.index} replayed up to epoch {msg.epoch}, "
                                 f"not {last}")
                done.add(msg.index)
            # anything else is from before the replay (stale reports of the lost epoch)
        self._state.reach_epoch(last)
        self._state.reach_now(max(e.now for e in epochs))

    async def _driven_replay(self, epochs: list[wire.LoggedEpoch]) -> None:
        """Step 4 after a leased replay stalled: each logged epoch as ``Begin(epoch, its
        logged now, replay=True)``, the barrier (every report comes here) and ``Commit``.
        The workers go live at the first live Begin that follows (``worker.epochs``)."""
        for e, now in epochs:
            self._broadcast(wire.Begin(e, now, None, True))
            reports = await self._barrier.wait(e)  # (a loss raises Interrupted: start over)
            conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            self._broadcast(wire.Commit(
                e, [wire.Conflict(t, b) for t, b in conflicts.items()],
                [wire.Aborted(t, x, y) for t, (x, y) in aborts.items()], False, None))
        if epochs:
            self._state.reach_epoch(epochs[-1].epoch)
            self._state.reach_now(max(e.now for e in epochs))
