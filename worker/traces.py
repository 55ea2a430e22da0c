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
  scraped as OpenMetrics). It begins at the Begin of the first epoch the request ran in;
  its children ``re-run`` (each later epoch it ran in), ``fallback`` (each fallback phase
  it re-ran in) and ``re-run alone`` come from stamps kept only with tracing on. Its span
  id is known before it is made (``tracing.request_span_id``), so spans recorded earlier,
  elsewhere, are its children:
- **a call served for a peer** (``call <operator>.<function>``, :func:`call_span`), when
  the ``wire.Call`` carries the root's context (:class:`TraceContexts`: its trace sampled);
- **an effect** (``effect <function>``), and — in traces of their own, linked to it — an
  ``after_commit`` action and a fired timer (:class:`WorldSpans`, ``worker.world``);
- and under the worker's epoch span, ``epoch-log write`` and ``fallback phase``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sfaas.runtime import ports, tracing, wire
from sfaas.runtime.metrics import Buckets
from sfaas.runtime.txn import internal
from sfaas.runtime.txn.loop import Fate
from worker.slowest import SlowRequests
from worker.state import Pending

__all__ = ["EpochTraces", "TAIL_PER_SECOND", "TraceContexts", "WorldSpans", "call_span",
           "MAX_HELD"]

#: Request spans a worker keeps a second by tail sampling (slow or aborted, their trace
#: not sampled); more are not recorded (an overload must not become a span storm).
TAIL_PER_SECOND = 100
#: Requests whose earlier runs (re-runs, parked at an effect) a worker remembers for their
#: spans, and timers whose creator's trace it remembers; above, it forgets them all.
MAX_HELD = 10_000

#: indices of an epoch's stamps (``EpochTraces._stamps``), each ``time.time_ns()``
_BEGAN, _NOW, _REPORTED, _COMMITTING, _LOG0, _LOG1, _FB0, _FB1, _ALONE1 = range(9)


class TraceContexts:
    """With tracing on: the trace context under which this worker's spans of a
    transaction's work go — its calls served here, its effects, the actions and timers it
    made — by tid, for the current epoch (until the next Begin); only transactions whose
    root's trace is sampled. A root here: the span its ``execute`` span will have
    (``tracing.request_span_id``); a peer's call: what the call carried
    (``wire.Call.traceparent``). ``timers``: a timer record's key → the context of the
    transaction that set it (its firing links to it), at most :data:`MAX_HELD`."""

    def __init__(self) -> None:
        self.of: dict[int, str] = {}
        self.timers: dict[str, str] = {}

    def begin(self, batch: Sequence[tuple[int, Pending]], recovery: int) -> None:
        """Epoch begins with ``batch`` (roots of this worker) after ``recovery`` recoveries."""
        self.of = of = {}
        for tid, item in batch:
            tp = item.request.traceparent
            if tracing.sampled(tp):
                assert tp is not None
                of[tid] = tracing.child_of(tp, tracing.request_span_id(item.request.rid,
                                                                       recovery))

    def joined(self, msg: wire.Call) -> None:
        """A peer's call for a traced transaction runs here."""
        if msg.traceparent is not None:
            self.of[msg.tid] = msg.traceparent

    def on_record(self, key: str, value: bytes | None) -> None:
        """A runtime record was applied here: a timer set by a traced transaction."""
        if value is not None and key.startswith(internal.TIMER) and self.of:
            tp = self.of.get(_tid_of(key, 1))
            if tp is not None:
                if len(self.timers) >= MAX_HELD:
                    self.timers.clear()
                self.timers[key] = tp

    def of_record(self, key: str) -> str | None:
        """The context of the transaction that wrote action record ``key`` (this epoch)."""
        return self.of.get(_tid_of(key, 0)) if self.of else None


def _tid_of(key: str, field: int) -> int:
    """The tid in a timer's (``field`` 1) or an action's (0) record key
    (``internal.timer_key``, ``internal.action_key``); -1: none."""
    try:
        return int(key[2:key.index("\x00", 2)].split(".")[field], 16)
    except (ValueError, IndexError):
        return -1


def call_span(msg: wire.Call, start_ns: int, ok: bool, value: Any, index: int) -> None:
    """This worker served a peer's call of a traced transaction (its root's trace sampled:
    ``msg.traceparent``): its span, a child of the root request's ``execute`` span."""
    assert msg.traceparent is not None
    tracing.record(f"call {msg.operator}.{msg.function}", msg.traceparent, start_ns, {
        "sfaas.epoch": msg.epoch, "sfaas.tid": msg.tid, "sfaas.worker": index,
        "sfaas.caller": msg.src, "sfaas.fallback": msg.fallback, "sfaas.depth": msg.depth},
        None if ok else f"{value[0]}: {value[1]}"[:200], keep=True)


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
        #: epoch → its stamps (``time.time_ns()``, 0: not taken) at the indices ``_BEGAN``
        #: …; ``_NOW``: its Begin's now
        self._stamps: dict[int, list[Any]] = {}
        self._second = 0
        self._tail_left = TAIL_PER_SECOND
        #: with tracing on: request id → its runs in earlier epochs that did not decide it
        #: (``(epoch, began, ended, why, fallback began, fallback ended)``), for its spans
        self._runs: dict[str, list[tuple[int, int, int, str, int, int]]] = {}
        self._recovery = 0
        #: timer record key → the context of the transaction that set it
        #: (``TraceContexts.timers``, shared)
        self.timers: dict[str, str] = {}
        #: the slowest and aborted requests of the last minute (the status page's view)
        self.slow = SlowRequests()

    def began(self, epoch: int, now: float) -> None:
        self._stamps[epoch] = [time.time_ns(), now, 0, 0, 0, 0, 0, 0, 0]

    def reported(self, epoch: int) -> None:
        if (s := self._stamps.get(epoch)) is not None:
            s[_REPORTED] = time.time_ns()

    def committing(self, epoch: int) -> None:
        if (s := self._stamps.get(epoch)) is not None:
            s[_COMMITTING] = time.time_ns()

    def logged(self, epoch: int, start_ns: int) -> None:
        """With tracing on: epoch ``epoch``'s batch, handed to Kafka at ``start_ns``, is in
        the epoch log now."""
        if (s := self._stamps.get(epoch)) is not None:
            s[_LOG0], s[_LOG1] = start_ns, time.time_ns()

    def phase(self, epoch: int, start_ns: int, ended_ns: int) -> None:
        """With tracing on: epoch ``epoch``'s cross-worker fallback phase ran from
        ``start_ns`` to ``ended_ns``, and its roots that deviated there until now."""
        if (s := self._stamps.get(epoch)) is not None:
            s[_FB0], s[_FB1], s[_ALONE1] = start_ns, ended_ns, time.time_ns()

    def committed(self, epoch: int, fates: Sequence[Fate[Pending]], replay: bool,
                  index: int, batch: Sequence[tuple[int, Pending]] = (),
                  conflicts: Collection[int] = (), recovery: int = 0) -> None:
        """Epoch ``epoch``'s spans on worker ``index``, now its ``fates`` are decided and
        their replies queued; ``batch``: the epoch's (its items not in ``fates`` run again
        later: ``conflicts`` re-run, the others wait for an effect); ``recovery``: the
        worker's recovery count."""
        self._index = index
        end, wall = time.time_ns(), ports.current().clock.time()
        stamp = self._stamps.pop(epoch, None)
        for e in [e for e in self._stamps if e < epoch]:  # (rolled back, never committed)
            del self._stamps[e]
        if stamp is None:
            stamp = [end, None, 0, 0, 0, 0, 0, 0, 0]
        began = stamp[_BEGAN]
        stamps = (began, stamp[_REPORTED] or end, stamp[_COMMITTING] or end, end)
        trace_ids: dict[str, str] = {}
        if tracing.ON:
            self._held_over(epoch, stamp, end, fates, batch, conflicts, recovery)
            kept = [(f, why) for f in fates if (why := self._keeps(f, wall)) is not None]
            link = self._epoch(epoch, stamp, end, len(fates), replay,
                               bool(kept)) if stamp[_NOW] is not None else None
            for f, why in kept:
                trace_ids[f.item.request.rid] = self._request(f, epoch, stamp, why, replay,
                                                              link, wall)
            if self._runs:
                for f in fates:
                    self._runs.pop(f.item.request.rid, None)
            if self.timers:
                self._timers(epoch, began, fates)
        self.slow.observe(epoch, fates, stamps, trace_ids, wall)

    def _held_over(self, epoch: int, stamp: list[Any], end: int, fates: Sequence[Fate[Pending]],
                   batch: Sequence[tuple[int, Pending]], conflicts: Collection[int],
                   recovery: int) -> None:
        """Remember the runs of ``batch`` that ``fates`` do not decide (a conflict: they
        run again; or parked at an effect), for the spans of their requests."""
        runs = self._runs
        if recovery != self._recovery:  # (the epochs they ran in were rolled back)
            self._recovery = recovery
            runs.clear()
        if len(fates) == len(batch):
            return
        decided = {f.tid for f in fates}
        for tid, item in batch:
            if tid not in decided:
                if len(runs) >= MAX_HELD:
                    runs.clear()
                why = "conflict" if tid in conflicts else "effect"
                runs.setdefault(item.request.rid, []).append(
                    (epoch, stamp[_BEGAN], end, why, stamp[_FB0], stamp[_FB1]))

    def _epoch(self, epoch: int, stamp: list[Any], end: int, requests: int,
               replay: bool, kept: bool) -> Any:
        """This worker's span of the epoch (the context of it if recorded, else None)."""
        now, began = stamp[_NOW], stamp[_BEGAN]
        reported, committing = stamp[_REPORTED] or end, stamp[_COMMITTING] or end
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
            phases = [("execute", began, reported), ("commit", committing, end)]
            if stamp[_LOG0]:
                phases.append(("epoch-log write", stamp[_LOG0], stamp[_LOG1]))
            if stamp[_FB0]:
                phases.append(("fallback phase", stamp[_FB0], stamp[_FB1]))
            for name, t0, t1 in phases:
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

    def _request(self, f: Fate[Pending], epoch: int, stamp: list[Any], why: str,
                 replay: bool, link: Any, wall: float) -> str:
        """Record ``f``'s span — from the Begin of the first epoch it ran in — and its
        re-runs' and fallback phases' spans under it; its trace id (hex)."""
        req = f.item.request
        error = None if f.committed else f"{f.value[0]}: {f.value[1]}"[:200]
        runs = self._runs.get(req.rid, [])
        attributes = {
            "sfaas.request_id": req.rid, "sfaas.epoch": epoch, "sfaas.worker": self._index,
            "sfaas.tid": f.tid, "sfaas.attempts": f.item.attempts, "sfaas.replay": replay,
            "sfaas.fallback": f.fallback, "sfaas.kept": why,
            "sfaas.outcome": "committed" if f.committed else "aborted"}
        latency = max(0.0, wall - req.sent_at) if req.sent_at > 0 else None
        if latency is not None:
            attributes["sfaas.latency_ms"] = round(latency * 1000, 3)
        if runs:
            attributes["sfaas.first_epoch"] = runs[0][0]
        span_id = tracing.request_span_id(req.rid, self._recovery) \
            if req.traceparent is not None else None
        span = tracing.record(f"execute {req.operator}.{req.function}", req.traceparent,
                              runs[0][1] if runs else stamp[_BEGAN], attributes, error,
                              keep=why != "head", links=[link], span_id=span_id)
        if tracing.is_recording(span) and (runs or f.fallback):
            self._reruns(span, f, epoch, stamp, runs)
        trace_id = f"{span.get_span_context().trace_id:032x}"
        if latency is not None and self._latency is not None and tracing.is_recording(span):
            self._latency.exemplar(latency, trace_id)
        return trace_id

    def _reruns(self, span: Any, f: Fate[Pending], epoch: int, stamp: list[Any],
                runs: list[tuple[int, int, int, str, int, int]]) -> None:
        """Under request ``f``'s span: a ``re-run`` for each epoch it ran in after its
        first (a conflict or an effect made it run again), a ``fallback`` for each
        fallback phase it re-ran in, a ``re-run alone`` when it ran once more after one."""
        end = time.time_ns()
        this = (epoch, stamp[_BEGAN], end, "", stamp[_FB0], stamp[_FB1])
        every = [*runs, this]
        for attempt, (e, t0, t1, why, fb0, fb1) in enumerate(every):
            if attempt:
                tracing.record("re-run", None, t0, {
                    "sfaas.epoch": e, "sfaas.attempt": attempt,
                    "sfaas.after": every[attempt - 1][3]}, end_ns=t1, under=span,
                    kind="internal")
            last = attempt == len(runs)
            if fb0 and (f.fallback if last else why == "conflict"):
                outcome = "again later" if not last else \
                    "committed" if f.committed else "aborted"
                tracing.record("fallback", None, fb0, {
                    "sfaas.epoch": e, "sfaas.attempt": attempt, "sfaas.outcome": outcome},
                    end_ns=fb1, under=span, kind="internal")
        if f.fallback and not stamp[_FB0]:  # (a local fallback phase: within the commit)
            tracing.record("fallback", None, stamp[_COMMITTING] or end, {
                "sfaas.epoch": epoch, "sfaas.attempt": len(runs)}, end_ns=end, under=span,
                kind="internal")
        if f.alone and stamp[_FB1]:
            tracing.record("re-run alone", None, stamp[_FB1], {
                "sfaas.epoch": epoch, "sfaas.attempt": len(runs)}, end_ns=stamp[_ALONE1],
                under=span, kind="internal")

    def _timers(self, epoch: int, began: int, fates: Sequence[Fate[Pending]]) -> None:
        """A span for each timer that fired in this epoch and was set by a traced
        transaction, linked to that transaction's span (it runs in a trace of its own)."""
        for f in fates:
            req = f.item.request
            if req.function != internal.FIRE_TIMER or not req.args:
                continue
            tp = self.timers.pop(str(req.args[0]), None)
            if tp is not None:
                error = None if f.committed else f"{f.value[0]}: {f.value[1]}"[:200]
                tracing.record(f"timer {req.operator}", None, began, {
                    "sfaas.epoch": epoch, "sfaas.worker": self._index, "sfaas.tid": f.tid},
                    error, keep=True, links=[tracing.link_to(tp)], kind="internal")


class WorldSpans:
    """With tracing on, the spans of what a traced transaction does to the world
    (``worker.world``): each ``ctx.run`` effect run here, a child of the request's span
    (``effect <name>``); each ``after_commit`` action, in a trace of its own linked to it
    (``after_commit <name>``: it runs after the commit, on its own time). What
    ``sfaas.runtime.txn.effects.EffectSpans`` and ``…actions.ActionSpans`` ask."""

    def __init__(self, contexts: TraceContexts, index: Callable[[], int]) -> None:
        self._contexts = contexts
        self._index = index

    def effect_context(self, tid: int) -> str | None:
        return self._contexts.of.get(tid)

    def effect_ran(self, context: Any, key: str, name: str, start_ns: int,
                   outcome: tuple[bool, Any]) -> None:
        ok, value = outcome
        tracing.record(f"effect {name}", context, start_ns, {
            "sfaas.effect_key": key[:200], "sfaas.worker": self._index()},
            None if ok else f"{value[0]}: {value[1]}"[:200], keep=True, kind="internal")

    def action_context(self, key: str) -> str | None:
        return self._contexts.of_record(key)

    def action_ran(self, context: Any, name: str, start_ns: int, tries: int) -> None:
        tracing.record(f"after_commit {name}", None, start_ns, {
            "sfaas.worker": self._index(), "sfaas.tries": tries}, keep=True,
            links=[tracing.link_to(context)], kind="internal")
