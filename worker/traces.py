"""A worker's spans (issue 50): one per epoch it runs, one per traced request it decided —
and its slow-request view (``worker.slowest``), fed from the same timestamps.

Called by ``worker.epochs`` at each epoch's begin, report, Commit and after its replies
are queued: four clock reads an epoch, whether tracing is on or not (the slow-request view
needs them); with tracing on (``tracing.ON``) the spans are made after the commit, when
every outcome is known:

- **the epoch** (``epoch``, with ``sfaas.epoch``): a child of the coordinator's span of the
  same epoch, whose ids both derive from the epoch and its ``now``
  (``sfaas.runtime.tracing.epoch_ids``); children ``execute`` (begin → report: the roots,
  their calls, the epoch-log write) and ``commit`` (the Commit → the replies queued: the
  fallback phase and the re-runs of deviated roots included). Kept when the sampler keeps
  the epoch's trace, when the epoch was slower than ``trace_slow``, or when a request of
  it is kept — so a kept request's link always finds its epoch;
- **a request** (``execute <operator>.<function>``): a child of the caller's
  ``traceparent``, from the epoch's begin to its reply, linked to this worker's epoch
  span. Kept when its caller's trace is sampled (head sampling) — or, tail sampling, when
  it aborted or took longer than ``trace_slow`` from its client's send to its reply,
  at most :data:`TAIL_PER_SECOND` a second. Its trace id becomes the exemplar of its
  bucket of the worker's request-latency histogram (``sfaas_request_latency_seconds``,
  scraped as OpenMetrics).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sfaas.runtime import tracing
from sfaas.runtime.metrics import Buckets
from sfaas.runtime.txn.loop import Fate
from worker.slowest import SlowRequests
from worker.state import Pending

__all__ = ["EpochTraces", "TAIL_PER_SECOND"]

#: Request spans a worker keeps a second by tail sampling (slow or aborted, their trace
#: not sampled); more are not recorded (an overload must not become a span storm).
TAIL_PER_SECOND = 100


class EpochTraces:
    """The begin, report and commit times of the epochs not yet committed here (a worker
    runs one epoch at a time, so at most two: the one committing, the next begun), and
    their spans once committed."""

    def __init__(self, namespace: str, slow: float, latency: Buckets | None = None) -> None:
        self._namespace = namespace
        #: the worker's request-latency histogram: a kept request's trace id becomes its
        #: bucket's exemplar (``/metrics`` in OpenMetrics)
        self._latency = latency
        self._index = -1
        self._slow_ns = int(slow * 1e9)
        self._slow = slow
        #: epoch → [began ns, its Begin's now, reported ns, commit ns]
        self._stamps: dict[int, list[Any]] = {}
        self._second = 0
        self._tail_left = TAIL_PER_SECOND
        #: the slowest and aborted requests of the last minute (the status page's view)
        self.slow = SlowRequests()

    def began(self, epoch: int, now: float) -> None:
        self._stamps[epoch] = [time.time_ns(), now, 0, 0]

    def reported(self, epoch: int) -> None:
        if (s := self._stamps.get(epoch)) is not None:
            s[2] = time.time_ns()

    def committing(self, epoch: int) -> None:
        if (s := self._stamps.get(epoch)) is not None:
            s[3] = time.time_ns()

    def committed(self, epoch: int, fates: Sequence[Fate[Pending]], replay: bool,
                  index: int) -> None:
        """Epoch ``epoch``'s spans on worker ``index``, now its ``fates`` are decided and
        their replies queued."""
        self._index = index
        end, wall = time.time_ns(), time.time()
        stamp = self._stamps.pop(epoch, None)
        for e in [e for e in self._stamps if e < epoch]:  # (rolled back, never committed)
            del self._stamps[e]
        began, now, reported, committing = stamp or (end, None, 0, 0)
        stamps = (began, reported or end, committing or end, end)
        trace_ids: dict[str, str] = {}
        if tracing.ON:
            kept = [(f, why) for f in fates if (why := self._keeps(f, wall)) is not None]
            link = self._epoch(epoch, now, stamps, len(fates), replay,
                               bool(kept)) if now is not None else None
            for f, why in kept:
                trace_ids[f.item.request.rid] = self._request(f, epoch, began, why, replay,
                                                              link, wall)
        self.slow.observe(epoch, fates, stamps, trace_ids, wall)

    def _epoch(self, epoch: int, now: float, stamps: tuple[int, int, int, int], requests: int,
               replay: bool, kept: bool) -> Any:
        """This worker's span of the epoch (the context of it if recorded, else None)."""
        began, reported, committing, end = stamps
        keep = kept or end - began > self._slow_ns
        if not keep and not tracing.root_keeps(tracing.epoch_ids(self._namespace, epoch,
                                                                 now)[0]):
            return None  # (dropped: no span made at all)
        parent = tracing.epoch_parent(self._namespace, epoch, now)
        span = tracing.start("epoch", began, {
            "sfaas.epoch": epoch, "sfaas.worker": self._index, "sfaas.requests": requests,
            "sfaas.replay": replay}, under=parent, keep=keep)
        recorded = tracing.is_recording(span)
        if recorded:
            for name, t0, t1 in (("execute", began, reported), ("commit", committing, end)):
                tracing.record(name, None, t0, {"sfaas.epoch": epoch}, end_ns=t1, under=span,
                               kind="internal")
        tracing.end(span, end)
        return span.get_span_context() if recorded else None

    def _keeps(self, f: Fate[Pending], wall: float) -> str | None:
        """Why ``f``'s span is kept (``head``, ``aborted``, ``slow``), or None."""
        req = f.item.request
        if f.item.partition < 0 and req.traceparent is None:
            return None  # (a request the runtime made: nobody waits for it)
        if tracing.sampled(req.traceparent):
            return "head"
        why = "aborted" if not f.committed else \
            "slow" if req.sent_at > 0 and wall - req.sent_at > self._slow else None
        if why is None:
            return None
        second = int(wall)
        if second != self._second:
            self._second, self._tail_left = second, TAIL_PER_SECOND
        if self._tail_left <= 0:
            return None
        self._tail_left -= 1
        return why

    def _request(self, f: Fate[Pending], epoch: int, began: int, why: str, replay: bool,
                 link: Any, wall: float) -> str:
        """Record ``f``'s span; its trace id (hex)."""
        req = f.item.request
        error = None if f.committed else f"{f.value[0]}: {f.value[1]}"[:200]
        attributes = {
            "sfaas.request_id": req.rid, "sfaas.epoch": epoch, "sfaas.worker": self._index,
            "sfaas.tid": f.tid, "sfaas.attempts": f.item.attempts, "sfaas.replay": replay,
            "sfaas.fallback": f.fallback, "sfaas.kept": why,
            "sfaas.outcome": "committed" if f.committed else "aborted"}
        latency = max(0.0, wall - req.sent_at) if req.sent_at > 0 else None
        if latency is not None:
            attributes["sfaas.latency_ms"] = round(latency * 1000, 3)
        span = tracing.record(f"execute {req.operator}.{req.function}", req.traceparent, began,
                              attributes, error, keep=why != "head", links=[link])
        trace_id = f"{span.get_span_context().trace_id:032x}"
        if latency is not None and self._latency is not None and tracing.is_recording(span):
            self._latency.exemplar(latency, trace_id)
        return trace_id
