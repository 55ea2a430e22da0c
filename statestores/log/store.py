"""What AppendLog and HybridLog share: sealed segments with hints, the hash index over
them, background merges, hand-offs to the maintainer, and the fast read path.

Both engines keep every key in an in-memory hash index mapping it to the logical address
of its latest record on disk. Sealed segments are immutable log files, each with a hint
file, ordered oldest → newest and carrying a level (``version.py`` derives the order).
When ``max_runs_per_level`` hinted segments share a level, they are merged into one
segment at the next level in the background process; the maintainer thread renames the
outputs, applies one version edit (output in, inputs out), and redirects the index
entries that pointed into the inputs, in chunks so writers get the lock in between.

Levels never increase from oldest to newest (tiering), so the segments of one level are
contiguous, and a merge output takes their place in the order. A merge drops overwritten
values; it drops tombstones only when no older segment exists (nothing left to shadow).

Slow file work an engine must do at a snapshot (AppendLog: a sealed segment's hint;
HybridLog: writing its in-memory regions) is *handed off* (:meth:`SegmentedStore._hand_off`)
to the maintainer, so ``snapshot_async`` returns in a few milliseconds.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from crc32c import crc32c

from .. import background, hints
from ..errors import BackgroundBusy, CorruptionError, StoreError
from ..expiry import MARKER, expired
from ..hints import OFFSET_BITS, OFFSET_MASK
from ..version import FileEntry
from .index import Redirect
from .merge import merge_segments
from .sealed import MergeJob, SealedSegments
from .segment import (
    _HEADER,
    _HEADER_SIZE,
    Segment,
    hint_name,
)

log = logging.getLogger("statestores")

__all__ = ["SegmentedStore"]

_MISSING = object()

#: Pause between two chunks of background work that takes the store lock.
YIELD_SECONDS = 0.001
#: Index entries redirected per lock hold after a merge.
REDIRECT_CHUNK = 1 << 12
#: Hand-offs (seals, region flushes) in flight at most; then the writer waits for one.
MAX_HANDOFFS = 4


class SegmentedStore(SealedSegments):
    """Shared machinery of AppendLog and HybridLog: the sealed segments of
    :class:`~.sealed.SealedSegments`, plus hand-offs, reads and merges."""

    # ------------------------------------------------------------------ hand-offs

    def _reserve_handoff(self) -> None:
        """(lock held, caller's thread) Before touching any state a hand-off will take:
        wait, releasing the lock, while ``MAX_HANDOFFS`` are in flight — the write path's
        backpressure. When this returns the lock is held again and a slot is free."""
        if self._handoffs >= MAX_HANDOFFS:
            self.tasks.wait(lambda: self._handoffs < MAX_HANDOFFS or self._closed)
            self.check_open()

    def _hand_off(self, job: Callable[[], None]) -> concurrent.futures.Future[None]:
        """(lock held, after :meth:`_reserve_handoff`) Run ``job`` on the maintainer; the
        future resolves when it is done."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._handoffs += 1

        def run() -> None:
            try:
                job()
            except BaseException as exc:
                log.error("background write in %s failed: %s", self.directory, exc)
                fut.set_exception(exc)
            else:
                fut.set_result(None)
            finally:
                with self._lock:
                    self._handoffs -= 1
                    self.tasks.notify()

        self.tasks.post(run)
        return fut

    def _drain_handoffs(self) -> None:
        """(lock held) Wait, releasing the lock, until every hand-off is done."""
        if self._handoffs:
            self.tasks.wait(lambda: not self._handoffs or self._closed)

    # ------------------------------------------------------------------ reads

    def _disk_get(self, key: bytes, default: Any) -> Any:
        """The value at the index entry of ``key`` (``default`` if none): the fast read path."""
        index = self._index
        loc = index.get(key)
        if loc is None:
            if self._pending is None and self._index is index:
                return default
            return self._read_slow(key, default)  # the index is still being built
        seg = self._segs.get(loc >> OFFSET_BITS)
        off = loc & OFFSET_MASK
        if seg is not None and off < seg.mapped:
            mm = seg.mm
            crc, klen, vlen, _flags = _HEADER.unpack_from(mm, off)
            rec = mm[off + 4 : off + _HEADER_SIZE + klen + vlen]
            if crc32c(rec) == crc:
                return rec[9 + klen :]
        return self._read_slow(key, default)

    def _read_slow(self, key: bytes, default: Any) -> Any:
        """Read under the lock: tails of the active segment, remaps, and corrupt records."""
        with self._lock:
            loc = self._lookup(key)
            if loc is None:
                return default
            seg = self._segs.get(loc >> OFFSET_BITS)
            if seg is None:
                raise StoreError(
                    f"{self.directory}: index entry of key {key!r:.60} names unknown segment "
                    f"{loc >> OFFSET_BITS}"
                )
            rkey, value = seg.read(self.fs, loc & OFFSET_MASK)
            if rkey != key:
                raise CorruptionError(
                    seg.path,
                    f"record at offset {loc & OFFSET_MASK} holds key {rkey!r:.60}, expected "
                    f"{key!r:.60}",
                )
            return default if value is None else value

    def _get_any(self, key: bytes) -> Any:
        return self.get(key, _MISSING)  # type: ignore[arg-type]

    def _memory_keys(self) -> Iterable[bytes]:
        """Keys held outside the disk index (HybridLog's in-memory regions)."""
        return ()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once (values read in chunks, so memory stays bounded)."""
        self.check_open()
        self._await_index()
        with self._lock:
            keys = list(self._index)
            extra = [k for k in dict.fromkeys(self._memory_keys()) if k not in self._index]
        keys += extra
        return self._pairs(keys)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The in-memory keys walked, only the matches' values read."""
        self._await_index()
        with self._lock:
            keys = [k for k in self._index if k.startswith(prefix)]
            keys += [k for k in dict.fromkeys(self._memory_keys())
                     if k.startswith(prefix) and k not in self._index]
        keys.sort()
        return self._pairs(keys)

    def _pairs(self, keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """The live pairs of ``keys``, in their order, values read 1,024 at a time."""
        for i in range(0, len(keys), 1024):
            with self._lock:
                self.check_open()
                chunk = [(k, self._get_any(k)) for k in keys[i : i + 1024]]
            for k, v in chunk:
                if v is not _MISSING:
                    yield k, v

    # ------------------------------------------------------------------ merges

    def _idle(self) -> bool:
        return self._merge is None and self._redirect is None and not self._handoffs

    def _may_merge(self) -> bool:
        """(lock held) No merge or redirect runs, none is paused, and the index is complete
        (the redirect after a merge needs it; its adoption kicks again)."""
        return (
            self._merge is None
            and self._redirect is None
            and not self._paused
            and not self._closed
            and self._pending is None
        )

    def _kick(self) -> None:
        """(lock held) Start a merge if a level is full and none is running."""
        if not self._may_merge():
            return
        limit = self.options["max_runs_per_level"]
        if len(self._sealed) < self._merge_retry_at:
            return  # the last merge failed: wait for more segments before trying again
        counts = Counter(s.level for s in self._sealed)
        for level in sorted(counts):
            if counts[level] < limit:
                continue
            first = next(i for i, s in enumerate(self._sealed) if s.level == level)
            inputs = self._sealed[first : first + counts[level]]
            if any(s.level != level for s in inputs):
                log.warning(
                    "segments of level %d in %s are not contiguous; not merging", level,
                    self.directory,
                )
                continue
            # the oldest hinted ones (a newer segment's hint may still be being written; its
            # hand-off kicks again): the output, one level up, sorts before the rest
            n = next((i for i, s in enumerate(inputs) if not s.hinted), len(inputs))
            if n < limit:
                continue
            self._start_merge(
                inputs[:n], self.files.next_seq(), level + 1, drop_tombstones=first == 0
            )
            return

    def _start_merge(
        self,
        inputs: list[Segment],
        seq: int,
        level: int,
        *,
        drop_tombstones: bool,
        wals: bool = False,
        on_failure: Callable[[], None] | None = None,
    ) -> bool:
        """(lock held) Merge ``inputs`` (oldest first) into segment ``seq`` of ``level`` in
        the background merge process; False if its lane is full (a later kick tries again).
        ``wals``: the inputs have no hints (their records are read); see :class:`MergeJob`."""
        out = self._segment_name(level, seq)
        try:
            fut = background.submit(
                merge_segments,
                self._bg_fs,
                self.directory,
                [(s.name, s.seq) for s in inputs],
                out,
                seq,
                drop_tombstones,
                self.sync == "fsync",
                wals,
                self._horizon,
                lane="merge",
                local=self.local_background,
            )
        except BackgroundBusy as exc:
            log.debug("merge in %s postponed: %s", self.directory, exc)
            return False
        self._merge = MergeJob(inputs, out, seq, level, fut, wals, on_failure)
        fut.add_done_callback(self.tasks.on_done(self._merge_done))
        return True

    def _merge_done(self, fut: concurrent.futures.Future[Any]) -> None:
        """(maintainer) Install a finished merge, then redirect the index in chunks."""
        try:
            job = self._merge
            pre: hints.Hint | None = None
            if job is not None and job.future is fut and fut.exception() is None:
                # decode the output's hint before taking the lock: it is the slow part
                path = self.files.path(hint_name(job.out_name)) + ".tmp"
                try:
                    pre = hints.decode(self.fs.read_file(path), path, seq=job.out_seq)
                except (OSError, CorruptionError):
                    pre = None  # _finish_merge reads it again and reports
            with self._lock:
                if self._merge is None or self._merge.future is not fut:
                    return
                try:
                    self._finish_merge(pre)
                finally:
                    self.tasks.notify()
                r = self._redirect
            # point the index at the output in chunks, letting writers in between
            while r is not None:
                with self._lock:
                    chunk = None if self._paused or self._closed else REDIRECT_CHUNK
                    if self._redirect is not r or self._redirect_step(r, chunk):
                        self.tasks.notify()
                        return
                # a lock is not fair: give a waiting writer the chance to take it
                time.sleep(YIELD_SECONDS)
        except Exception:
            log.exception("installing a merge in %s failed", self.directory)
            with self._lock:
                self._merge = None
                self._redirect = None
                self.tasks.notify()

    def _finish_merge(self, pre: hints.Hint | None = None) -> None:
        """(lock held, merge future done) Install the merge output in place of its inputs.

        The index redirect that follows is left in ``self._redirect`` (see
        :meth:`_redirect_step`); until it is done the inputs' mappings stay readable.
        """
        job = self._merge
        assert job is not None
        self._merge = None
        out_path = self.files.path(job.out_name)
        out_hint = self.files.path(hint_name(job.out_name))
        try:
            size, _live, _tombs, dropped, n_expired = job.future.result()
            if self._closed:
                raise StoreError("the store closed before the merge was installed")
        except Exception as exc:
            self._merge_failures += 1
            log.error("merge into %s failed: %s", out_path, exc)
            self.fs.remove(out_path + ".tmp")
            self.fs.remove(out_hint + ".tmp")
            if job.on_failure is not None:
                job.on_failure()
            else:
                self._merge_retry_at = len(self._sealed) + self.options["max_runs_per_level"]
            return
        self.fs.rename(out_path + ".tmp", out_path)
        self.fs.rename(out_hint + ".tmp", out_hint)
        seg = Segment(job.out_name, job.level, out_path)
        seg.open_sealed(self.fs)
        h = (
            pre
            if pre is not None
            else hints.decode(self.fs.read_file(out_hint), out_hint, seq=job.out_seq)
        )
        if not job.wals:
            first = self._sealed.index(job.inputs[0])
            sealed = self._sealed[:first] + [seg] + self._sealed[first + len(job.inputs) :]
            removed = [n for s in job.inputs for n in (s.name, hint_name(s.name))]
        else:
            # newer than every sealed segment but those sealed since the merge began
            first = next(
                (i for i, s in enumerate(self._sealed) if s.level == 0 and s.seq > seg.seq),
                len(self._sealed),
            )
            sealed = self._sealed[:first] + [seg] + self._sealed[first:]
            removed = [s.name for s in job.inputs]
            for s in job.inputs:
                # closes their descriptors; the mappings stay readable until the redirect is done
                s.seal(self.fs)
        # the commit point; the inputs' files go, their mappings stay readable until the
        # redirect is done
        self._edit(
            [
                FileEntry(seg.name, "segment", seg.level),
                FileEntry(hint_name(seg.name), "hint", seg.level),
            ],
            removed,
        )
        self._sealed = sealed
        self._segs[seg.seq] = seg
        self._merged_bytes += size
        self._expired_dropped += n_expired
        # a key the output holds no live record of (a tombstone — perhaps a value found
        # expired — or a value dropped as expired) leaves the index if it pointed into an
        # input: the output's verdict is its newest
        self._redirect = Redirect(
            h.keys, h.addresses, {s.seq for s in job.inputs}, job.inputs,
            list(h.tombstones) + dropped if h.tombstones else dropped,
        )

    def _redirect_step(self, r: Redirect, limit: int | None) -> bool:
        """(lock held) Redirect up to ``limit`` index entries from the merge inputs to the
        output (``None``: all); when all are done, drop the inputs. True when finished."""
        index = self._index
        get = index.get
        gone = r.gone
        n = len(r.keys)
        total = n + len(r.drop)
        end = total if limit is None else min(total, r.pos + limit)
        if r.pos < n:
            stop = min(end, n)
            for k, a in zip(r.keys[r.pos : stop], r.addrs[r.pos : stop], strict=True):
                cur = get(k)
                if cur is not None and (cur >> OFFSET_BITS) in gone:
                    index[k] = a
        if end > n:
            for k in r.drop[max(r.pos, n) - n : end - n]:
                cur = get(k)
                if cur is not None and (cur >> OFFSET_BITS) in gone:
                    del index[k]
        r.pos = end
        if end < total:
            return False
        self._redirect = None
        for s in r.inputs:
            self._segs.pop(s.seq, None)
        self._merges_done += 1
        self._kick()
        return True

    # ------------------------------------------------------------------ one merge cycle

    def _compact_prepare(self) -> None:
        """(lock held) Before a compaction: put what memory holds into sealed segments
        (HybridLog: both regions into a log file, as :meth:`flush` does)."""
        self.flush()

    def _compact(self) -> None:
        """(lock held) One merge cycle: everything written so far sealed, then every
        sealed segment merged into one — the oldest data, so tombstones and expired values
        vanish. Waits (releasing the lock) for hand-offs and a running merge first, then
        for this one and its index redirect."""
        self._compact_prepare()
        self._paused += 1  # no level merge starts in between
        try:
            self._drain_handoffs()
            self.tasks.wait(
                lambda: (self._merge is None and self._redirect is None) or self._closed
            )
            self.check_open()
            self._await_index()  # the redirect after the merge needs the whole index
            n = next((i for i, s in enumerate(self._sealed) if not s.hinted), len(self._sealed))
            inputs = self._sealed[:n]  # oldest first; a segment sealed meanwhile stays newer
            if not inputs:
                return
            # alone at its level, older than any level-0 segment sealed from now on
            level = max(1, max(s.level for s in inputs))
            while not self._start_merge(inputs, self.files.next_seq(), level, drop_tombstones=True):
                self.tasks.cond.wait(0.05)  # the merge lane is full: try again shortly
                self.check_open()
            job = self._merge
            assert job is not None
            self.tasks.wait(
                lambda: (self._merge is not job and self._redirect is None) or self._closed
            )
            self.check_open()
            exc = job.future.exception()
            if exc is not None:
                raise StoreError(f"compaction of {self.directory} failed: {exc}") from exc
        finally:
            self._paused -= 1
            if not self._paused and not self._closed:
                self._kick()

    def _region_items(
        self, merged: dict[bytes, bytes | None], index: dict[bytes, int], exact: bool
    ) -> list[tuple[bytes, bytes | None]]:
        """The records a log file written from in-memory records (HybridLog's regions,
        last record per key) needs: without an expiry horizon, a tombstone only where a log
        file may still hold the key (``index`` has it, or is not ``exact`` — still being
        built). With one, every tombstone, and a value expired at the horizon becomes one:
        a merge then forgets keys whose newest record it found expired, while a snapshot
        frozen before that merge was installed holds its inputs — the key's old value —
        and this file (a region being written is part of the snapshot), so the index
        cannot tell that no file holds the key any more (a delete left out here let a
        snapshot show the old value: the restore model's seed 192915291)."""
        horizon = self._horizon
        if horizon is None:
            return [(k, v) for k, v in merged.items() if v is not None or not exact or k in index]
        out: list[tuple[bytes, bytes | None]] = []
        n_expired = 0
        for k, v in merged.items():
            if v and v[0] == MARKER and expired(v, horizon):
                v = None
                n_expired += 1
            out.append((k, v))
        self._expired_dropped += n_expired
        return out

    # ------------------------------------------------------------------ stats

    def _segment_stats(self) -> dict[str, Any]:
        self._await_index()
        index = self._index
        sample = list(itertools.islice(index, 64))
        per_key = (sum(sys.getsizeof(k) for k in sample) / len(sample) if sample else 0) + 32
        levels = Counter(s.level for s in self._sealed)
        return {
            "keys_on_disk": len(index),
            "index_bytes": int(sys.getsizeof(index) + per_key * len(index)),
            "segments": len(self._sealed),
            "files_per_level": {f"L{lv}": levels[lv] for lv in sorted(levels)},
            "sealed_bytes": sum(s.size for s in self._sealed),
            "merges_done": self._merges_done,
            "merges_running": 0 if self._merge is None else 1,
            "merge_failures": self._merge_failures,
            "merged_bytes": self._merged_bytes,
            "expired_dropped": self._expired_dropped,
            "handoffs_pending": self._handoffs,
        }
