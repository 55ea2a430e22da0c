"""Errors raised by the state stores.

Every error a store raises on purpose derives from :class:`StoreError`; bad arguments
raise the built-in ``TypeError``/``ValueError`` with a message that names the input.
"""

from __future__ import annotations

from remotes.errors import RemoteError, SnapshotNotFoundError

__all__ = [
    "StoreError",
    "StoreClosedError",
    "CorruptionError",
    "LockedError",
    "BackgroundBusy",
    "BackgroundDied",
    "RemoteError",
    "SnapshotNotFoundError",
]


class StoreError(Exception):
    """Base class of every error a store raises on purpose."""


class StoreClosedError(StoreError):
    """The store was used after :meth:`close`."""


class CorruptionError(StoreError):
    """A file's bytes do not match their checksum (or are otherwise malformed), or a file
    the store's version names is missing.

    The message names the file; the data in it is never returned.
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail

    def __reduce__(self) -> tuple[type[CorruptionError], tuple[str, str]]:
        # picklable, so a merge in the background process can report it as it is
        return (CorruptionError, (self.path, self.detail))


class LockedError(StoreError):
    """Another open store (in this or another process) already owns the directory."""


class BackgroundBusy(StoreError):
    """A background lane's queue is full (``statestores.background.MAX_QUEUED`` tasks wait)."""


class BackgroundDied(StoreError):
    """The background process died while it ran the task (the next task starts a new one)."""
