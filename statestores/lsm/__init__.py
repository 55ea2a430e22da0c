"""The ``lsm`` engine: memtable + WAL, run files with Bloom filters and fence pointers,
tiered background merges. See :mod:`.engine` (holding the parts :mod:`.wals`, :mod:`.cache`
and :mod:`.merges`; lookups in :mod:`.reads`) and ``statestores/FORMAT.md`` § lsm."""

from __future__ import annotations

from .engine import LSMStore

__all__ = ["LSMStore"]
