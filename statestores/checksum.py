"""crc32c (Castagnoli), the checksum every record and every file carries.

``crc32c(data, value=0)`` is the C function itself (no Python wrapper on the hot path).
"""

from __future__ import annotations

from crc32c import crc32c

from .fs import FileSystem

__all__ = ["crc32c", "file_crc"]


def file_crc(fs: FileSystem, path: str) -> tuple[int, int]:
    """``(size, crc32c)`` of a whole file, read in chunks."""
    fd = fs.open_read(path)
    try:
        crc = 0
        size = 0
        while True:
            chunk = fs.pread(fd, 1 << 20, size)
            if not chunk:
                break
            crc = crc32c(chunk, crc)
            size += len(chunk)
        return size, crc
    finally:
        fs.close(fd)
