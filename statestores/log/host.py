"""What the parts of an AppendLog or HybridLog store need of the store holding them,
declared: :class:`SegmentsHost` (:class:`~.sealed.Segments`), :class:`HandoffHost`
(:class:`~.store.Handoffs`), :class:`Readable` (:func:`~.store.pairs`), and
:class:`FoldedOwner`, what a merge of ``wal`` inputs tells their owner; and
:class:`Indexed`, what :func:`~.store.live_pairs` needs of the sealed segments. The engines
implement them (``Store`` gives all but :class:`FoldedOwner`); the parts call nothing
else of the store.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..version import FileEntry, VersionEdit
from .segment import Segment

__all__ = ["HandoffHost", "SegmentsHost", "FoldedOwner", "Readable", "Indexed", "MergeJob"]


class HandoffHost(Protocol):
    """What :class:`~.store.Handoffs` needs of the store holding it."""

    @property
    def closed(self) -> bool: ...

    def check_open(self) -> None:
        """Raise :class:`StoreClosedError` if the store is closed."""


class SegmentsHost(HandoffHost, Protocol):
    """What :class:`~.sealed.Segments` needs of the store holding it."""

    @property
    def merges_paused(self) -> bool: ...

    @property
    def expiry_horizon(self) -> int | None: ...

    def pause_merges(self) -> Callable[[], None]:
        """Start no new merge until the returned function is called."""

    def edit_files(
        self, added: Iterable[FileEntry] = (), removed: Iterable[str] = ()
    ) -> VersionEdit:
        """(lock held) Change the live file set by one version edit."""


class FoldedOwner(Protocol):
    """The owner of the ``wal`` inputs of a merge (AppendLog's folded segments)."""

    def folded_merge_ended(self, ok: bool) -> None:
        """(lock held) Their merge was installed (``ok``) or failed: then they are the
        owner's again, older than any folded since."""


class Readable(Protocol):
    """What :func:`~.store.pairs` needs of a store."""

    @property
    def lock(self) -> threading.RLock: ...

    def check_open(self) -> None:
        """Raise :class:`StoreClosedError` if the store is closed."""

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default`` if it has none."""


class Indexed(Protocol):
    """What :func:`~.store.live_pairs` needs of the sealed segments
    (:class:`~.sealed.Segments`): their hash index, once complete."""

    @property
    def index(self) -> dict[bytes, int]: ...

    def await_index(self) -> None:
        """Wait until the index is complete (it is built in the background on open)."""


@dataclass
class MergeJob:
    """A merge in flight: ``inputs`` (oldest first) into segment ``out_name``."""

    inputs: list[Segment]
    out_name: str
    out_seq: int
    level: int
    future: concurrent.futures.Future[tuple[int, int, int, list[bytes], int]]
    #: Set when the inputs are ``wal`` entries, not sealed segments: an AppendLog's folded
    #: segments merged straight into one level-0 segment; told how the merge ended.
    owner: FoldedOwner | None = None
