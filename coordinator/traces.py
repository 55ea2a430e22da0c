"""The coordinator's spans (issue 50): each epoch, each recovery, each snapshot round.

Called only when tracing is on (``if tracing.ON:`` at each call site), after the fact,
from timestamps the protocols take anyway, so a span costs nothing while the protocol
runs:

- **an epoch** (``coordinator.epochs``): the root of the epoch's trace, whose ids every
  process derives from the epoch and its ``now`` (``sfaas.runtime.tracing.epoch_ids``), so
  each worker's epoch span is its child; a child ``barrier`` (Begin sent → every report
  in) and ``commit`` (the votes merged → the Commit sent). Kept as the sampler decides for
  the epoch's trace, and always when the epoch took longer than ``trace_slow``;
- **a recovery** (``coordinator.protocols.recovery``): one span, a child per step
  (``detect+restart``, ``restore``, ``replay``), always kept (they are rare);
- **a snapshot round** (``coordinator.protocols.rounds``): the marker → the workers'
  reports → the manifest published, always kept (one every ``snapshot_interval``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sfaas.runtime import tracing

__all__ = ["configure", "epoch_span", "steps_span"]

#: ``(namespace, trace_slow)`` of this process (:func:`configure`)
_config: tuple[str, float] = ("sfaas", 0.1)


def configure(namespace: str, slow: float) -> None:
    """The cluster's namespace (in each epoch trace's ids) and the ``trace_slow`` setting."""
    global _config
    _config = (namespace, slow)


def epoch_span(epoch: int, now: float, stamps: Sequence[int],
               attributes: Mapping[str, Any]) -> None:
    """Epoch ``epoch`` (begun at ``now``, its Begin's): ``stamps`` are ``time.time_ns()``
    at its Begin sent, every report in, its Commit sent; kept whatever the sampler says
    when it took longer than ``trace_slow``."""
    namespace, slow = _config
    began, reported, ended = stamps
    keep = ended - began > slow * 1e9
    ids = tracing.epoch_ids(namespace, epoch, now)
    if not keep and not tracing.root_keeps(ids[0]):
        return  # (dropped: no span made at all)
    root = tracing.start("epoch", began, {"sfaas.epoch": epoch, **attributes}, keep=keep,
                         ids=ids)
    if tracing.is_recording(root):
        tracing.record("barrier", None, began, {"sfaas.epoch": epoch}, end_ns=reported,
                       under=root, kind="internal")
        tracing.record("commit", None, reported, {"sfaas.epoch": epoch}, end_ns=ended,
                       under=root, kind="internal")
    tracing.end(root, ended)


def steps_span(name: str, start_ns: int, steps: Sequence[tuple[str, int, int]],
               attributes: Mapping[str, Any], error: str | None = None) -> None:
    """A kept span ``name`` from ``start_ns`` to now, with a child per step
    ``(name, start ns, end ns)`` — which step of a recovery or a round took the time."""
    root = tracing.start(name, start_ns, attributes, keep=True)
    for step, t0, t1 in steps:
        tracing.record(step, None, t0, {}, end_ns=t1, under=root, kind="internal", keep=True)
    tracing.end(root, error=error)
