"""One exception hierarchy for everything ``sfaas`` raises.

``Abort`` is what user functions raise to roll a transaction back. ``TransactionAborted`` is
what a caller (``Client.call``, ``LocalRunner.call``) receives when a transaction did not
commit; the validation errors (unknown operator/function, bad arguments, unserializable
values, bad keys) are subclasses of it, so ``except TransactionAborted`` catches every
failed request, while ``except UnknownFunction`` can single one kind out.
"""

from __future__ import annotations

__all__ = [
    "SfaasError",
    "Abort",
    "TransactionAborted",
    "UnknownOperator",
    "UnknownFunction",
    "BadArguments",
    "BadKey",
    "NotSerializable",
    "BadRequest",
    "NotAwaited",
    "NondeterminismError",
    "EffectThenAbortWarning",
    "SchemaTooNew",
    "UpcastFailed",
    "BadStoredValue",
    "ConfigError",
    "AuthenticationError",
    "ChannelClosed",
    "ClusterError",
    "RequestTimeout",
    "ReplayError",
    "DiskFailed",
    "error_class",
    "reply_error",
    "EXIT_RETIRED",
    "EXIT_RECOVERY_STOPPED",
    "EXIT_FENCED",
    "EXIT_START_AGAIN",
    "StartAgain",
    "RecoveryStopped",
]

#: Exit code of a worker a rescale retired (its supervisor does not restart it).
EXIT_RETIRED = 75
#: Exit code of a coordinator whose recovery failed the same way three times in a row (its
#: supervisor does not restart it: a restart would fail the same way).
EXIT_RECOVERY_STOPPED = 76
#: Exit code of a worker that fenced itself: its lease from the coordinator ran out (a
#: paused or cut-off process the cluster has replaced, ``worker.fence``). Its supervisor
#: restarts it; the new process registers as a new member.
EXIT_FENCED = 77
#: Exit code of a process that could not join because the cluster changed under it
#: (:class:`StartAgain`). Its supervisor restarts it and does not count it as a crash.
EXIT_START_AGAIN = 78


class SfaasError(Exception):
    """Base class of every error the sfaas runtime raises."""


class Abort(SfaasError):
    """Raised by a user function to roll back the whole transaction; ``reason`` reaches the
    client."""

    def __init__(self, reason: str = "aborted") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class TransactionAborted(SfaasError):
    """A request's transaction rolled back; ``reason`` says why, ``error_type`` what raised it."""

    #: The function's traceback text when it raised a plain exception (``LocalRunner``
    #: always attaches it; a worker logs it where the function ran).
    traceback: str | None = None

    def __init__(self, reason: str, error_type: str | None = None) -> None:
        super().__init__(reason)
        self.reason = str(reason)
        self.error_type = error_type or type(self).__name__


class UnknownOperator(TransactionAborted, LookupError):
    """The request or a ``ctx.call`` named an operator the app does not define."""


class UnknownFunction(TransactionAborted, LookupError):
    """The request or a ``ctx.call`` named a function the operator does not define."""


class BadArguments(TransactionAborted, TypeError):
    """The arguments do not fit the function's signature (wrong arity, unknown keyword)."""


class BadKey(TransactionAborted, TypeError):
    """A key is not a non-empty ``str``."""


class NotSerializable(TransactionAborted, TypeError):
    """A value (argument, state, result) is not msgpack-able
    (None/bool/int/float/str/bytes/list/dict)."""


class BadRequest(TransactionAborted, ValueError):
    """A request record could not be decoded."""


class NotAwaited(TransactionAborted):
    """A function returned without awaiting a ``ctx.call(...)`` it made: that call never ran,
    so the transaction is aborted instead of committing half of what the function meant."""


class NondeterminismError(TransactionAborted):
    """A function did not do the same thing when run twice against the same state (it read
    the wall clock, drew from ``random``, …): re-runs and recovery could not reproduce it,
    so its transaction is aborted. The message names the function and the first
    difference."""


class EffectThenAbortWarning(UserWarning):
    """``LocalRunner`` warns with this when a transaction aborted after one of its
    ``ctx.run`` effects ran: the effect happened and is not undone. Commit the refusal and
    undo the effect with ``ctx.after_commit`` instead (docs/guide, the compensation
    pattern); the message names the effect keys."""


class EffectFailed(TransactionAborted):
    """The journaled exception of a ``ctx.run`` effect whose class is not a built-in one
    (``error_type`` names it; the message is its message). Raised in the function; like
    any exception it aborts the transaction only if the function lets it through."""


class SchemaTooNew(TransactionAborted):
    """A stored value has a newer schema version than the operator's code declares (code
    older than the data, e.g. after a downgrade): it is refused, never misread. The message
    names the operator, the key, the stored version and the code's."""


class UpcastFailed(TransactionAborted):
    """An operator's upcaster raised, or returned a value that is not msgpack-able, while
    bringing a stored value to the code's schema version (the message names the operator,
    the key and the upcaster)."""


class BadStoredValue(TransactionAborted):
    """A stored value's envelope is malformed (truncated, or flags this version does not
    know): see "Stored values" in ``sfaas/runtime/FORMAT.md``."""


class ConfigError(SfaasError, ValueError):
    """A setting (flag or ``SFAAS_*`` variable) has an invalid value."""


class AuthenticationError(SfaasError):
    """A peer failed the shared-secret handshake."""


class ChannelClosed(SfaasError, ConnectionError):
    """The peer closed a channel (or it broke) while a frame was expected."""


class ClusterError(SfaasError):
    """The local cluster could not be started, found or stopped."""


class StartAgain(ClusterError):
    """A worker could not join because the cluster changed under it — a peer it was told of
    is gone, its slot was given to another process, the coordinator it stood by for was
    lost. Starting again is the remedy: the process exits with :data:`EXIT_START_AGAIN`,
    and its supervisor restarts it without counting a crash (a fault series makes many)."""


class RecoveryStopped(ClusterError):
    """A recovery failed the same way three times in a row (a cause retrying cannot cure:
    the state was written with another engine or partition count, a file is corrupt); the
    coordinator stopped retrying."""


class DiskFailed(SfaasError, OSError):
    """A worker's own disk failed under its stores (a write, rename or fsync of theirs
    raised) where retrying on it cannot help: the worker leaves, and its supervisor
    restarts it — a fresh process, on the same disk or, given a spare, on another."""


class ReplayError(SfaasError):
    """``sfaas replay`` cannot replay what it was asked to: a round, an epoch, a key or a
    record it needs is not there (the message names which, and what is)."""


class RequestTimeout(SfaasError, TimeoutError):
    """No reply arrived for a request within the client's timeout."""


_REPLY_ERRORS: dict[str, type[TransactionAborted]] = {
    cls.__name__: cls
    for cls in (UnknownOperator, UnknownFunction, BadArguments, BadKey, NotSerializable, BadRequest,
                NotAwaited, NondeterminismError, EffectFailed, SchemaTooNew, UpcastFailed,
                BadStoredValue)
}


def error_class(error_type: str) -> type[TransactionAborted]:
    """The exception class a client raises for a reply whose error has type ``error_type``."""
    return _REPLY_ERRORS.get(error_type, TransactionAborted)


def reply_error(error_type: str, reason: str) -> TransactionAborted:
    """The exception a client raises for a failed request: the matching subclass, if any."""
    return error_class(error_type)(reason, error_type)
