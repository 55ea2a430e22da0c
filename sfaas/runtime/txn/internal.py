"""The runtime's own records in the operators' stores: durable timers and post-commit actions.

Both are *state*: written by the transaction that creates them, in the store partition of
the key whose function created them, so they commit or vanish with it and are snapshotted
in rounds, restored by recoveries, followed by standbys and moved by rescales exactly like
the values next to them. Their keys start with ``"\\x00"``, which user keys may not
(:func:`sfaas.runtime.txn.engine.check_key`), and end with the owning user key, whose
partition they share (:func:`sfaas.runtime.partitioning.partition_of`)::

    "\\x00t" + due (16 hex digits, µs) + "." + tid (hex) + "." + n + "\\x00" + owner key   a timer
    "\\x00a" + tid (hex) + "." + n + "\\x00" + owner key                                  an action
    "\\x00i" + sha256(function, idempotency key) (32 hex) + "\\x00" + owner key          an outcome

A timer's value is ``[operator, key, function, args, due]`` (the call it makes); an
action's ``[function name, args, action key]`` (``module:qualname`` of a module-level
function, so it can run again after a restart); an idempotent request's outcome
``[ok, result or [error type, reason], time]``. Timer keys sort by due time within a
store.

The runtime changes them through *internal functions* — names starting with ``"\\x00"``,
which no client request can reach (:meth:`Engine.run_root` refuses them unless the
runtime made the request): firing a timer, cancelling one, dropping one whose call
aborted, and deleting an action that ran.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import msgpack

from sfaas.errors import BadArguments

__all__ = [
    "TIMER", "ACTION", "FIRE_TIMER", "CANCEL_TIMER", "DROP_TIMER", "ACTION_DONE",
    "timer_key", "action_key", "idem_key", "IDEM", "IDEM_ABORT", "IDEM_EXPIRE", "owner_key",
    "due_of", "timer_id", "parse_timer_id",
    "is_internal", "INTERNAL_FUNCTIONS", "RuntimeCall", "runtime_rid",
]

TIMER = "\x00t"
ACTION = "\x00a"
IDEM = "\x00i"
TIMER_B = TIMER.encode()
ACTION_B = ACTION.encode()

#: internal functions (run on the timer's or action's owner key)
FIRE_TIMER = "\x00fire_timer"
CANCEL_TIMER = "\x00cancel_timer"
DROP_TIMER = "\x00drop_timer"
ACTION_DONE = "\x00action_done"
IDEM_ABORT = "\x00idem_abort"
IDEM_EXPIRE = "\x00idem_expire"
INTERNAL_FUNCTIONS = (FIRE_TIMER, CANCEL_TIMER, DROP_TIMER, ACTION_DONE, IDEM_ABORT, IDEM_EXPIRE)


class RuntimeCall(str):
    """The operator of a request the runtime made (a timer firing, an action's cleanup):
    the only roots that may name an internal function (no decoded string is one)."""

    __slots__ = ()


def runtime_rid(function: str, key: str) -> str:
    """The request id of the runtime's request ``function(key)``: what it does, readable
    (no ``\\x00``: effect and action keys start with it), the same after a replay."""
    return f"{function[1:]}:{key[1:].replace(chr(0), '/')}"


def is_internal(name: str) -> bool:
    """Is ``name`` (a key or a function) the runtime's own?"""
    return name[:1] == "\x00"


def timer_key(owner: str, due: float, tid: int, n: int) -> str:
    """The key of a timer due at ``due`` (seconds), created by ``tid``'s ``n``-th effect
    on key ``owner``."""
    return f"{TIMER}{round(due * 1_000_000):016x}.{tid:x}.{n}\x00{owner}"


def action_key(owner: str, tid: int, n: int) -> str:
    """The key of the post-commit action ``tid`` registered ``n``-th on key ``owner``."""
    return f"{ACTION}{tid:x}.{n}\x00{owner}"


def idem_key(owner: str, function: str, idempotency_key: str) -> str:
    """The key of the outcome of ``function`` on ``owner`` for an idempotency key."""
    import hashlib

    digest = hashlib.sha256(f"{function}\x00{idempotency_key}".encode()).hexdigest()[:32]
    return f"{IDEM}{digest}\x00{owner}"


def owner_key(key: str) -> str:
    """The user key an internal key belongs to (its partition's)."""
    return key[key.index("\x00", 1) + 1:]


def due_of(key: str) -> float:
    """A timer key's due time, in seconds."""
    return int(key[2:18], 16) / 1_000_000


def timer_id(operator: str, key: str) -> str:
    """The public id of the timer stored at ``key`` of ``operator``."""
    raw = msgpack.packb([operator, key], use_bin_type=True)
    return "tm-" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_timer_id(tid: object) -> tuple[str, str]:
    """``(operator, timer key)`` of a timer id, or :class:`BadArguments` naming it."""
    try:
        assert isinstance(tid, str) and tid.startswith("tm-")
        body = tid[3:]
        operator, key = msgpack.unpackb(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)),
                                        raw=False)
        assert isinstance(operator, str) and isinstance(key, str) and key.startswith(TIMER)
        owner_key(key)
    except Exception:
        raise BadArguments(f"not a timer id (ctx.send_after returns them): {tid!r:.80}") from None
    return operator, key


async def fire_timer(ctx: Any, eng: Any, depth: int, key: str) -> Any:
    """Deliver the timer stored at ``key`` (nothing if it was cancelled meanwhile): delete it
    and make its call, in this one transaction."""
    tid, op = ctx.tid, ctx.operator
    record = eng.read(tid, op, key, None)
    if record is None:
        return None
    eng.remove(tid, op, key)
    operator, target, function, args, _due = record
    return await eng.call(tid, ctx.now(), operator, target, function, args, depth + 1)


async def remove_record(ctx: Any, eng: Any, _depth: int, key: str) -> bool:
    """Delete the runtime record at ``key`` (a cancelled timer, a timer whose call aborted,
    an action that ran); whether there was one."""
    tid, op = ctx.tid, ctx.operator
    found = eng.read(tid, op, key, None) is not None
    if found:
        eng.remove(tid, op, key)
    return found


async def record_abort(ctx: Any, eng: Any, _depth: int, key: str, error_type: str, reason: str,
                       now: float) -> bool:
    """Keep the abort of an idempotent request as its outcome (unless one is kept already:
    a duplicate that got it), with a timer that drops it when its window ends."""
    tid, op = ctx.tid, ctx.operator
    if eng.read(tid, op, key, None) is not None:
        return False
    eng.write(tid, op, key, [False, [error_type, reason], now])
    owner = owner_key(key)
    eng.set_timer(tid, ctx.now(), op, owner, eng.next_seq(tid, op, owner),
                  max(0.0, now + eng.idempotency_retention - ctx.now()),
                  (op, owner, IDEM_EXPIRE), [key])
    return True


async def expire_outcome(ctx: Any, eng: Any, _depth: int, key: str) -> bool:
    """Drop an idempotent request's kept outcome whose window ended (not one a later request
    wrote since, whose own timer drops it)."""
    tid, op = ctx.tid, ctx.operator
    kept = eng.read(tid, op, key, None)
    if kept is None or ctx.now() - float(kept[2]) < eng.idempotency_retention:
        return False
    eng.remove(tid, op, key)
    return True


#: name → the coroutine function (each takes the context, the engine running it, the call's
#: depth and the record's key, then its own arguments: ``Engine.run``)
IMPLEMENTATIONS: dict[str, Any] = {
    FIRE_TIMER: fire_timer, CANCEL_TIMER: remove_record, DROP_TIMER: remove_record,
    ACTION_DONE: remove_record, IDEM_ABORT: record_abort, IDEM_EXPIRE: expire_outcome,
}


def function_name(fn: Any) -> str:
    """``module:qualname`` of a module-level function, or :class:`BadArguments` saying why a
    post-commit action cannot be ``fn`` (it must be found again after a restart)."""
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    if not callable(fn) or not isinstance(module, str) or not isinstance(qual, str) \
            or "<" in qual:
        raise BadArguments(
            f"ctx.after_commit needs a module-level function (it is stored by name and may run "
            f"after a restart), got {fn!r:.80}")
    name = f"{module}:{qual}"
    if resolve_function(name, check=False) is not fn:
        raise BadArguments(f"ctx.after_commit: {name} does not name {fn!r:.80} (define the "
                           "function at module level, not inside another one)")
    return name


def resolve_function(name: str, check: bool = True) -> Any:
    """The function ``module:qualname`` names (``None`` if it cannot be found and not
    ``check``)."""
    import importlib

    try:
        module, qual = name.split(":", 1)
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        if not check:
            return None
        raise LookupError(f"post-commit action {name!r} cannot be found: {exc}") from None
    return obj


def action_record(name: str, args: Sequence[Any], key: str) -> list[Any]:
    """The stored value of an action."""
    return [name, list(args), key]
