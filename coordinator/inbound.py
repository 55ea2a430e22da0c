"""What the coordinator accepts from a registered worker, beyond what decodes.

``wire.decode_frame`` has checked every field's type; this checks a message against the
membership: a worker speaks only for its own slot, and its call counters cover every
worker. A message that fails is a protocol violation
(:class:`~sfaas.runtime.wire.ProtocolError`): the coordinator treats that worker as lost, like
one whose channel closed, and recovers.
"""

from __future__ import annotations

from sfaas.runtime import wire

__all__ = ["check"]


def check(msg: wire.Message, index: int, n_workers: int) -> None:
    """Raise :class:`~sfaas.runtime.wire.ProtocolError` if worker ``index`` (of ``n_workers``)
    may not send ``msg``."""
    claimed = getattr(msg, "index", index)
    if not isinstance(msg, wire.Register) and claimed != index:
        raise wire.ProtocolError(f"worker {index} sent {type(msg).__name__} as worker {claimed}")
    if isinstance(msg, wire.Report) and not len(msg.sent) == len(msg.served) == n_workers:
        raise wire.ProtocolError(f"worker {index}'s report counts calls of {len(msg.sent)} "
                                 f"workers, not {n_workers}")
