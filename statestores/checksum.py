"""crc32c (Castagnoli), the checksum every record and every file carries."""

from __future__ import annotations

from crc32c import crc32c as _crc32c

__all__ = ["crc32c"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Return the crc32c of ``data``, continuing from ``value``."""
    return _crc32c(data, value)
