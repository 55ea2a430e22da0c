"""The write path of an ``lsm`` store: the WAL, the memtable, its hand-off to the
background flush lane and the install of the flushed runs, and the freeze a snapshot
starts with (sealing the WAL, or handing the memtable off when there is none).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable

from crc32c import crc32c as crc32c_raw

from .. import background, records
from ..base import (
    Frozen,
    check_key,
    check_ops,
    check_put,
)
from ..errors import BackgroundBusy
from ..version import FileEntry, seq_of
from . import merge as merge_mod
from .runfile import RunReader, write_run
from .state import ENTRY_OVERHEAD, MAX_IMMS, Imm, LSMState

__all__ = ["LSMWrites"]

log = logging.getLogger("statestores.lsm")

_encode = records.encode
_crc = crc32c_raw
#: ``records`` body header (klen, vlen, flags); ``put`` inlines ``records.encode`` with it.
_BODY = struct.Struct("<IIB")
_CRC = struct.Struct("<I")


class LSMWrites(LSMState):
    """Writes, flushes and the snapshot freeze."""

    # ------------------------------------------------------------------ WAL files

    def _switch_wal(self) -> list[FileEntry]:
        """(lock held) Seal the active WAL and make another one active: the spare — a
        pointer swap, no syscall, already in the version — or else a new file, whose entry
        is returned for the caller's edit. The maintainer closes the old descriptor and
        makes the next spare, so a snapshot's freeze never waits for the file system."""
        old_fd = self._wal_fd
        spare, self._spare_wal = self._spare_wal, None
        added: list[FileEntry] = []
        if spare is not None:
            name, self._wal_fd = spare
        else:
            name = f"lsm-{self.files.next_seq():010d}.wal"
            self._wal_fd = self.fs.open_new(self.files.path(name))
            added.append(FileEntry(name, "wal"))
        self._wals.append(name)
        self._wal_bytes = 0
        if old_fd is not None:
            self._fds_to_close.append(old_fd)
        self.tasks.post_once(self._maintain_wals)
        return added

    def _maintain_wals(self) -> None:
        """(maintainer) Close sealed WALs' descriptors (each may take milliseconds) and
        make the next spare WAL."""
        with self._lock:
            fds, self._fds_to_close = self._fds_to_close, []
        for fd in fds:
            if self._fsync:
                self.fs.fsync(fd)
            self.fs.close(fd)
        with self._lock:
            if self._closed or self._spare_wal is not None or self._wal_fd is None:
                return
            seq = self.files.next_seq()
        name = f"lsm-{seq:010d}.wal"
        fd = self.fs.open_new(self.files.path(name))  # the syscall, without the lock
        with self._lock:
            # replay order is seq order: a spare older than the active WAL (a new file was
            # made meanwhile) would replay before it — drop it
            if (
                self._closed
                or self._spare_wal is not None
                or self._wal_fd is None
                or seq < seq_of(self._wals[-1])
            ):
                self.fs.close(fd)
                self.fs.remove(self.files.path(name))
                return
            self._spare_wal = (name, fd)
            self._edit([FileEntry(name, "wal")])

    def _drop_spare(self) -> list[str]:
        """(lock held) Close the spare WAL; its name, for the caller's edit to remove."""
        spare, self._spare_wal = self._spare_wal, None
        if spare is None:
            return []
        self.fs.close(spare[1])
        return [spare[0]]

    # ------------------------------------------------------------------ writes

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self.check_open()
        key, value = check_put(key, value)
        with self._lock:
            fd = self._wal_fd
            if fd is not None:
                # records.encode(key, value), inlined (the same bytes; see test_lsm_wal)
                body = _BODY.pack(len(key), len(value), 0) + key + value
                rec = _CRC.pack(_crc(body)) + body
                if self._raw_write:
                    n = os.write(fd, rec)
                    if n != len(rec):
                        self.fs.write(fd, rec[n:])
                else:
                    self.fs.write(fd, rec)
                if self._fsync:
                    self.fs.fsync(fd)
                self._wal_bytes += len(rec)
            mem = self._mem
            n = len(mem)
            mem[key] = value
            if len(mem) != n:
                self._mem_bytes += len(key) + len(value) + ENTRY_OVERHEAD
                if self._mem_bytes >= self._mem_limit:
                    self._rotate_locked()
            elif self._wal_bytes >= self._wal_limit:
                self._rotate_locked()

    def delete(self, key: bytes) -> None:
        if self._closed:
            self.check_open()
        key = check_key(key)
        self._apply([(key, None)], _encode(key, None))

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.check_open()
        checked = check_ops(ops)
        if checked:
            self._apply(checked, records.encode_batch(checked))

    def _apply(self, ops: list[tuple[bytes, bytes | None]], rec: bytes) -> None:
        with self._lock:
            fd = self._wal_fd
            if fd is not None:
                self.fs.write(fd, rec)
                if self._fsync:
                    self.fs.fsync(fd)
                self._wal_bytes += len(rec)
            mem = self._mem
            for k, v in ops:
                if k not in mem:
                    self._mem_bytes += len(k) + ENTRY_OVERHEAD
                mem[k] = v
                if v is not None:
                    self._mem_bytes += len(v)
            if self._mem_bytes >= self._mem_limit or self._wal_bytes >= self._wal_limit:
                self._rotate_locked()

    # ------------------------------------------------------------------ flushes

    def flush(self) -> None:
        """Write the memtable to a level-0 run (and fsync it with ``sync="fsync"``)."""
        self.check_open()
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Write the memtable to a level-0 run now (after every pending background flush,
        waited for without holding the lock)."""
        self._drain_imms()
        mem = self._mem
        if not mem and not self._sealed_wals():
            return
        added: list[FileEntry] = []
        if mem:
            keys = sorted(mem)
            values = list(map(mem.__getitem__, keys))
            if not self._runs:  # nothing older to shadow: tombstones can go
                pairs = [(k, v) for k, v in zip(keys, values, strict=False) if v is not None]
                keys = [k for k, _ in pairs]
                values = [v for _, v in pairs]
            if keys:
                name = f"lsm-L0-{self.files.next_seq():010d}.run"
                path = self.files.path(name)
                write_run(self.fs, path + ".tmp", keys, values, **self._run_opts)
                self.fs.rename(path + ".tmp", path)
                if not self._levels:
                    self._levels.append([])
                self._levels[0].append(RunReader(self.fs, path, name, 0))
                self._rebuild_runs()
                added.append(FileEntry(name, "run", 0))
        old_wals = self._wals
        self._wals = []
        if self._wal_fd is not None:
            added += self._switch_wal()
        self._edit(added, old_wals)
        self._mem = {}  # after the runs are published: lock-free readers see one or the other
        self._mem_bytes = 0
        self._flushes += 1
        self._kick()

    def _rotate_locked(self) -> None:
        """Hand the full memtable to the background flush lane and start a fresh one."""
        if len(self._imms) >= MAX_IMMS:  # flushes fall behind: stall this writer
            self.tasks.wait(lambda: len(self._imms) < MAX_IMMS or self._closed)
            self.check_open()
        if not self._mem:
            return
        mem = self._mem
        name = f"lsm-L0-{self.files.next_seq():010d}.run"
        drop = not self._runs and not self._imms
        o = self._run_opts
        try:
            fut = background.submit(
                merge_mod.flush_memtable, self._bg_fs, self.files.path(name) + ".tmp", mem, drop,
                o["density_factor"], o["block_bytes"], o["bloom_fpr"], o["fsync"],
                lane="flush", local=self.local_background,
            )
        except (BackgroundBusy, RuntimeError, OSError) as exc:
            log.warning("no background flush (%s); flushing in the foreground", exc)
            self._flush_locked()
            return
        wals = self._wals
        self._wals = []
        added = self._switch_wal() if self._wal_fd is not None else []
        self._imms = (*self._imms, Imm(mem, self._mem_bytes, wals, name, drop, fut))
        self._mem = {}  # after the imm is published: lock-free readers see one or the other
        self._mem_bytes = 0
        if added:
            self._edit(added)
        fut.add_done_callback(self.tasks.on_done(self._install_flushes))

    def _install_flushes(self, _fut: object = None) -> None:
        """(maintainer) Install finished flushes, oldest first."""
        with self._lock:
            while self._imms and self._imms[0].future.done() and not self._closed:
                self._install_imm(self._imms[0])
            self.tasks.notify()

    def _drain_imms(self) -> None:
        """(lock held) Wait, releasing the lock, until every background flush is installed."""
        if self._imms:
            self.tasks.wait(lambda: not self._imms or self._closed)

    def _install_imm(self, imm: Imm) -> None:
        """Put a flushed memtable's run into level 0 (lock held; ``imm`` is the oldest)."""
        try:
            self._install_imm_run(imm)
        except BaseException as exc:
            imm.installed.set_exception(exc)
            raise
        imm.installed.set_result(None)

    def _install_imm_run(self, imm: Imm) -> None:
        path = self.files.path(imm.name)
        try:
            result = imm.future.result()
        except Exception as exc:  # e.g. the background process died: flush here instead
            log.warning(
                "background flush of %s failed (%s); flushing in the foreground", imm.name, exc
            )
            self.fs.remove(path + ".tmp")
            keys = sorted(imm.mem)
            values = list(map(imm.mem.__getitem__, keys))
            if imm.drop_tombstones:
                keep = [i for i, v in enumerate(values) if v is not None]
                keys = [keys[i] for i in keep]
                values = [values[i] for i in keep]
            result = {"count": len(keys)}
            if keys:
                write_run(self.fs, path + ".tmp", keys, values, **self._run_opts)
        added: list[FileEntry] = []
        if result["count"]:
            self.fs.rename(path + ".tmp", path)
            if not self._levels:
                self._levels.append([])
            self._levels[0].append(RunReader(self.fs, path, imm.name, 0))
            self._rebuild_runs()
            added.append(FileEntry(imm.name, "run", 0))
        self._imms = self._imms[1:]  # after the run is published
        self._edit(added, imm.wals)
        self._flushes += 1
        self._kick()

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        if self._wal_fd is None:
            # no WAL to seal: the memtable is handed to the background flush as a full one
            # is, and the snapshot names the runs being written (its upload waits for them)
            # — the freeze itself writes nothing
            if self._mem:
                self._rotate_locked()
            # a memtable of deletes only, with nothing older to shadow, becomes no run
            imms = [
                i
                for i in self._imms
                if not (i.drop_tombstones and all(v is None for v in i.mem.values()))
            ]
            return self.files.frozen(
                extra=[FileEntry(i.name, "run", 0) for i in imms],
                pending=[i.installed for i in imms],
            )
        if self._wal_bytes:
            added = self._switch_wal()  # seal: the old WAL is immutable from now on
            if added:
                self._edit(added)
        active = self._wals[-1:] if self._wal_fd is not None else []
        spare = [self._spare_wal[0]] if self._spare_wal is not None else []
        return self.files.frozen(skip=active + spare)
