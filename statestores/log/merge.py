"""The background merge of log segments (AppendLog and HybridLog).

:func:`merge_segments` is a top-level function of plain arguments: it runs in the
background process (``statestores.background``). It writes ``<out>.tmp`` and
``<out hint>.tmp``; the store renames them, applies one version edit (output in, inputs
out) and redirects its index, so a merge that dies leaves only stray ``.tmp`` files that
the next open removes.
"""

from __future__ import annotations

import array
import os
from typing import Any

# the C function itself, not the checksum.crc32c wrapper
from crc32c import crc32c

from .. import hints, records
from ..errors import CorruptionError, StoreError
from ..expiry import MARKER, expired
from ..fs import FileSystem
from ..hints import OFFSET_BITS, OFFSET_MASK
from .segment import _HEADER, _HEADER_SIZE, _WRITE_CHUNK, hint_name, scan_segment

__all__ = ["MergeFailed", "merge_segments"]

_first = __import__("operator").itemgetter(0)


class MergeFailed(StoreError):
    """A background merge could not read its inputs (picklable across processes)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(path, detail)
        self.path = path
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def merge_segments(
    fs: FileSystem | None,
    directory: str,
    inputs: list[tuple[str, int]],
    out_name: str,
    out_seq: int,
    drop_tombstones: bool,
    fsync: bool,
    scan: bool = False,
    horizon: int | None = None,
) -> tuple[int, int, int, list[bytes], int]:
    """Merge segments ``inputs`` (``(log name, seq)``, oldest first) into ``out_name``.

    The inputs' keys come from their hint files, or with ``scan`` (an AppendLog's folded
    segments, which have none) from reading every record of the input.

    Runs in a background process (``fs`` None: the real file system) or, with a test's
    ``FaultyFS``, on a thread of this process, so an injected fault reaches it. Writes
    ``<out>.tmp`` and ``<out hint>.tmp`` (the store renames them) and returns ``(bytes,
    live records, tombstones, dropped, expired)``. The newest record of
    each key wins; tombstones are dropped with ``drop_tombstones``. A winning value
    expired at ``horizon`` (:mod:`statestores.expiry`) is written as a tombstone, or with
    ``drop_tombstones`` not at all — its key is then in ``dropped`` (the store's index must
    forget it; the hint names the others); ``expired`` counts both kinds. Every copied record's
    checksum is verified; bad input raises :class:`MergeFailed` naming the file.
    """
    fs = fs if fs is not None else FileSystem()
    out_path = os.path.join(directory, out_name)
    out_hint = os.path.join(directory, hint_name(out_name))
    maps: dict[int, tuple[Any, str]] = {}
    try:
        latest = _read_inputs(fs, directory, inputs, scan, maps)
        fd = fs.open_new(out_path + ".tmp")
        try:
            out = _Merged(out_seq << OFFSET_BITS)
            _write_merged(fs, fd, out, latest, maps, drop_tombstones, horizon, out_path)
            if fsync:
                fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.write_file_atomic(
            out_hint + ".tmp", hints.encode(out_seq, out.pos, out.keys, out.addrs, out.tombs),
            sync=fsync,
        )
        return out.pos, len(out.keys), len(out.tombs), out.dropped, out.expired
    except CorruptionError as exc:
        fs.remove(out_path + ".tmp")
        raise MergeFailed(exc.path, exc.detail) from None
    except BaseException:
        fs.remove(out_path + ".tmp")
        raise
    finally:
        for mm, _p in maps.values():
            if mm is not None:
                mm.close()


def _read_inputs(fs: FileSystem, directory: str, inputs: list[tuple[str, int]], scan: bool,
                 maps: dict[int, tuple[Any, str]]) -> dict[bytes, int]:
    """Each key's newest address in ``inputs`` (-1: a tombstone), from their hints (or,
    with ``scan``, their records); maps each input into ``maps`` (by seq), its size checked."""
    latest: dict[bytes, int] = {}
    for name, seq in inputs:
        path = os.path.join(directory, name)
        if scan:
            size, alive, deleted = scan_segment(fs, path, seq, truncate_torn=False)
            latest.update(alive)
            latest.update(dict.fromkeys(deleted, -1))
            what = "its records"
        else:
            hpath = os.path.join(directory, hint_name(name))
            h = hints.decode(fs.read_file(hpath), hpath, seq=seq)
            latest.update(zip(h.keys, h.addresses, strict=True))
            if h.tombstones:
                latest.update(dict.fromkeys(h.tombstones, -1))
            size, what = h.data_size, "its hint"
        fd = fs.open_read(path)
        try:
            mm = fs.mmap(fd)
        finally:
            fs.close(fd)
        maps[seq] = (mm, path)
        if (len(mm) if mm is not None else 0) != size:
            raise CorruptionError(path, f"size differs from {what} ({size} bytes)")
    return latest


class _Merged:
    """What the merge wrote so far: the output's bytes (``pos``), its live keys and their
    addresses (``base``: the output's seq, shifted), its tombstones, the keys it dropped."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.pos = 0
        self.keys: list[bytes] = []
        self.addrs = array.array("Q")
        self.tombs: list[bytes] = []
        self.dropped: list[bytes] = []
        self.expired = 0


def _write_merged(fs: FileSystem, fd: int, out: _Merged, latest: dict[bytes, int],
                  maps: dict[int, tuple[Any, str]], drop_tombstones: bool, horizon: int | None,
                  out_path: str) -> None:
    """Write the newest record of each key in ``latest`` to ``fd``, in key order."""
    keys, addrs, tombs, base = out.keys, out.addrs, out.tombs, out.base
    buf = bytearray()
    pos = 0
    for k, a in sorted(latest.items(), key=_first):  # hint keys must be sorted
        if a < 0:
            if drop_tombstones:
                continue
            tombs.append(k)
            buf += records.encode(k, None)
        else:
            mm, path = maps[a >> OFFSET_BITS]
            rec = _copy_record(mm, a & OFFSET_MASK, k, path)
            # the value starts after the header and the key; one byte compare
            # tells a value without an expiry header
            vpos = _HEADER_SIZE + len(k)
            if (
                horizon is not None
                and len(rec) > vpos
                and rec[vpos] == MARKER
                and expired(rec[vpos:], horizon)
            ):
                out.expired += 1
                if drop_tombstones:
                    out.dropped.append(k)
                else:
                    tombs.append(k)
                    buf += records.encode(k, None)
            else:
                keys.append(k)
                addrs.append(base + pos + len(buf))
                buf += rec
        if len(buf) >= _WRITE_CHUNK:
            fs.write(fd, buf)
            pos += len(buf)
            buf = bytearray()
            if pos > OFFSET_MASK:  # addresses hold 36 bits of offset
                raise MergeFailed(
                    out_path, "a merged segment would exceed 64 GiB; not merging"
                )
    fs.write(fd, buf)
    out.pos = pos + len(buf)


def _copy_record(mm: Any, off: int, key: bytes, path: str) -> bytes:
    """The verified bytes of the live record at ``off`` (batch flag cleared)."""
    if mm is None or off + _HEADER_SIZE > len(mm):
        raise CorruptionError(path, f"record offset {off} is past the end of the file")
    crc, klen, vlen, flags = _HEADER.unpack_from(mm, off)
    end = off + _HEADER_SIZE + klen + vlen
    rec: bytes = mm[off:end]
    if (
        end > len(mm)
        or crc32c(memoryview(rec)[4:]) != crc
        or rec[_HEADER_SIZE : _HEADER_SIZE + klen] != key
    ):
        raise CorruptionError(path, f"checksum mismatch in record at offset {off}")
    if flags & ~records.TOMBSTONE:
        # a batch member: outside its batch it is a plain record
        return records.encode(key, rec[_HEADER_SIZE + klen :])
    return rec


