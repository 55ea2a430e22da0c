"""A replica's directory: what a follower finds there when it opens.

A replica's own state is its ``FOLLOW`` document (:mod:`.state`), written when it installs
its first message: a directory without one holds nothing installed yet — a new replica, or
one whose seeding and stream never completed a message (the snapshot remote and the
primary were both unreachable) — and is version 0, no files, no marks. A directory with
``CURRENT`` and no ``FOLLOW`` holds a store (a promoted replica, or a store's own
directory): a follower refuses it.
"""

from __future__ import annotations

import os

from .. import current
from ..errors import CorruptionError, StoreError
from ..fs import FileSystem
from .state import FollowState, decode_state

__all__ = ["STATE_NAME", "PART", "LOCK_NAME", "load", "needed"]

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
