"""One small handle per engine so the timed loops treat our stores and the peers alike.

A :class:`Handle` exposes ``put``/``get`` as plain callables (bound methods where the
library allows, so no wrapper frame is timed), plus ``preload``, ``flush`` and ``close``.

Durability of the default settings, per engine (``DURABILITY``), is part of the report:
our ``lsm``/``appendlog`` default ``sync="os"`` means every put has reached the OS (a
``write()`` syscall) when it returns, which survives a killed process but not a power
loss; RocksDB and LevelDB with their default write options (WAL on, ``sync=False``) are
in the same class. LMDB's default ``sync=True`` fsyncs every commit (power-loss safe, a
stronger class), so we also run ``lmdb-nosync`` (``sync=False``: commits reach the OS via
``pwrite`` but are not fsynced), which is the like-for-like peer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Handle", "EngineSpec", "ENGINES", "OURS", "PEERS", "DEFAULT_ENGINES", "spec", "dir_bytes"]


@dataclass
class Handle:
    """An open key-value store as the benchmark loops see it."""

    put: Callable[[bytes, bytes], Any]
    get: Callable[[bytes], bytes | None]
    flush: Callable[[], Any]
    close: Callable[[], Any]
    preload: Callable[[Iterable[tuple[bytes, bytes]]], None] | None = None
    store: Any = None  # the statestores.Store for our engines
    extra: dict[str, Any] = field(default_factory=dict)

    def load(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """Insert ``pairs`` (untimed set-up): a bulk path if the engine has one, else puts."""
        if self.preload is not None:
            self.preload(pairs)
            return
        put = self.put
        for k, v in pairs:
            put(k, v)


@dataclass(frozen=True)
class EngineSpec:
    """How to open one engine, and what its default durability is."""

    name: str
    ours: bool
    durability: str
    opener: Callable[[str], Handle]
    #: Modules to import before a timed open (so reopen time excludes imports).
    imports: tuple[str, ...] = ()
    #: Wall-clock budget of one timed phase; a phase stops early (and says how many ops it
    #: did) when exceeded. Only LMDB with fsync-per-commit needs a small one.
    phase_budget_s: float = 600.0


def _open_ours(engine: str) -> Callable[[str], Handle]:
    def opener(path: str) -> Handle:
        import statestores

        store = statestores.open(engine, path)
        return Handle(store.put, store.get, store.flush, store.close, None, store)

    return opener


def _open_rocksdict(path: str) -> Handle:
    from rocksdict import Options, Rdict

    # raw_mode: keys/values are stored as the given bytes (no rocksdict type tag); every
    # other option is RocksDB's default (WAL on, no fsync per write, 8 MiB block cache).
    db = Rdict(path, Options(raw_mode=True))
    return Handle(db.put, db.get, db.flush, db.close)


def _open_plyvel(path: str) -> Handle:
    import plyvel

    db = plyvel.DB(path, create_if_missing=True)

    def preload(pairs: Iterable[tuple[bytes, bytes]]) -> None:
        with db.write_batch() as wb:
            for k, v in pairs:
                wb.put(k, v)

    return Handle(db.put, db.get, lambda: None, db.close, preload)


def _lmdb_opener(sync: bool) -> Callable[[str], Handle]:
    def opener(path: str) -> Handle:
        import lmdb

        env = lmdb.open(path, map_size=16 << 30, writemap=False, sync=sync)
        begin = env.begin

        # One write transaction per put and one read transaction per get: the same
        # per-operation semantics as the other engines' put/get.
        def put(key: bytes, value: bytes) -> None:
            with begin(write=True) as txn:
                txn.put(key, value)

        def get(key: bytes) -> bytes | None:
            with begin() as txn:
                return txn.get(key)  # type: ignore[no-any-return]

        def preload(pairs: Iterable[tuple[bytes, bytes]]) -> None:
            batch: list[tuple[bytes, bytes]] = []
            for kv in pairs:
                batch.append(kv)
                if len(batch) >= 10_000:
                    with begin(write=True) as txn:
                        txn.cursor().putmulti(batch)
                    batch = []
            if batch:
                with begin(write=True) as txn:
                    txn.cursor().putmulti(batch)

        return Handle(put, get, lambda: env.sync(True), env.close, preload)

    return opener


ENGINES: dict[str, EngineSpec] = {
    "lsm": EngineSpec("lsm", True, 'sync="os": each put reaches the OS (WAL write()), no fsync', _open_ours("lsm"), ("statestores.lsm",)),
    "appendlog": EngineSpec(
        "appendlog", True, 'sync="os": each put reaches the OS (log write()), no fsync', _open_ours("appendlog"), ("statestores.appendlog",)
    ),
    "hybridlog": EngineSpec(
        "hybridlog",
        True,
        'sync="none": puts wait in the in-memory mutable region until a flush (weaker)',
        _open_ours("hybridlog"),
        ("statestores.hybridlog",),
    ),
    "memonly": EngineSpec("memonly", True, "nothing on disk until a snapshot (weakest)", _open_ours("memonly"), ("statestores.memonly",)),
    "rocksdict": EngineSpec(
        "rocksdict", False, "RocksDB defaults: WAL write() per put, no fsync (same class as ours)", _open_rocksdict, ("rocksdict",)
    ),
    "plyvel": EngineSpec(
        "plyvel", False, "LevelDB defaults: log write() per put, no fsync (same class as ours)", _open_plyvel, ("plyvel",)
    ),
    "lmdb": EngineSpec(
        "lmdb",
        False,
        "LMDB defaults: sync=True, fsync per commit (power-loss safe, stronger class)",
        _lmdb_opener(True),
        ("lmdb",),
        phase_budget_s=8.0,
    ),
    "lmdb-nosync": EngineSpec(
        "lmdb-nosync",
        False,
        "LMDB sync=False: each commit pwrite()s to the OS, no fsync (same class as ours)",
        _lmdb_opener(False),
        ("lmdb",),
    ),
}

OURS = tuple(n for n, s in ENGINES.items() if s.ours)
PEERS = tuple(n for n, s in ENGINES.items() if not s.ours)
DEFAULT_ENGINES = tuple(ENGINES)


def spec(name: str) -> EngineSpec:
    """The :class:`EngineSpec` called ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown benchmark engine {name!r}; expected one of {', '.join(ENGINES)}") from None


def dir_bytes(path: str) -> int:
    """Apparent size of every file under ``path`` (recursively)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:  # a merge may delete files while we walk
                pass
    return total
