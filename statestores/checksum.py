"""crc32c (Castagnoli), the checksum every record and every file carries.

``crc32c(data, value=0)`` is the C function itself (no Python wrapper on the hot path).
"""

from __future__ import annotations

from crc32c import crc32c

__all__ = ["crc32c"]
