"""Worker ↔ worker: calls to keys another worker owns, their results, and the fallback
phase's notices (``worker.calls``, ``worker.protocols.fallback``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sfaas.runtime.protocols.base import Message

__all__ = ["Hello", "Call", "Finished", "Result", "EffectDone"]


@dataclass(slots=True)
class Hello(Message):
    """First message on a peer channel: the sender's worker index and the generation of
    its assignment (``wire.Assign.generation``); a peer whose membership names a newer
    generation for that index refuses the channel (the sender was fenced)."""

    TAG: ClassVar[int] = 20
    index: int
    generation: int = 0


@dataclass(slots=True)
class Call(Message):
    """Run ``operator.function(key, *args)`` for transaction ``tid`` and answer with a Result.

    ``recovery``: how many recoveries the sender went through; a call made before a
    recovery the receiver already went through is stale (its epoch is being replayed) and
    is dropped.
    """

    TAG: ClassVar[int] = 21
    OPTIONAL: ClassVar[int] = 1  # (traceparent)
    epoch: int
    src: int
    call_id: int
    tid: int
    now: float
    operator: str
    key: str
    function: str
    args: list[Any]
    depth: int
    recovery: int = 0
    #: a call of the cross-worker fallback phase (``worker.protocols.fallback``), not of the
    #: epoch's execution: served once the receiver's phase began, outside the counters
    fallback: bool = False
    #: the prefix of the transaction's effect keys (its request id, or an idempotent
    #: request's scope: ``sfaas.runtime.txn.effects.effect_scope``) and its journal of
    #: ``ctx.run`` outcomes (effect key → ``[ok, value]``): a function here sees the same ones
    scope: str = ""
    journal: dict[str, Any] = field(default_factory=dict)
    #: the W3C trace context the callee's span of this call is a child of (the root
    #: request's span, ``worker.traces``): only with tracing on and the root's trace
    #: sampled — else None, and absent on the wire
    traceparent: str | None = None


@dataclass(slots=True)
class EffectDone(Message):
    """Worker → every worker: effect ``key`` of transaction ``tid``, which a run on ``src``
    suspended at, finished with ``[ok, value]`` (``value``: the result, or ``[error type,
    message]``). The worker whose request it is adds it to the request's journal and lets
    the parked run go on; the others ignore it."""

    TAG: ClassVar[int] = 31
    src: int
    tid: int
    key: str
    ok: bool
    value: Any


@dataclass(slots=True)
class Finished(Message):
    """Worker → every peer: the fallback phase's re-run of ``tid`` (a root of ``src``) is
    over; apply its writes if ``committed``, then let the higher tids waiting for it go on."""

    TAG: ClassVar[int] = 30
    epoch: int
    src: int
    tid: int
    committed: bool
    recovery: int


@dataclass(slots=True)
class Result(Message):
    """The outcome of a Call: ``ok`` and the value, or ``[error_type, reason]``."""

    TAG: ClassVar[int] = 22
    call_id: int
    ok: bool
    value: Any
