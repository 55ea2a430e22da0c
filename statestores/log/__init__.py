"""Log segments and what AppendLog and HybridLog share about them.

``segment`` (one log file, writing and scanning it), ``merge`` (the background merge),
``index`` (the hash index before it is complete, and redirects after a merge),
``sealed`` (the sealed segments, their hints and the hash index over them), ``store``
(:class:`SegmentedStore`: hand-offs, reads, merges, on top of ``sealed``).
"""

from __future__ import annotations

from .merge import MergeFailed, merge_segments
from .segment import Segment, hint_name, write_records
from .store import SegmentedStore

__all__ = [
    "Segment", "SegmentedStore", "MergeFailed", "merge_segments", "write_records", "hint_name",
]
