"""The coordinator's side of a recovery: a global rollback to the last complete round, then
the epoch log replayed in lockstep, then live epochs again.

After a lost worker (a closed channel at once, silence after ``heartbeat_timeout``):

1. wait until every index has a live, ready worker again — a restarted process (``sfaas
   up`` restarts it; any new worker process can take the slot) registers and gets the
   lost index and the membership;
2. find the newest complete round in MinIO (none yet: round 0, the empty state);
3. ``Recover`` to every worker; each rolls back and answers ``Recovered`` with the logged
   epochs after the round (``worker.protocols.recovery``);
4. replay: each logged epoch as ``Begin(epoch, its logged now, replay=True)`` with the
   normal barrier and ``Commit`` — same batches, same tids, same ``now``, so the same
   results; replies already in the egress topic are not produced again;
5. resume live epochs above every epoch used before.

A loss during any step, a worker that fails to roll back, or MinIO unreachable restarts
the recovery (after a short pause); the cluster keeps trying and says why in its log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from sfaas.runtime import wire
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.state import rounds_remote
from sfaas.runtime.txn.loop import merge_votes

if TYPE_CHECKING:
    from coordinator.service import Coordinator

log = logging.getLogger("sfaas.coordinator.recovery")

__all__ = ["recover", "RETRY_PAUSE"]

#: Seconds between recovery attempts that failed.
RETRY_PAUSE = 0.5


class _Retry(Exception):
    """This attempt cannot finish; start over."""


async def recover(c: Coordinator) -> None:
    """Recover the cluster (see module docstring); returns once live epochs may run."""
    from coordinator.service import Interrupted

    t0 = time.monotonic()
    while True:
        c.recoveries += 1
        attempt = c.recoveries
        c._loss.clear()
        try:
            await _wait_for_members(c, attempt)
            while not c._inbox.empty():  # from before this attempt: stale reports, loss markers
                c._inbox.get_nowait()
            phases: dict[str, float] = {"detect+restart": time.monotonic() - t0}
            t = time.monotonic()
            round_id = await _latest_round(c)
            epochs = await _roll_back(c, attempt, round_id)
            phases["restore"] = time.monotonic() - t
            t = time.monotonic()
            await _replay(c, epochs)
            phases["replay"] = time.monotonic() - t
        except (_Retry, Interrupted) as exc:
            log.warning("recovery %d did not finish (%s); trying again", attempt, exc)
            await asyncio.sleep(RETRY_PAUSE)
            continue
        c.last_recovery = {"attempt": attempt, "round": round_id, "epochs_replayed": len(epochs),
                           "seconds": time.monotonic() - t0, **phases}
        c.metrics.recovered(c.last_recovery)
        log.warning("recovery %d done in %.2f s: rolled back to round %d, replayed %d epochs (%s)",
                    attempt, time.monotonic() - t0, round_id, len(epochs),
                    ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        return


def _broadcast(c: Coordinator, msg: wire.Message) -> None:
    from sfaas.errors import ChannelClosed

    for m in c.members:
        try:
            m.channel.send(msg)
        except ChannelClosed:
            raise _Retry(f"worker {m.index}'s channel closed") from None


async def _wait_for_members(c: Coordinator, attempt: int) -> None:
    waited = 0.0
    while not all(m.alive and m.ready.is_set() for m in c.members):
        missing = [m.index for m in c.members if not (m.alive and m.ready.is_set())]
        if waited >= 10.0:
            log.warning("recovery %d: still waiting for worker(s) %s to be restarted (sfaas up restarts them; "
                        "any worker process of this app can take the slot)", attempt, missing)
            waited = 0.0
        c._changed.clear()
        try:
            await asyncio.wait_for(c._changed.wait(), 1.0)
        except TimeoutError:
            waited += 1.0


async def _latest_round(c: Coordinator) -> int:
    """The newest complete round (0: none); new epochs will be numbered above its epoch."""
    rounds = Rounds(rounds_remote(c.settings, c.app_name))
    try:
        latest = await asyncio.to_thread(rounds.latest)
    except Exception as exc:
        raise _Retry(f"cannot read the snapshot rounds from MinIO: {exc}") from None
    if latest is None:
        return 0
    # a restarted coordinator counts epochs from 0: live epochs must come after the round's
    # (and after every logged one, see _replay), or the log would reuse epoch numbers
    c.epoch = max(c.epoch, latest.epoch)
    return latest.round


async def _roll_back(c: Coordinator, attempt: int, round_id: int) -> list[list[Any]]:
    from coordinator.service import Lost

    peers = [[m.host, m.port] for m in c.members]
    _broadcast(c, wire.Recover(attempt, round_id, peers, list(c.owners)))
    got: dict[int, wire.Recovered] = {}
    while len(got) < len(c.members):
        msg = await c._inbox.get()
        if isinstance(msg, Lost):
            raise _Retry("a worker was lost while rolling back")
        if isinstance(msg, wire.Recovered) and msg.attempt == attempt:
            if msg.error:
                raise _Retry(f"worker {msg.index} could not roll back: {msg.error}")
            got[msg.index] = msg
        # anything else is from before the rollback (stale reports of the lost epoch)
    epochs: dict[int, float] = {}
    for r in got.values():
        for e, now in r.epochs:
            epochs[int(e)] = float(now)
    return [[e, epochs[e]] for e in sorted(epochs)]


async def _replay(c: Coordinator, epochs: list[list[Any]]) -> None:
    for e, now in epochs:
        _broadcast(c, wire.Begin(e, now, None, True))
        reports = await c._barrier(e)
        conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
        commit = wire.Commit(e, [[t, b] for t, b in conflicts.items()], [[t, x, y] for t, (x, y) in aborts.items()],
                             False, None)
        _broadcast(c, commit)
    if epochs:
        c.epoch = max(c.epoch, epochs[-1][0])
