"""What an engine is: the one Protocol every engine implements.

:class:`~statestores.base.Store` holds the parts every engine shares (the file set, the
lock and the maintainer's work, the subscribers, the snapshot state) and gives the public
API on top of the methods below; an engine provides them. The hooks' contracts are here,
in one place; ``Store`` has a default for those not marked *required*.
``engines.py`` checks (with mypy) that every registered engine class satisfies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from .fs import FileSystem
from .snapshot_info import Frozen
from .version import FileEntry

__all__ = ["Engine"]


class Engine(Protocol):
    """The methods an engine gives :class:`~statestores.base.Store` (lock held unless said)."""

    # ------------------------------------------------------------------ the data API (required)

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default`` if it has none."""

    def put(self, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` (``b""`` is a value); checks it with ``check_put`` first."""

    def delete(self, key: bytes) -> None:
        """Delete ``key`` (a no-op if absent)."""

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply ``(key, value)`` ops in order, ``None`` meaning delete; all-or-nothing."""

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once."""

    def flush(self) -> None:
        """Push buffered writes to files (durability per ``sync``)."""

    # ------------------------------------------------------------------ life cycle

    @classmethod
    def preopen(cls, fs: FileSystem, path: str, entry: FileEntry) -> Any | None:
        """Open the file ``entry`` at ``path`` as ``_open`` would, for a replica that may be
        promoted (``_open`` then finds it in ``self._opened``); None: nothing to open ahead."""

    def _has_local_state(self) -> bool:
        """Whether the directory holds any state of this engine."""

    def _open(self) -> None:
        """(required) Load whatever the directory holds (after a clean close or a crash),
        starting from ``self.files.load()``."""

    def _open_empty(self) -> None:
        """Set up an empty store that is about to be restored."""

    def _close(self) -> None:
        """(required; background idle) Flush per ``sync``, release resources."""

    def _abandon(self) -> None:
        """(no lock) Drop resources without writing anything (a failed open)."""

    def _stats(self) -> dict[str, Any]:
        """(required) Engine-specific statistics."""

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        """(required) Name the files that hold all state written so far.

        Must be cheap (the caller waits): in-memory data may be handed to the maintainer
        thread, with futures in ``Frozen.pending`` that resolve once its files are durable.
        """

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        """(required; background idle) Become exactly the state of ``entries``, whose files
        are present and verified. Drop all other state and end with one
        ``_reset_version`` to ``entries`` (plus any new WAL). ``replaced``: files the
        restore just put in place under a name a local (corrupt) file had — an engine that
        keeps files open must reopen these."""

    # ------------------------------------------------------------------ background work

    def _idle(self) -> bool:
        """No background work of this store is in flight."""

    def _kick(self) -> None:
        """Start background work that may be due (a merge)."""

    def _abandon_merge(self) -> None:
        """(merges paused) Forget the merge in flight, if any, so ``_idle`` need not wait
        for it; its output is deleted when it ends, its inputs stay on disk until then."""

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The pairs of :meth:`Store.prefixed` (``prefix`` checked, the store open)."""

    def _compact(self) -> None:
        """Merge every file once into the fewest the engine keeps, dropping overwritten
        values, tombstones and values expired at the horizon; wait for it (releasing the
        lock)."""
