"""The read path of an ``lsm`` store: point lookups through the memtables, the Bloom
filters, the fence pointers and the block cache (:mod:`.cache`), and the ordered scan of
:meth:`items`.

Lookups of the memtables take no lock (a memtable is replaced whole, never emptied in
place); the runs and the block cache are read under the store lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import repeat, takewhile

import mmh3

from ..base import MAX_KEY_BYTES, check_key
from .cache import MISS
from .merge import merge_sorted
from .state import LSMState

__all__ = ["LSMReads"]

_MISS = MISS
_hash64 = mmh3.hash64


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
        cache = self._cache
        blocks = cache.blocks
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
                    block = blocks.get(cid)
                    if block is None:
                        v = cache.miss(run, i, cid, key)
                    else:
                        blocks.move_to_end(cid)
                        v = block.get(key, _MISS)
                    if v is not _MISS:
                        return default if v is None else v  # type: ignore[return-value]
        return default

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
