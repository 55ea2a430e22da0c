"""Log segments and what AppendLog and HybridLog hold of them.

``segment`` (one log file, writing and scanning it), ``merge`` (the background merge),
``index`` (the hash index before it is complete, and redirects after a merge),
``levels`` (the order of sealed segments: which a merge takes, where its output goes),
``sealed`` (:class:`Segments`: the sealed segments, their hash index and merges, a part
the engine holds), ``store`` (:class:`Handoffs`, the engine's work handed to the
maintainer; :func:`pairs`, :func:`live_pairs`), ``host`` (what those parts need of the
engine, declared).
"""

from __future__ import annotations

from .merge import MergeFailed, merge_segments
from .sealed import Segments
from .segment import Segment, hint_name, write_records
from .store import Handoffs, live_pairs, pairs

__all__ = [
    "Segment", "Segments", "Handoffs", "live_pairs", "pairs", "MergeFailed", "merge_segments",
    "write_records", "hint_name",
]
