"""The block cache of an ``lsm`` store: decoded blocks of its runs, least recently used
dropped first, bounded by ``cache_bytes``.

A part the store holds (``LSMStore._cache``), like LevelDB's block cache; used under the
store lock. A block is named by its *cache id*, ``run.uid + block index`` (a run's uid
leaves 32 bits for its blocks), so a run's blocks can be dropped together.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from .runfile import ABSENT, RunReader, block_get, decode_block

__all__ = ["BlockCache", "MISS"]

#: What :meth:`BlockCache.miss` returns for a key the block does not hold.
MISS = object()
#: Estimated bytes a cached, decoded block costs per record beyond its raw size.
_CACHED_RECORD_OVERHEAD = 90
#: One block-cache miss in this many decodes its block into the cache (see ``miss``).
_ADMIT_EVERY = 4


class BlockCache:
    """Decoded blocks by cache id, least recently used first (lock held by the owner)."""

    def __init__(self, limit: int) -> None:
        #: constant after construction: the bytes the cache may hold
        self.limit = limit
        #: cache id → decoded block; the read path's inner loop looks blocks up here
        #: directly (a hit moves the block to the end)
        self.blocks: OrderedDict[int, dict[bytes, bytes | None]] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self.used = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def miss(self, run: RunReader, i: int, cid: int, key: bytes) -> bytes | None | object:
        """Look ``key`` up in block ``i`` of ``run``, which is not cached (:data:`MISS` if
        the block does not hold it).

        Decoding a block for the cache costs several lookups' worth, so only every
        ``_ADMIT_EVERY``-th miss admits its block; the others search the raw block. A
        working set that fits in the cache still ends up cached; one that does not
        no longer pays a decode on every miss.
        """
        self.misses += 1
        offs = run.index.offsets
        a = offs[i]
        if self.misses % _ADMIT_EVERY == 0 and 2 * (offs[i + 1] - a) <= self.limit // 4:
            return self.load(run, i, cid).get(key, MISS)
        v = block_get(run.mm[a : offs[i + 1]], key, run.path, a)
        return MISS if v is ABSENT else v

    def load(self, run: RunReader, i: int, cid: int) -> dict[bytes, bytes | None]:
        """Read, verify and decode block ``i`` of ``run``; keep it unless it is too big."""
        offs = run.index.offsets
        a = offs[i]
        raw = run.mm[a : offs[i + 1]]
        keys, values = decode_block(raw, run.path, a)
        block = dict(zip(keys, values, strict=False))
        size = len(raw) + _CACHED_RECORD_OVERHEAD * len(keys)
        if size <= self.limit // 4:
            blocks = self.blocks
            sizes = self._sizes
            blocks[cid] = block
            sizes[cid] = size
            self.used += size
            while self.used > self.limit:
                old, _ = blocks.popitem(last=False)
                self.used -= sizes.pop(old)
        return block

    def drop(self, runs: Iterable[RunReader]) -> None:
        """Forget the blocks of ``runs`` (merged away)."""
        dead = {r.uid >> 32 for r in runs}
        for cid in [c for c in self.blocks if c >> 32 in dead]:
            del self.blocks[cid]
            self.used -= self._sizes.pop(cid)

    def clear(self) -> None:
        """Forget every block (a restore or close replaced the runs)."""
        self.blocks.clear()
        self._sizes.clear()
        self.used = 0
