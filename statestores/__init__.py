"""Embedded log-structured key-value stores with incremental snapshots.

>>> import statestores, remotes
>>> with statestores.open("lsm", "/tmp/db", remote=remotes.PathRemote("/tmp/snaps")) as db:
...     db[b"k"] = b"v"
...     info = db.snapshot(1)

Engines: ``lsm`` (LSM tree), ``appendlog`` (Bitcask-style log + hash index),
``hybridlog`` (FASTER-style log with a mutable in-memory tail), ``memonly`` (a dict).
"""

from __future__ import annotations

import os
from typing import Any

from .base import MAX_KEY_BYTES, MAX_VALUE_BYTES, RestoreInfo, SnapshotInfo, Store
from .engines import ENGINES, engine_class
from .errors import (
    CorruptionError,
    LockedError,
    RemoteError,
    SnapshotNotFoundError,
    StoreClosedError,
    StoreError,
)
from .fs import FileSystem

__all__ = [
    "ENGINES",
    "open",
    "engine_class",
    "Store",
    "SnapshotInfo",
    "RestoreInfo",
    "StoreError",
    "StoreClosedError",
    "CorruptionError",
    "RemoteError",
    "SnapshotNotFoundError",
    "LockedError",
    "FileSystem",
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "follow",
]

def open(  # noqa: A001 - the public entry point, named like builtins.open
    engine: str,
    directory: str | os.PathLike[str],
    *,
    remote: Any = None,
    **options: Any,
) -> Store:
    """Open (creating if needed) a store of ``engine`` in ``directory``.

    If the directory holds no state and ``remote`` holds snapshots, the latest snapshot is
    restored. ``options`` are the engine's tunables plus ``sync`` (``"none"``, ``"os"``,
    ``"fsync"``); an unknown one raises ``TypeError``.
    """
    return engine_class(engine)(directory, remote=remote, **options)


def follow(engine: str, directory: str | os.PathLike[str], source: Any, **options: Any) -> Any:
    """A read-only replica of a store in ``directory``, kept from ``source`` (a transport
    of :mod:`statestores.replica`); ``follower.promote()`` makes it a writable store."""
    from .replica import Follower

    return Follower(engine, directory, source, **options)
