"""How a failed call is described: the ``(error_type, reason)`` a client gets, the
exception a caller sees for it, the key check, and the words an abort gets when effects of
its transaction ran before it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sfaas.errors import Abort, BadKey, SfaasError, TransactionAborted, error_class
from sfaas.runtime.txn.effects import SUSPENDED

__all__ = ["AFTER_EFFECTS", "after_effects", "check_key", "describe", "make_error"]

#: How an abort's reason starts to say that effects of its transaction ran before it.
AFTER_EFFECTS = "[after effect(s)"


def describe(exc: BaseException) -> tuple[str, str]:
    """``(error_type, reason)`` of a failure, as it is reported to the client."""
    if isinstance(exc, Abort):
        return "Abort", exc.reason
    if isinstance(exc, TransactionAborted):
        return exc.error_type, exc.reason
    msg = str(exc)
    name = type(exc).__name__
    return name, f"{name}: {msg}" if msg else name


def make_error(error_type: str, reason: str) -> SfaasError:
    """The exception a caller sees for a callee failure ``(error_type, reason)``."""
    if error_type == "Abort":
        return Abort(reason)
    return error_class(error_type)(reason, error_type)


def check_key(key: object, operator: object = "?") -> str:
    """Return ``key`` if it is a non-empty ``str``, else raise :class:`BadKey`."""
    if not isinstance(key, str) or not key:
        raise BadKey(f"key for operator {operator!r} must be a non-empty str, got {key!r:.80}")
    if key[0] == "\x00":
        raise BadKey(f"key for operator {operator!r} must not start with '\\x00' (reserved for "
                     f"the runtime's timers and actions), got {key!r:.80}")
    return key


def after_effects(journal: Mapping[str, Any] | None, etype: str, reason: str) -> str:
    """An abort's ``reason``, naming the effects in the transaction's ``journal`` — they ran
    before the abort and are not undone (docs/guide/outside-world.md)."""
    if not journal or etype == SUSPENDED or AFTER_EFFECTS in reason:
        return reason
    keys = ", ".join(sorted(journal))
    return (f"{reason} {AFTER_EFFECTS} {keys:.300} ran before this abort and are not undone: "
            "compensate with ctx.after_commit]")
