"""K-way merges of sorted sources, newest first; the background merge job.

:func:`merge_runs` is what the store submits to ``statestores.background``: a top-level
function of plain arguments that reads the input runs, writes the merged run to a
``.tmp`` path and returns plain counts. The store (not the job) renames the output,
records it in ``CURRENT`` and releases the inputs, so a job that dies leaves only a stray
``.tmp`` that the next open removes.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

from ..expiry import expired_positions
from ..fs import FileSystem
from .runfile import RunReader, RunWriter

__all__ = ["merge_sorted", "merge_chunks", "merge_runs", "flush_memtable"]

log = logging.getLogger("statestores.lsm")


def noop() -> None:
    """A job that does nothing (checks that a background process answers)."""


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


def merge_chunks(
    sources: list[Iterator[tuple[list[bytes], list[bytes | None]]]], *, drop_tombstones: bool,
    horizon: int | None = None, counts: dict[str, int] | None = None,
) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    """Merge sorted sources given as chunks of ``(keys, values)``, newest source first.

    Works a key range at a time: everything up to the smallest last key among the
    sources' current chunks is final, so that range is merged with a dict (newest
    written last) and one sort — C-speed work instead of a heap step per record.

    A winning value expired at ``horizon`` (:mod:`statestores.expiry`) becomes a
    tombstone — gone with ``drop_tombstones``, else shadowing older versions below the
    merge; ``counts["expired"]`` (if given) counts them.
    """
    n = len(sources)
    bufs: list[tuple[list[bytes], list[bytes | None]] | None] = [None] * n
    live = list(range(n))
    while True:
        for i in list(live):
            if not bufs[i] or not bufs[i][0]:  # type: ignore[index]
                nxt = next(sources[i], None)
                while nxt is not None and not nxt[0]:
                    nxt = next(sources[i], None)
                if nxt is None:
                    live.remove(i)
                    bufs[i] = None
                else:
                    bufs[i] = nxt
        if not live:
            return
        bound = min(bufs[i][0][-1] for i in live)  # type: ignore[index]
        merged: dict[bytes, bytes | None] = {}
        for i in reversed(live):  # oldest first, so newer values overwrite
            keys, values = bufs[i]  # type: ignore[misc]
            j = bisect_right(keys, bound)
            if j == len(keys):
                merged.update(zip(keys, values, strict=True))
                bufs[i] = ([], [])
            elif j:
                merged.update(zip(keys[:j], values[:j], strict=True))
                bufs[i] = (keys[j:], values[j:])
        out_keys = sorted(merged)
        out_values = list(map(merged.__getitem__, out_keys))
        if horizon is not None:
            gone = expired_positions(out_values, horizon)
            for t in gone:
                out_values[t] = None
            if counts is not None:
                counts["expired"] = counts.get("expired", 0) + len(gone)
        if drop_tombstones and None in out_values:
            keep = [t for t, v in enumerate(out_values) if v is not None]
            out_keys = [out_keys[t] for t in keep]
            out_values = [out_values[t] for t in keep]
        if out_keys:
            yield out_keys, out_values


def merge_runs(
    fs: FileSystem | None,
    inputs: list[str],
    output: str,
    drop_tombstones: bool,
    density_factor: int,
    block_bytes: int,
    bloom_fpr: float,
    fsync: bool,
    horizon: int | None = None,
) -> dict[str, Any]:
    """Merge the runs at ``inputs`` (newest first) into a new run at ``output``.

    Returns the output's ``count``, ``tombstones`` and ``bytes``, and ``expired``: values
    expired at ``horizon`` that were dropped or became tombstones; ``count == 0`` means
    everything cancelled out and no output file exists. ``fs`` is None in the background
    process (the real file system); a test's ``FaultyFS`` when run on a local thread.
    """
    fs = fs if fs is not None else FileSystem()
    counts = {"expired": 0}
    readers = [RunReader(fs, p) for p in inputs]
    writer = RunWriter(
        fs, output, density_factor=density_factor, block_bytes=block_bytes, bloom_fpr=bloom_fpr,
        fsync=fsync,
    )
    try:
        for keys, values in merge_chunks(
            [r.chunks() for r in readers], drop_tombstones=drop_tombstones, horizon=horizon,
            counts=counts,
        ):
            writer.add_many(keys, values)
        if writer.count == 0:
            writer.abort()
            fs.remove(output)
            return {
                "count": 0, "tombstones": 0, "bytes": 0, "inputs": sum(r.count for r in readers),
                **counts,
            }
        out = writer.finish()
    except BaseException:
        writer.abort()
        raise
    out["inputs"] = sum(r.count for r in readers)
    out.update(counts)
    return out


def flush_memtable(
    fs: FileSystem | None,
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
        fs if fs is not None else FileSystem(), output, density_factor=density_factor,
        block_bytes=block_bytes, bloom_fpr=bloom_fpr, fsync=fsync,
    )
    try:
        writer.add_many(keys, values)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()
