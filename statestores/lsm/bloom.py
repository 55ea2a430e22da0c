"""Bloom filters for run files (``FORMAT.md`` § lsm, "Bloom block").

Sizing follows the thesis: ``m = ceil(-n ln ε / (ln 2)²)`` bits and
``k = floor(m / n · ln 2)`` probes. Probe ``i`` of a key is ``(h1 + i·h2) mod m``
(mathematical modulo, result in ``[0, m)``) where ``(h1, h2)`` are the two halves of the
128-bit MurmurHash3 x64 of the key, each read as a *signed* little-endian 64-bit integer
(``mmh3.hash64(key)``, seed 0): one hash call per key, reused across every run a lookup
visits (double hashing, Kirsch–Mitzenmacher). Bit ``p`` is bit ``p % 8`` (least
significant first) of byte ``p // 8``.
"""

from __future__ import annotations

import math
from array import array

import mmh3
from bitarray import bitarray

__all__ = ["Bloom", "key_hash", "params", "probes_for", "MAX_PROBES"]

_LN2_SQ = math.log(2) ** 2
_hash64 = mmh3.hash64
#: Most probes per key (k) a filter may use: ``params`` never exceeds it (k is about
#: -log2(fpr), 20 at fpr 1e-6), and a run whose footer claims more is corrupt — a lookup
#: costs up to k probes, so a hostile k must not make one take minutes.
MAX_PROBES = 256
#: Positions computed per batch while building (bounds the temporary list).
_CHUNK = 1 << 16


def key_hash(key: bytes) -> tuple[int, int]:
    """The two 64-bit halves of the key's hash, as used by :meth:`Bloom.might_contain`."""
    return _hash64(key)


def params(n: int, fpr: float) -> tuple[int, int]:
    """``(m, k)`` for ``n`` keys at false-positive rate ``fpr`` (m ≥ 64, 1 ≤ k ≤ MAX_PROBES)."""
    if not 0.0 < fpr < 1.0:
        raise ValueError(f"bloom false-positive rate must be in (0, 1), got {fpr!r}")
    n = max(n, 1)
    m = max(64, math.ceil(-n * math.log(fpr) / _LN2_SQ))
    return m, probes_for(m, n)


def probes_for(m: int, n: int) -> int:
    """k for a filter of ``m`` bits over ``n`` keys: a function of the two, so a reader can
    check a footer's k (a k other than the writer's would turn every lookup into a miss)."""
    return min(MAX_PROBES, max(1, math.floor(m / max(n, 1) * math.log(2))))


class Bloom:
    """An immutable Bloom filter of ``m`` bits and ``k`` probes."""

    __slots__ = ("m", "k", "bits", "probes")

    def __init__(self, m: int, k: int, bits: bitarray) -> None:
        self.m = m
        self.k = k
        self.bits = bits
        #: ``range(1, k)``: probes after the first, pre-built for the lookup loop.
        self.probes = range(1, k)

    @classmethod
    def build(cls, hashes: array[int], fpr: float) -> Bloom:
        """A filter over keys whose :func:`key_hash` halves are flattened in ``hashes``."""
        n = len(hashes) // 2
        m, k = params(n, fpr)
        bits = bitarray(m, endian="little")
        bits.setall(0)
        rk = range(k)
        step = 2 * _CHUNK
        for start in range(0, len(hashes), step):
            # reduce mod m first: the products below stay small ints (no bignum math)
            h1s = [a % m for a in hashes[start : start + step : 2]]
            h2s = [b % m for b in hashes[start + 1 : start + step : 2]]
            for i in rk:
                bits[[(a + i * b) % m for a, b in zip(h1s, h2s, strict=True)]] = 1
        return cls(m, k, bits)

    @classmethod
    def from_bytes(cls, data: bytes, m: int, k: int) -> Bloom:
        """The filter stored as ``data`` (``ceil(m / 8)`` bytes)."""
        bits = bitarray(endian="little")
        bits.frombytes(data)
        del bits[m:]
        return cls(m, k, bits)

    def to_bytes(self) -> bytes:
        """The stored form: ``ceil(m / 8)`` bytes, unused high bits zero."""
        return self.bits.tobytes()

    def might_contain(self, h1: int, h2: int) -> bool:
        """False if the key with hash halves ``(h1, h2)`` is certainly absent."""
        m = self.m
        bits = self.bits
        p = h1 % m
        if not bits[p]:
            return False
        d = h2 % m
        for _ in self.probes:
            p += d
            if p >= m:
                p -= m
            if not bits[p]:
                return False
        return True

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the filter."""
        return (self.m + 7) // 8 + 64
