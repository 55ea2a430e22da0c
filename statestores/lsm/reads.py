"""The read path of an ``lsm`` store: point lookups through the memtables, the Bloom
filters, the fence pointers and the block cache, and the ordered scan of :meth:`items`.

Lookups of the memtables take no lock (a memtable is replaced whole, never emptied in
place); the runs and the block cache are read under the store lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import repeat, takewhile

import mmh3

from ..base import MAX_KEY_BYTES, check_key
from .merge import merge_sorted
from .runfile import ABSENT, RunReader, block_get, decode_block
from .state import LSMState

__all__ = ["LSMReads"]

_MISS = object()
_hash64 = mmh3.hash64
#: Estimated bytes a cached, decoded block costs per record beyond its raw size.
_CACHED_RECORD_OVERHEAD = 90
#: One block-cache miss in this many decodes its block into the cache (see _miss).
_ADMIT_EVERY = 4


class LSMReads(LSMState):
    """Lookups and scans over the memtables and the runs."""

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self.check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        v = self._mem.get(key, _MISS)
        if v is not _MISS:
            return default if v is None else v  # type: ignore[return-value]
        imms = self._imms
        if imms:
            for imm in reversed(imms):
                v = imm.mem.get(key, _MISS)
                if v is not _MISS:
                    return default if v is None else v  # type: ignore[return-value]
        if not self._runs:
            return default
        return self._get_in_runs(key, default)

    def _get_in_runs(self, key: bytes, default: bytes | None) -> bytes | None:
        """``get`` past the memtables: the runs, newest first (the bloom filter's probes
        inlined: this is the read path's inner loop)."""
        h1, h2 = _hash64(key)
        with self._lock:
            for run in self._runs:
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
                    block = self._cache.get(cid)
                    if block is None:
                        v = self._miss(run, i, cid, key)
                    else:
                        self._cache.move_to_end(cid)
                        v = block.get(key, _MISS)
                    if v is not _MISS:
                        return default if v is None else v  # type: ignore[return-value]
        return default

    def _miss(self, run: RunReader, i: int, cid: int, key: bytes) -> bytes | None | object:
        """Look ``key`` up in block ``i`` of ``run``, which is not cached.

        Decoding a block for the cache costs several lookups' worth, so only every
        ``_ADMIT_EVERY``-th miss admits its block; the others search the raw block. A
        working set that fits in the cache still ends up cached; one that does not
        no longer pays a decode on every miss.
        """
        self._misses += 1
        offs = run.index.offsets
        a = offs[i]
        if self._misses % _ADMIT_EVERY == 0 and 2 * (offs[i + 1] - a) <= self._cache_limit // 4:
            return self._load_block(run, i, cid).get(key, _MISS)
        v = block_get(run.mm[a : offs[i + 1]], key, run.path, a)
        return _MISS if v is ABSENT else v

    def _load_block(self, run: RunReader, i: int, cid: int) -> dict[bytes, bytes | None]:
        """Read, verify and decode block ``i`` of ``run``; keep it in the LRU cache."""
        offs = run.index.offsets
        a = offs[i]
        raw = run.mm[a : offs[i + 1]]
        keys, values = decode_block(raw, run.path, a)
        block = dict(zip(keys, values, strict=False))
        size = len(raw) + _CACHED_RECORD_OVERHEAD * len(keys)
        if size <= self._cache_limit // 4:
            cache = self._cache
            sizes = self._cache_sizes
            cache[cid] = block
            sizes[cid] = size
            self._cache_used += size
            while self._cache_used > self._cache_limit:
                old, _ = cache.popitem(last=False)
                self._cache_used -= sizes.pop(old)
        return block

    def _drop_cached(self, runs: Iterable[RunReader]) -> None:
        dead = {r.uid >> 32 for r in runs}
        for cid in [c for c in self._cache if c >> 32 in dead]:
            del self._cache[cid]
            self._cache_used -= self._cache_sizes.pop(cid)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once, in key order, as of this call (a lazy merge)."""
        return self._merged(b"")

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Each run read from the block that can hold the prefix, up to the first key
        past it."""
        return takewhile(lambda kv: kv[0].startswith(prefix), self._merged(prefix))

    def _merged(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The live pairs from key ``start`` on, in key order, as of this call."""
        self.check_open()
        with self._lock:
            mem = self._mem
            mkeys = sorted(k for k in mem if k >= start) if start else sorted(mem)
            mvals = [mem[k] for k in mkeys]
            imms = [sorted(kv for kv in imm.mem.items() if kv[0] >= start)
                    for imm in reversed(self._imms)]
            runs = self._runs
        sources: list[Iterator[tuple[bytes, int, bytes | None]]] = [zip(mkeys, repeat(0), mvals)]
        for i, pairs in enumerate(imms):
            sources.append(
                zip([k for k, _ in pairs], repeat(i + 1), [v for _, v in pairs], strict=False)
            )
        sources += [r.tagged(len(imms) + i + 1, start) for i, r in enumerate(runs)]
        return merge_sorted(sources, drop_tombstones=True)  # type: ignore[return-value]
