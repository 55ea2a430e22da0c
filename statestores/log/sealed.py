"""The sealed segments of an AppendLog or HybridLog store (see :mod:`.store`): opening
them with their hints, the hash index over them (built on a thread for a large store),
writing a new one, and the snapshot's view of them.
"""

from __future__ import annotations

import array
import concurrent.futures
import logging
import os
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import background, hints
from ..base import Option, Store
from ..errors import BackgroundBusy, CorruptionError
from ..snapshot_info import Frozen
from ..version import FileEntry
from .index import PendingIndex, Redirect
from .segment import (
    Segment,
    hint_name,
    scan_segment,
    write_hint,
    write_segment,
)

log = logging.getLogger("statestores")

__all__ = ["SealedSegments", "MergeJob", "LAZY_INDEX_KEYS"]

#: Stores whose hints hold at least this many keys open with the index built in the background.
LAZY_INDEX_KEYS = 1 << 16


@dataclass
class MergeJob:
    inputs: list[Segment]
    out_name: str
    out_seq: int
    level: int
    future: concurrent.futures.Future[tuple[int, int, int, list[bytes], int]]
    #: The inputs are ``wal`` entries, not sealed segments: an AppendLog's folded segments
    #: merged straight into one level-0 segment (``AppendLogStore._merge_folded``).
    wals: bool = False
    #: (lock held) Called if the merge fails; None: retry once more segments are sealed.
    on_failure: Callable[[], None] | None = None


class SealedSegments(Store):
    """The sealed segments of a log-structured store and the hash index over them."""

    #: The background lanes the engine uses (started at open, see :meth:`_open_done`).
    LANES: ClassVar[tuple[str, ...]] = ("merge",)
    SEGMENT_OPTIONS: ClassVar[dict[str, Option]] = {
        "max_runs_per_level": Option(4, int, lambda v: 2 <= v <= 1000, "an int in [2, 1000]"),
        "max_snapshot_wals": Option(
            32, int, lambda v: 2 <= v <= 1000,
            "an int in [2, 1000] (wal files a snapshot holds before it flushes or seals them)",
        ),
    }

    # ------------------------------------------------------------------ state

    def _init_segments(self) -> None:
        self._index: dict[bytes, int] = {}
        # while the index is built in the background: the hints (sorted), and keys deleted since
        self._pending: PendingIndex | None = None
        self._gone: set[bytes] = set()
        self._segs: dict[int, Segment] = {}
        self._sealed: list[Segment] = []
        self._merge: MergeJob | None = None
        self._redirect: Redirect | None = None
        self._handoffs = 0
        self._merges_done = 0
        self._merge_failures = 0
        self._merge_retry_at = 0  # no merge starts while fewer segments exist (after a failure)
        self._merged_bytes = 0
        self._expired_dropped = 0  # values merges and region writes found expired

    def _open_segments(self, *, seal_older_wals: bool = False) -> list[FileEntry]:
        """Reset, read the version, load its sealed segments; return its ``wal`` entries.

        A segment the version lists without its hint (a crash before the maintainer wrote
        it) is scanned and hinted now. With ``seal_older_wals`` (AppendLog, whose ``wal``
        entries are active or folded segments, ordered among level-0 segments by seq) every
        ``wal`` but the newest becomes such a segment, or goes if it is empty — the newest
        too when a level-0 segment is newer (a replica promoted at a snapshot taken while
        folded segments were being merged and a newer one sealed). No merge starts before
        open is done.
        """
        self._init_segments()
        self._paused += 1
        version = self.files.load()
        if seal_older_wals:
            wals = version.of_kind("wal")
            older = wals[:-1] if wals and wals[-1].seq > self._newest_level0(version) else wals
            if older:
                keep = [e for e in older if self.fs.size(self.files.path(e.name)) > 0]
                self._edit([FileEntry(e.name, "segment", 0) for e in keep], [e.name for e in older])
        segs = version.of_kind("segment")
        missing = [e for e in segs if hint_name(e.name) not in version]
        added = []
        for e in missing:
            size, alive, tombs = scan_segment(
                self.fs, self.files.path(e.name), e.seq, truncate_torn=True
            )
            keys = sorted(alive)
            self._write_hint(
                e.name, e.seq, size, keys, array.array("Q", map(alive.__getitem__, keys)),
                sorted(tombs),
            )
            added.append(FileEntry(hint_name(e.name), "hint", e.level))
        if added:
            self._edit(added)
        self._load_sealed(segs)
        return version.of_kind("wal")

    def _open_done(self) -> None:
        """End of the engine's ``_open``: merges may start. The background processes the
        store will use start now, on their own threads: a process start is ~0.3 s of CPU,
        and paid at the first merge (an appendlog's first cap seal, rounds into a run) it
        landed on the busy cores together with the merge — the worst stall of a 1,000 TPS
        run, 130-270 transactions over 40 ms (benchmarks/README.md)."""
        for lane in self.LANES:
            background.warm_up(lane)
        with self._lock:
            self._paused -= 1
            self._kick()

    @staticmethod
    def _newest_level0(files: Iterable[FileEntry]) -> int:
        """The seq of the newest level-0 segment among ``files`` (-1: none)."""
        return max((e.seq for e in files if e.kind == "segment" and e.level == 0), default=-1)

    def _hint_segments(self, entries: list[FileEntry]) -> list[FileEntry]:
        """Scan each of ``entries`` (``wal`` files) and write its hint; return the segment
        and hint entries that make them sealed level-0 segments (an empty one: none)."""
        out: list[FileEntry] = []
        for e in entries:
            size, alive, tombs = scan_segment(
                self.fs, self.files.path(e.name), e.seq, truncate_torn=False
            )
            if not size:
                continue
            keys = sorted(alive)
            self._write_hint(
                e.name, e.seq, size, keys, array.array("Q", map(alive.__getitem__, keys)),
                sorted(tombs),
            )
            out += [FileEntry(e.name, "segment", 0), FileEntry(hint_name(e.name), "hint", 0)]
        return out

    def _install_segments(self, entries: list[FileEntry]) -> list[FileEntry]:
        """Drop every segment and load those of ``entries``; return the segment + hint entries."""
        segs = sorted((e for e in entries if e.kind == "segment"), key=lambda e: (-e.level, e.seq))
        names = {e.name for e in entries}
        for e in segs:
            if hint_name(e.name) not in names:
                raise CorruptionError(
                    self.directory, f"snapshot names segment {e.name} without its hint"
                )
        self._drop_segments()
        self._load_sealed(segs)
        return [e for e in entries if e.kind in ("segment", "hint")]

    def _snapshot_wal_cap(self) -> int:
        """``max_snapshot_wals`` of this store: between half of it and all of it, from the
        CRC-32 of the directory's name, so stores snapshotted together do not all flush
        (or seal) in the same round."""
        cap: int = self.options["max_snapshot_wals"]
        return cap - zlib.crc32(os.path.basename(self.directory).encode()) % (cap // 2 + 1)

    def _segment_name(self, level: int, seq: int) -> str:
        return f"{self.PREFIX}-{level}-{seq:010d}.log"

    def _frozen(
        self, skip: Iterable[str], extra: Iterable[FileEntry] = (),
        pending: Iterable[concurrent.futures.Future[Any]] = (),
    ) -> Frozen:
        """(lock held) The snapshot: the live version but ``skip`` (files still written to),
        a sealed segment whose hint is being written as its segment + hint (the snapshot's
        upload waits for the hint), plus ``extra`` files of hand-offs."""
        unhinted = [s for s in self._sealed if not s.hint_ready]
        sealing = [
            e
            for s in unhinted
            for e in (
                FileEntry(s.name, "segment", s.level),
                FileEntry(hint_name(s.name), "hint", s.level),
            )
        ]
        futs = list(
            {id(f): f for s in unhinted if (f := s.hint_future) is not None}.values()
        ) + list(pending)
        return self.files.frozen(
            skip=[*skip, *(s.name for s in unhinted)], extra=sealing + list(extra), pending=futs
        )

    def _load_sealed(self, entries: Iterable[FileEntry]) -> None:
        """Open the sealed segments (oldest first) and index them from their hints."""
        loaded: list[hints.Hint] = []
        for e in entries:
            seg = Segment(e.name, e.level, self.files.path(e.name))
            seg.open_sealed(self.fs)
            try:
                hpath = self.files.path(hint_name(e.name))
                h = hints.decode(self.fs.read_file(hpath), hpath, seq=seg.seq)
                if h.data_size != seg.size:
                    raise CorruptionError(
                        seg.path, f"file is {seg.size} bytes, its hint says {h.data_size}"
                    )
            except (CorruptionError, OSError):
                seg.close(self.fs)
                raise
            loaded.append(h)
            self._sealed.append(seg)
            self._segs[seg.seq] = seg
        if not loaded:
            return
        pending = PendingIndex(loaded)
        if sum(len(h.keys) for h in loaded) < LAZY_INDEX_KEYS:
            self._index = pending.build()
        else:
            # open returns now; reads use the hints' sorted key arrays until the hash
            # index, built on a thread, is adopted
            self._pending = pending
            self._start_index_build(pending)

    def _start_index_build(self, pending: PendingIndex) -> None:
        import threading

        threading.Thread(
            target=self._index_builder, args=(pending,), name="statestores-index", daemon=True
        ).start()

    def _index_builder(self, pending: PendingIndex) -> None:
        try:
            pending.build()
            with self._lock:
                self._adopt_index(pending)
        except Exception:
            log.exception("building the index of %s failed", self.directory)

    def _adopt_index(self, pending: PendingIndex) -> None:
        """(lock held) Replace the interim index by the built one, with every write since
        open applied."""
        if self._pending is not pending:
            return  # dropped meanwhile (restore, close)
        built = pending.build()
        for k in self._gone:
            built.pop(k, None)
        built.update(self._index)
        self._index = built  # before _pending = None: see _disk_get
        self._pending = None
        self._gone = set()
        self._kick()

    def _await_index(self) -> None:
        """Make sure the hash index is complete (building it here if need be)."""
        pending = self._pending
        if pending is not None:
            pending.build()
            with self._lock:
                self._adopt_index(pending)

    def _lookup(self, key: bytes) -> int | None:
        """(lock held) The address of ``key``'s live record, or None."""
        loc = self._index.get(key)
        if loc is not None or self._pending is None or key in self._gone:
            return loc
        return self._pending.lookup(key)

    def _forget(self, key: bytes) -> None:
        """(lock held) ``key`` was deleted: drop it from the index (and shadow the interim one)."""
        self._index.pop(key, None)
        if self._pending is not None:
            self._gone.add(key)

    def _write_segment(
        self, name: str, seq: int, items: list[tuple[bytes, bytes | None]], *,
        in_background: bool = False,
    ) -> tuple[int, list[bytes], array.array[int], list[bytes]]:
        """Write ``items`` (unique keys) as sealed segment ``name`` + its hint (no lock
        needed: the files are new); return its size, live keys, their addresses, tombstones.

        ``in_background`` (only from a thread that may wait, never with the lock held): in
        the ``flush`` background process, so encoding every record never holds this
        process's GIL (a region flushed at each snapshot round slowed the epochs after it).
        """
        fsync = self.sync == "fsync"
        if in_background and not self.local_background:
            try:
                fut = background.submit(
                    write_segment, None, self.directory, name, seq, items, fsync, lane="flush"
                )
            except BackgroundBusy as exc:
                log.debug("segment %s written in the foreground: %s", name, exc)
            else:
                return fut.result()
        return write_segment(self.fs, self.directory, name, seq, items, fsync)

    def _write_hint(
        self, name: str, seq: int, size: int, keys: list[bytes], addrs: Any, tombs: list[bytes]
    ) -> None:
        write_hint(
            self.fs, self.directory, name, seq, size, keys, addrs, tombs, self.sync == "fsync"
        )

    def _drop_segments(self) -> None:
        for seg in self._segs.values():
            seg.close(self.fs)
        self._segs = {}
        self._sealed = []
        self._index = {}
        self._pending = None
        self._gone = set()
