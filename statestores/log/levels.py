"""The order and levels of sealed segments, as plain functions of them: which segments a
merge takes, where its output goes, what a snapshot names, and their statistics.

Sealed segments are ordered oldest → newest and carry a level (``version.py`` derives the
order). Levels never increase from oldest to newest (tiering), so the segments of one
level are contiguous, and a merge output takes their place in the order.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import sys
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..checks import Option
from ..expiry import MARKER, expired
from ..version import FileEntry
from .segment import Segment, hint_name

log = logging.getLogger("statestores")

__all__ = [
    "pick_merge", "merged_order", "newest_level0", "snapshot_wal_cap", "sealing",
    "region_items", "segment_stats", "live_keys", "SEGMENT_OPTIONS",
]

#: The options of both log engines (beyond their own).
SEGMENT_OPTIONS: dict[str, Option] = {
    "max_runs_per_level": Option(4, int, lambda v: 2 <= v <= 1000, "an int in [2, 1000]"),
    "max_snapshot_wals": Option(
        32, int, lambda v: 2 <= v <= 1000,
        "an int in [2, 1000] (wal files a snapshot holds before it flushes or seals them)",
    ),
}


def pick_merge(
    sealed: Sequence[Segment], limit: int, directory: str
) -> tuple[list[Segment], int, bool] | None:
    """The merge due among ``sealed``: ``(inputs, output level, drop tombstones)`` for the
    lowest level holding ``limit`` hinted segments, None if none does."""
    counts = Counter(s.level for s in sealed)
    for level in sorted(counts):
        if counts[level] < limit:
            continue
        first = next(i for i, s in enumerate(sealed) if s.level == level)
        inputs = list(sealed[first : first + counts[level]])
        if any(s.level != level for s in inputs):
            log.warning(
                "segments of level %d in %s are not contiguous; not merging", level, directory
            )
            continue
        # the oldest hinted ones (a newer segment's hint may still be being written; its
        # hand-off kicks again): the output, one level up, sorts before the rest
        n = next((i for i, s in enumerate(inputs) if not s.hinted), len(inputs))
        if n < limit:
            continue
        return inputs[:n], level + 1, first == 0
    return None


def merged_order(
    sealed: list[Segment], inputs: list[Segment], out: Segment, *, wals: bool
) -> tuple[list[Segment], list[str]]:
    """The sealed segments once ``out``, merged from ``inputs``, is installed, and the
    names of the files the merge removes. ``wals``: the inputs were not sealed segments
    (an AppendLog's folded ones): ``out`` is newer than every sealed segment but those
    sealed since the merge began."""
    if not wals:
        first = sealed.index(inputs[0])
        order = sealed[:first] + [out] + sealed[first + len(inputs) :]
        return order, [n for s in inputs for n in (s.name, hint_name(s.name))]
    first = next(
        (i for i, s in enumerate(sealed) if s.level == 0 and s.seq > out.seq), len(sealed)
    )
    return sealed[:first] + [out] + sealed[first:], [s.name for s in inputs]


def newest_level0(files: Iterable[FileEntry]) -> int:
    """The seq of the newest level-0 segment among ``files`` (-1: none)."""
    return max((e.seq for e in files if e.kind == "segment" and e.level == 0), default=-1)


def snapshot_wal_cap(cap: int, directory: str) -> int:
    """``max_snapshot_wals`` (``cap``) of the store in ``directory``: between half of it
    and all of it, from the CRC-32 of the directory's name, so stores snapshotted together
    do not all flush (or seal) in the same round."""
    return cap - zlib.crc32(os.path.basename(directory).encode()) % (cap // 2 + 1)


def sealing(
    sealed: Iterable[Segment],
) -> tuple[list[str], list[FileEntry], list[concurrent.futures.Future[Any]]]:
    """The sealed segments whose hint is being written: their names, their segment + hint
    entries, and the futures that resolve once their hints are durable."""
    unhinted = [s for s in sealed if not s.hint_ready]
    entries = [
        e
        for s in unhinted
        for e in (
            FileEntry(s.name, "segment", s.level),
            FileEntry(hint_name(s.name), "hint", s.level),
        )
    ]
    futs = list({id(f): f for s in unhinted if (f := s.hint_future) is not None}.values())
    return [s.name for s in unhinted], entries, futs


def region_items(
    merged: dict[bytes, bytes | None], index: dict[bytes, int], exact: bool,
    horizon: int | None,
) -> tuple[list[tuple[bytes, bytes | None]], int]:
    """The records a log file written from in-memory records (HybridLog's regions, last
    record per key) needs, and how many values were found expired: without an expiry
    horizon, a tombstone only where a log file may still hold the key (``index`` has it,
    or is not ``exact`` — still being built). With one, every tombstone, and a value
    expired at the horizon becomes one: a merge then forgets keys whose newest record it
    found expired, while a snapshot frozen before that merge was installed holds its
    inputs — the key's old value — and this file (a region being written is part of the
    snapshot), so the index cannot tell that no file holds the key any more (a delete
    left out here let a snapshot show the old value: the restore model's seed 192915291)."""
    if horizon is None:
        items = [(k, v) for k, v in merged.items() if v is not None or not exact or k in index]
        return items, 0
    out: list[tuple[bytes, bytes | None]] = []
    n_expired = 0
    for k, v in merged.items():
        if v and v[0] == MARKER and expired(v, horizon):
            v = None
            n_expired += 1
        out.append((k, v))
    return out, n_expired


def segment_stats(index: dict[bytes, int], sealed: Sequence[Segment]) -> dict[str, Any]:
    """The statistics of a hash index and the sealed segments it points into."""
    sample = list(itertools.islice(index, 64))
    per_key = (sum(sys.getsizeof(k) for k in sample) / len(sample) if sample else 0) + 32
    levels = Counter(s.level for s in sealed)
    return {
        "keys_on_disk": len(index),
        "index_bytes": int(sys.getsizeof(index) + per_key * len(index)),
        "segments": len(sealed),
        "files_per_level": {f"L{lv}": levels[lv] for lv in sorted(levels)},
        "sealed_bytes": sum(s.size for s in sealed),
    }


def live_keys(
    index: dict[bytes, int], prefix: bytes | None, memory: Iterable[bytes]
) -> list[bytes]:
    """The keys of ``index`` and of ``memory`` (keys a store holds in memory, perhaps
    deleted), each once; with a ``prefix``, only those starting with it, sorted."""
    if prefix is None:
        return list(index) + [k for k in dict.fromkeys(memory) if k not in index]
    keys = [k for k in index if k.startswith(prefix)]
    keys += [k for k in dict.fromkeys(memory) if k.startswith(prefix) and k not in index]
    keys.sort()
    return keys
