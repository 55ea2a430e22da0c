"""What an epoch's progress is told to: the worker's metrics and its spans.

:class:`EpochWatch` is the one observer both halves of an epoch (``worker.epochs`` begins,
executes and reports it; ``worker.commits`` commits it) tell what happened when: the
metrics (``worker.metrics``: the requests' ages, the execute phase, the latencies) and the
spans and slow-request view (``worker.traces``).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Sequence

from sfaas.runtime import wire
from sfaas.runtime.txn.loop import Fate
from worker.metrics import WorkerMetrics
from worker.state import Pending
from worker.traces import EpochTraces

__all__ = ["EpochWatch"]


class EpochWatch:
    """The metrics and spans of this worker's epochs (see the module docstring)."""

    def __init__(self, metrics: WorkerMetrics, traces: EpochTraces) -> None:
        self._metrics = metrics
        self._traces = traces

    def began(self, begin: wire.Begin, batch: Sequence[tuple[int, Pending]]) -> None:
        """Epoch ``begin.epoch`` began with ``batch``: each root's first run ends its wait."""
        self._traces.began(begin.epoch, begin.now)
        for _, item in batch:
            if item.attempts == 0:
                self._metrics.aged(begin.now - item.request.sent_at)

    def logged(self, epoch: int, start_ns: int) -> None:
        """With tracing on: the epoch's batch, handed to Kafka at ``start_ns``, is durable."""
        self._traces.logged(epoch, start_ns)

    def reported(self, epoch: int, started: float) -> None:
        """This worker's roots of ``epoch`` ran (``started``: ``perf_counter`` at Begin)."""
        self._metrics.executed(started)
        self._traces.reported(epoch)

    def committing(self, epoch: int) -> None:
        self._traces.committing(epoch)

    def phase(self, epoch: int, start_ns: int, ended_ns: int) -> None:
        """With tracing on: the epoch's cross-worker fallback phase and its re-runs alone."""
        self._traces.phase(epoch, start_ns, ended_ns)

    def committed(self, epoch: int, fates: Sequence[Fate[Pending]], *, answered: Container[str],
                  started: float, replay: bool, index: int, batch: Sequence[tuple[int, Pending]],
                  conflicts: Collection[int], recovery: int) -> None:
        """Epoch ``epoch``'s ``fates`` are decided and their replies queued (``started``:
        ``perf_counter`` when its Commit arrived; see ``EpochTraces.committed``)."""
        self._metrics.committed(fates, answered, started)
        self._traces.committed(epoch, fates, replay, index, batch, conflicts, recovery)
