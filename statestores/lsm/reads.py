"""The read path of an ``lsm`` store past its memtables: point lookups through the Bloom
filters, the fence pointers and the block cache (:mod:`.cache`), and the ordered merge of
memtables and runs that :meth:`~.engine.LSMStore.items` returns.

Functions over what they are given (the store takes its lock and passes its runs): the
memtables are looked up by the store itself, without a lock (a memtable is replaced whole,
never emptied in place); the runs and the block cache are read under the store lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import repeat

import mmh3

from .cache import MISS, BlockCache
from .merge import merge_sorted
from .runfile import RunReader

__all__ = ["get_in_runs", "merged", "sorted_memtables"]

_hash64 = mmh3.hash64


def get_in_runs(
    runs: Sequence[RunReader], cache: BlockCache, key: bytes, default: bytes | None
) -> bytes | None:
    """(lock held) ``get`` past the memtables: the runs, newest first (the bloom filter's
    probes inlined: this is the read path's inner loop)."""
    h1, h2 = _hash64(key)
    blocks = cache.blocks
    for run in runs:
        bloom = run.bloom
        m = bloom.m
        bits = bloom.bits
        p = h1 % m
        if not bits[p]:
            continue
        d = h2 % m
        for _ in bloom.probes:
            p += d
            if p >= m:
                p -= m
            if not bits[p]:
                break
        else:
            index = run.index
            if key > index.last_key:
                continue
            i = bisect_right(index.fences, key) - 1
            if i < 0:
                continue
            cid = run.uid + i
            block = blocks.get(cid)
            if block is None:
                v = cache.miss(run, i, cid, key)
            else:
                blocks.move_to_end(cid)
                v = block.get(key, MISS)
            if v is not MISS:
                return default if v is None else v  # type: ignore[return-value]
    return default


def sorted_memtables(
    mem: dict[bytes, bytes | None], imms: Sequence[dict[bytes, bytes | None]], start: bytes
) -> list[tuple[list[bytes], list[bytes | None]]]:
    """(lock held) The memtable, then ``imms`` newest first, as sorted keys and their
    values from key ``start`` on: what :func:`merged` reads, copied under the lock."""
    keys = sorted(k for k in mem if k >= start) if start else sorted(mem)
    out = [(keys, [mem[k] for k in keys])]
    for m in imms:
        kvs = sorted(kv for kv in m.items() if kv[0] >= start)
        out.append(([k for k, _ in kvs], [v for _, v in kvs]))
    return out


def merged(
    memtables: list[tuple[list[bytes], list[bytes | None]]],
    runs: Sequence[RunReader],
    start: bytes,
) -> Iterator[tuple[bytes, bytes]]:
    """The live pairs from key ``start`` on, in key order, of ``memtables`` (from
    :func:`sorted_memtables`) over ``runs`` (newest first); read without the lock."""
    sources: list[Iterator[tuple[bytes, int, bytes | None]]] = [
        zip(keys, repeat(i), values, strict=False) for i, (keys, values) in enumerate(memtables)
    ]
    n = len(memtables)
    sources += [r.tagged(n + i, start) for i, r in enumerate(runs)]
    return merge_sorted(sources, drop_tombstones=True)  # type: ignore[return-value]
