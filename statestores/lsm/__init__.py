"""The ``lsm`` engine: memtable + WAL, run files with Bloom filters and fence pointers,
tiered background merges. See :mod:`.engine` (over :mod:`.reads` and :mod:`.writes`, which
share :mod:`.state`) and ``statestores/FORMAT.md`` § lsm."""

from __future__ import annotations

from .engine import LSMStore

__all__ = ["LSMStore"]
