"""Keys, values and key-index sequences for the store benchmarks.

Everything here runs *outside* the timed regions: a benchmark first materialises the whole
operation sequence as Python lists of ``bytes`` and only then starts the clock.

The Zipfian generator is the one of YCSB (Gray et al., "Quickly generating billion-record
synthetic databases", SIGMOD 1994), vectorised with numpy, with YCSB's "scrambled" twist:
rank ``r`` (0 = most popular) maps to item ``perm[r]`` where ``perm`` orders the items by a
64-bit FNV-1a hash, so hot keys are spread over the key space instead of being its prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = [
    "KEY_BYTES",
    "VALUE_BYTES",
    "make_keys",
    "make_values",
    "zeta",
    "ZipfGenerator",
    "fnv1a64",
    "index_sequence",
    "Workload",
]

KEY_BYTES = 16
VALUE_BYTES = 100
_VALUE_POOL = 1024

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def make_keys(n: int) -> list[bytes]:
    """``n`` distinct 16-byte ASCII keys; key ``i`` is the hex of an 8-byte BLAKE2b of ``i``.

    Hashing makes key order unrelated to the index, so inserting indexes in order does not
    produce sorted keys (which would flatter the LSM engines).
    """
    if n < 0:
        raise ValueError(f"number of keys must be >= 0, got {n}")
    keys = [hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).hexdigest().encode() for i in range(n)]
    if len(set(keys)) != n:  # 64-bit hashes: a collision is astronomically unlikely, but say so if it happens
        raise ValueError(f"key generator produced a collision among {n} keys")
    return keys


def make_values(seed: int = 1, count: int = _VALUE_POOL, size: int = VALUE_BYTES) -> list[bytes]:
    """A pool of ``count`` random ``size``-byte values (ops cycle through the pool)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    return [bytes(row) for row in raw]


def zeta(n: int, theta: float) -> float:
    """The generalised harmonic number ``sum_{i=1..n} 1 / i**theta``."""
    if n < 1:
        raise ValueError(f"zeta needs n >= 1, got {n}")
    i = np.arange(1, n + 1, dtype=np.float64)
    return float(np.sum(1.0 / np.power(i, theta)))


def fnv1a64(values: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a over the 8 little-endian bytes of each ``uint64`` (vectorised)."""
    v = values.astype(np.uint64)
    h = np.full(v.shape, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for shift in range(0, 64, 8):
            octet = (v >> np.uint64(shift)) & np.uint64(0xFF)
            h = (h ^ octet) * _FNV_PRIME
    return h


@dataclass
class ZipfGenerator:
    """YCSB's Zipfian generator over items ``0..n-1`` with skew ``theta`` (scrambled)."""

    n: int
    theta: float = 0.99
    scrambled: bool = True

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"ZipfGenerator needs n >= 2 items, got {self.n}")
        if not 0.0 < self.theta < 1.0:
            raise ValueError(f"ZipfGenerator theta must be in (0, 1), got {self.theta}")
        self.zetan = zeta(self.n, self.theta)
        zeta2 = zeta(2, self.theta)
        self.alpha = 1.0 / (1.0 - self.theta)
        self.eta = (1.0 - (2.0 / self.n) ** (1.0 - self.theta)) / (1.0 - zeta2 / self.zetan)
        self.perm: np.ndarray | None = None
        if self.scrambled:
            self.perm = np.argsort(fnv1a64(np.arange(self.n, dtype=np.uint64)), kind="stable")

    def ranks(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """``size`` popularity ranks (0 is the most popular), unscrambled."""
        u = rng.random(size)
        uz = u * self.zetan
        out = (self.n * np.power(self.eta * u - self.eta + 1.0, self.alpha)).astype(np.int64)
        out = np.where(uz < 1.0 + 0.5**self.theta, 1, out)
        out = np.where(uz < 1.0, 0, out)
        return np.clip(out, 0, self.n - 1)

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """``size`` item indexes drawn from the (scrambled) Zipfian distribution."""
        r = self.ranks(size, rng)
        return self.perm[r] if self.perm is not None else r

    def probability(self, rank: int) -> float:
        """The exact probability of popularity rank ``rank`` (0-based)."""
        return 1.0 / ((rank + 1) ** self.theta * self.zetan)


def index_sequence(dist: str, n_keys: int, n_ops: int, seed: int, theta: float = 0.99) -> np.ndarray:
    """``n_ops`` key indexes in ``0..n_keys-1`` drawn from ``dist`` (``uniform``/``zipf``)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return rng.integers(0, n_keys, size=n_ops, dtype=np.int64)
    if dist == "zipf":
        return ZipfGenerator(n_keys, theta).sample(n_ops, rng)
    raise ValueError(f"unknown key distribution {dist!r}; expected 'uniform' or 'zipf'")


@dataclass
class Workload:
    """One materialised benchmark workload: everything the timed loops iterate over."""

    keys: list[bytes]
    load_order: list[int]
    put_keys: list[bytes]
    put_values: list[bytes]
    get_keys: list[bytes]
    values: list[bytes]

    @classmethod
    def build(cls, dist: str, n_keys: int, n_ops: int, seed: int = 42) -> Workload:
        """Keys, a shuffled load order, and the put and get key sequences for ``dist``."""
        keys = make_keys(n_keys)
        values = make_values(seed)
        rng = np.random.default_rng(seed)
        load_order = rng.permutation(n_keys).tolist()
        put_idx = index_sequence(dist, n_keys, n_ops, seed + 1)
        get_idx = index_sequence(dist, n_keys, n_ops, seed + 2)
        put_keys = [keys[i] for i in put_idx.tolist()]
        get_keys = [keys[i] for i in get_idx.tolist()]
        nv = len(values)
        # Offset by 7 so a put usually changes the stored value (load used values[i % nv]).
        put_values = [values[(j + 7) % nv] for j in range(n_ops)]
        return cls(keys, load_order, put_keys, put_values, get_keys, values)

    def load_pairs(self) -> list[tuple[bytes, bytes]]:
        """Every key once, in shuffled order, with value ``values[i % len(values)]``."""
        nv = len(self.values)
        return [(self.keys[i], self.values[i % nv]) for i in self.load_order]

    @property
    def data_bytes(self) -> int:
        """Logical size of the loaded state: keys plus values."""
        return len(self.keys) * (KEY_BYTES + VALUE_BYTES)
