"""Writing a memtable to a level-0 run in the foreground (``flush()``, a close, or a
background flush that failed), and the WAL record a ``put`` appends, inlined.

The background flush lane runs :func:`~.merge.flush_memtable` instead; both write the
same run file (``FORMAT.md`` § lsm).
"""

from __future__ import annotations

import struct
from typing import Any

from .runfile import write_run

__all__ = ["write_memtable", "WAL_BODY", "WAL_CRC"]

#: ``records`` body header (klen, vlen, flags); ``put`` inlines ``records.encode`` with it.
WAL_BODY = struct.Struct("<IIB")
WAL_CRC = struct.Struct("<I")


def write_memtable(
    fs: Any, path: str, mem: dict[bytes, bytes | None], drop_tombstones: bool,
    run_opts: dict[str, Any],
) -> int:
    """Write ``mem`` in key order as a run at ``path``; ``drop_tombstones``: nothing older
    exists, deletes vanish. The records written (0: no file was written)."""
    keys = sorted(mem)
    values = list(map(mem.__getitem__, keys))
    if drop_tombstones:
        keep = [i for i, v in enumerate(values) if v is not None]
        keys = [keys[i] for i in keep]
        values = [values[i] for i in keep]
    if keys:
        write_run(fs, path, keys, values, **run_opts)
    return len(keys)
