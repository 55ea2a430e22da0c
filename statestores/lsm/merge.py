"""K-way merges of sorted sources, newest first; the background merge job.

:func:`merge_runs` is what the store submits to ``statestores.background``: a top-level
function of plain arguments that reads the input runs, writes the merged run to a
``.tmp`` path and returns plain counts. The store (not the job) renames the output,
records it in ``CURRENT`` and releases the inputs, so a job that dies leaves only a stray
``.tmp`` that the next open removes.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator
from typing import Any

from ..fs import FileSystem
from .runfile import RunReader, RunWriter

__all__ = ["merge_sorted", "merge_runs", "flush_memtable"]

#: Records handed to the writer at a time.
_BATCH = 4096


def merge_sorted(
    sources: Iterable[Iterator[tuple[bytes, int, bytes | None]]], *, drop_tombstones: bool
) -> Iterator[tuple[bytes, bytes | None]]:
    """Merge ``(key, tag, value)`` streams, each ascending by key, into one ascending stream.

    For a key present in several sources the one with the lowest tag wins (tags are the
    sources' age ranks, newest = 0). Tombstones (``None``) are kept unless
    ``drop_tombstones`` (only safe when no older data exists below the merge).
    """
    last: bytes | None = None
    for key, _tag, value in heapq.merge(*sources):
        if key == last:
            continue
        last = key
        if value is None and drop_tombstones:
            continue
        yield key, value


def merge_runs(
    inputs: list[str],
    output: str,
    drop_tombstones: bool,
    density_factor: int,
    block_bytes: int,
    bloom_fpr: float,
    fsync: bool,
) -> dict[str, Any]:
    """Merge the runs at ``inputs`` (newest first) into a new run at ``output``.

    Returns the output's ``count``, ``tombstones`` and ``bytes``; ``count == 0`` means
    everything cancelled out and no output file exists.
    """
    fs = FileSystem()
    readers = [RunReader(fs, p) for p in inputs]
    writer = RunWriter(
        fs, output, density_factor=density_factor, block_bytes=block_bytes, bloom_fpr=bloom_fpr, fsync=fsync
    )
    try:
        keys: list[bytes] = []
        values: list[bytes | None] = []
        for k, v in merge_sorted((r.tagged(i) for i, r in enumerate(readers)), drop_tombstones=drop_tombstones):
            keys.append(k)
            values.append(v)
            if len(keys) >= _BATCH:
                writer.add_many(keys, values)
                keys = []
                values = []
        writer.add_many(keys, values)
        if writer.count == 0:
            writer.abort()
            os.remove(output)
            return {"count": 0, "tombstones": 0, "bytes": 0, "inputs": sum(r.count for r in readers)}
        out = writer.finish()
    except BaseException:
        writer.abort()
        raise
    out["inputs"] = sum(r.count for r in readers)
    return out


def flush_memtable(
    output: str,
    mem: dict[bytes, bytes | None],
    drop_tombstones: bool,
    density_factor: int,
    block_bytes: int,
    bloom_fpr: float,
    fsync: bool,
) -> dict[str, Any]:
    """Write an immutable memtable (tombstones as ``None``) as a run at ``output``.

    Runs off the caller's thread (sorting, encoding and the Bloom filter are most of a
    flush's cost). ``count == 0`` means nothing was left to write and no file exists.
    """
    keys = sorted(mem)
    values = list(map(mem.__getitem__, keys))
    if drop_tombstones:
        live = [i for i, v in enumerate(values) if v is not None]
        keys = [keys[i] for i in live]
        values = [values[i] for i in live]
    if not keys:
        return {"count": 0, "tombstones": 0, "bytes": 0}
    writer = RunWriter(
        FileSystem(), output, density_factor=density_factor, block_bytes=block_bytes, bloom_fpr=bloom_fpr, fsync=fsync
    )
    try:
        writer.add_many(keys, values)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()
