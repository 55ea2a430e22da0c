"""The in-memory hash index of the log engines, before and after it is complete.

:class:`PendingIndex` answers lookups from the hints' sorted key arrays while the hash
index is built on a thread after open; :class:`Redirect` is an index redirect in
progress after a merge (entries that pointed into the inputs now point at the output).
"""

from __future__ import annotations

import array
import bisect
import threading

from .. import hints
from ..hints import OFFSET_BITS
from .segment import Segment

__all__ = ["PendingIndex", "Redirect", "BUILD_SLICE"]

#: Keys per dict.update while building the index in the background (~1 ms each).
BUILD_SLICE = 1 << 12

class Redirect:
    """An index redirect in progress after a merge: the output's live keys and addresses,
    the keys it holds no live record of (tombstones, values it dropped as expired), and
    how far the redirect got (``pos`` counts live keys, then those)."""

    def __init__(
        self, keys: list[bytes], addrs: array.array[int], gone: set[int], inputs: list[Segment],
        drop: list[bytes] | None = None,
    ) -> None:
        self.keys = keys
        self.addrs = addrs
        self.drop: list[bytes] = drop if drop is not None else []
        self.pos = 0
        self.gone = gone
        self.inputs = inputs

    def step(self, index: dict[bytes, int], limit: int | None) -> bool:
        """(lock held) Redirect up to ``limit`` entries of ``index`` from the merge inputs
        to the output (``None``: all); True when every one is done."""
        get = index.get
        gone = self.gone
        n = len(self.keys)
        total = n + len(self.drop)
        end = total if limit is None else min(total, self.pos + limit)
        if self.pos < n:
            stop = min(end, n)
            for k, a in zip(self.keys[self.pos : stop], self.addrs[self.pos : stop], strict=True):
                cur = get(k)
                if cur is not None and (cur >> OFFSET_BITS) in gone:
                    index[k] = a
        if end > n:
            for k in self.drop[max(self.pos, n) - n : end - n]:
                cur = get(k)
                if cur is not None and (cur >> OFFSET_BITS) in gone:
                    del index[k]
        self.pos = end
        return end >= total


class PendingIndex:
    """The hints of the sealed segments, before (and while) they become the hash index.

    Hint keys are sorted, so a key is found by binary search, newest segment first.
    """

    def __init__(self, loaded: list[hints.Hint]) -> None:
        self.hints = loaded  # oldest first
        self._lock = threading.Lock()
        self._built: dict[bytes, int] | None = None

    def lookup(self, key: bytes) -> int | None:
        """The address of ``key``'s newest record in the hints, None if none or deleted."""
        for h in reversed(self.hints):
            keys = h.keys
            i = bisect.bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return h.addresses[i]
            tombs = h.tombstones
            if tombs:
                i = bisect.bisect_left(tombs, key)
                if i < len(tombs) and tombs[i] == key:
                    return None
        return None

    def build(self) -> dict[bytes, int]:
        """The hash index of all hints (built once; concurrent callers wait for it)."""
        with self._lock:
            if self._built is None:
                index: dict[bytes, int] = {}
                for h in self.hints:
                    keys, addrs = h.keys, h.addresses
                    # in slices: one dict.update holds the GIL throughout, and the thread
                    # that opened the store should not wait for the whole build
                    for i in range(0, len(keys), BUILD_SLICE):
                        index.update(
                            zip(keys[i : i + BUILD_SLICE], addrs[i : i + BUILD_SLICE], strict=True)
                        )
                    for k in h.tombstones:
                        index.pop(k, None)
                self._built = index
            return self._built


