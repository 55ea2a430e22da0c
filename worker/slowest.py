"""A worker's slowest and aborted requests of the last minute, with their phases: what the
coordinator's status page shows as its slow-request view (issue 50).

Fed after every commit (``worker.traces.EpochTraces.committed``) from what the worker
knows at reply time — each request's client send time, its epoch's begin, report, Commit
and reply times, its re-runs, whether the fallback phase decided it, its effects, its
trace — and sent to the coordinator on the next heartbeat when it changed
(``wire.Heartbeat.slow``). Bounded: the :data:`SLOWEST_KEPT` slowest requests and the
:data:`ABORTED_KEPT` newest aborted ones of the last :data:`WINDOW` seconds. A committed
request costs one comparison with the slowest kept floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sfaas.runtime import wire
from sfaas.runtime.txn.loop import Fate
from worker.state import Pending

__all__ = ["SlowRequests", "SLOWEST_KEPT", "ABORTED_KEPT", "WINDOW"]

#: The slowest requests of the window a worker keeps (and sends) for the slow-request view.
SLOWEST_KEPT = 10
#: The newest aborted requests of the window it keeps.
ABORTED_KEPT = 10
#: Seconds a request stays in the view.
WINDOW = 60.0


class SlowRequests:
    """See the module docstring. Not thread-safe: the worker's event loop owns it."""

    def __init__(self) -> None:
        self._slowest: list[wire.SlowRequest] = []
        self._aborted: list[wire.SlowRequest] = []
        #: the lowest latency kept while the slowest list is full (admission: above it)
        self._floor = -1.0
        self._fresh = False
        self._purged = 0.0

    def observe(self, epoch: int, fates: Sequence[Fate[Pending]],
                stamps: tuple[int, int, int, int], trace_ids: Mapping[str, str],
                wall: float) -> None:
        """Epoch ``epoch`` decided ``fates`` (``stamps``: ``time_ns`` at its begin, report,
        Commit and replies queued; ``trace_ids``: the traces recorded, by request id)."""
        if wall - self._purged >= 1.0:
            self._purge(wall)
        floor = self._floor
        for f in fates:
            req = f.item.request
            if req.sent_at <= 0:  # (a request the runtime made, or a client that sent no time)
                continue
            latency = wall - req.sent_at
            if f.committed and latency <= floor:
                continue
            entry = self._entry(epoch, f, stamps, trace_ids.get(req.rid, ""), wall, latency)
            if f.committed:
                self._slowest.append(entry)
                self._slowest.sort(key=lambda e: -e.latency)
                del self._slowest[SLOWEST_KEPT:]
                floor = self._floor = self._slowest[-1].latency \
                    if len(self._slowest) >= SLOWEST_KEPT else -1.0
            else:
                self._aborted.append(entry)
                del self._aborted[:-ABORTED_KEPT]
            self._fresh = True

    @staticmethod
    def _entry(epoch: int, f: Fate[Pending], stamps: tuple[int, int, int, int], trace_id: str,
               wall: float, latency: float) -> wire.SlowRequest:
        began, reported, committing, end = (t / 1e9 for t in stamps)
        req = f.item.request
        outcome = "committed" if f.committed else f"{f.value[0]}: {f.value[1]}"[:200]
        return wire.SlowRequest(
            req.rid, f"{req.operator}.{req.function}"[:200], outcome, wall, epoch, latency,
            max(0.0, began - req.sent_at), max(0.0, reported - began),
            max(0.0, committing - reported), max(0.0, end - committing), f.item.attempts,
            f.fallback, len(f.item.journal), trace_id)

    def _purge(self, wall: float) -> None:
        self._purged = wall
        horizon = wall - WINDOW
        for kept in (self._slowest, self._aborted):
            if kept and min(e.at for e in kept) < horizon:
                kept[:] = [e for e in kept if e.at >= horizon]
                self._fresh = True
        if len(self._slowest) < SLOWEST_KEPT:
            self._floor = -1.0

    def fresh(self, wall: float) -> list[wire.SlowRequest] | None:
        """What changed since the last call: the whole view (None: nothing changed)."""
        self._purge(wall)
        if not self._fresh:
            return None
        self._fresh = False
        return [*self._slowest, *self._aborted]
