"""A replica's directory: what a follower finds there when it opens, and how a directory
that is only a cache is discarded.

A replica's own state is its ``FOLLOW`` document (:mod:`.state`), written when it installs
its first message: a directory without one holds nothing installed yet — a new replica, or
one whose seeding and stream never completed a message (the snapshot remote and the
primary were both unreachable) — and is version 0, no files, no marks. A directory with
``CURRENT`` and no ``FOLLOW`` holds a store (a promoted replica, or a store's own
directory): a follower refuses it, and only its owner may :func:`discard` it.
"""

from __future__ import annotations

import os
import shutil

from .. import current
from ..errors import CorruptionError, StoreError
from ..fs import FileSystem
from .state import FollowState, decode_state

__all__ = ["STATE_NAME", "PART", "LOCK_NAME", "load", "needed", "discard"]

STATE_NAME = "FOLLOW"
PART = ".replica"
LOCK_NAME = "LOCK"


def load(fs: FileSystem, directory: str, engine: str, prefix: str) -> FollowState:
    """The state of the replica in ``directory`` (a replica of ``engine``, whose files are
    named ``{prefix}-…``), after deleting the leftovers of a crash mid-install: temporary
    bodies and engine files nothing names. Version 0 with nothing when no message was
    installed yet; :class:`StoreError` when the directory holds a store, or a replica of
    another engine; :class:`CorruptionError` when ``FOLLOW`` is damaged or names a missing
    file. The caller holds the directory's lock."""
    path = os.path.join(directory, STATE_NAME)
    if fs.exists(path):
        state = decode_state(fs.read_file(path), path, engine)
        for n in sorted(needed(state)):
            if not fs.exists(os.path.join(directory, n)):
                raise CorruptionError(path, f"names {n!r}, which is missing")
    elif current.exists(fs, directory):
        raise StoreError(
            f"{directory} holds a store, not a replica: follow into an empty directory"
        )
    else:
        state = FollowState(0, "", {}, [])
    need = needed(state)
    for n in fs.listdir(directory):
        if n.endswith(PART) or (n.startswith(prefix + "-") and n not in need):
            fs.remove(os.path.join(directory, n))
    return state


def needed(state: FollowState) -> set[str]:
    """The files ``state``'s version and retained marks name."""
    need = set(state.files)
    for _i, _s, files in state.marks:
        need.update(e.name for e in files)
    return need


def discard(directory: str | os.PathLike[str]) -> bool:
    """Delete ``directory`` — a replica, or a store a promotion left there — for a caller
    to whom it is only a cache (a standby's: the cluster restores its state from the
    snapshot rounds). Refused with :class:`~statestores.LockedError`, deleting nothing,
    while a live store or follower holds it. False if there was nothing to delete."""
    directory = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(directory):
        return False
    fs = FileSystem()
    fd = fs.lock(os.path.join(directory, LOCK_NAME))
    try:
        shutil.rmtree(directory)
    finally:
        fs.unlock(fd)
    return True
