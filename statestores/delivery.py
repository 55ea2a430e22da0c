"""Handing a store's version edits and snapshot marks to its subscribers, in order.

A part every :class:`~statestores.base.Store` holds (``store.delivery``), built on two
others: the :class:`~statestores.files.FileSet` (an event pins the files it removes or
names until every subscriber has been handed it) and the
:class:`~statestores.tasks.Tasks` (delivery runs on the maintainer thread, without the
store lock).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from .files import FileSet
from .tasks import Tasks
from .version import FileEntry, SnapshotMark, VersionEdit

log = logging.getLogger("statestores")

__all__ = ["Delivery", "Subscriber", "OUTBOX_LIMIT"]

#: A version-edit subscriber: called with each edit, in order, after it is durable.
Subscriber = Callable[[VersionEdit | SnapshotMark], None]

#: Edits waiting for delivery to subscribers, at most; beyond it the editor waits.
OUTBOX_LIMIT = 256


class Delivery:
    """The subscribers of one store and the events queued for them."""

    def __init__(self, files: FileSet, tasks: Tasks) -> None:
        #: constant after construction
        self.files = files
        self.tasks = tasks
        self._subscribers: list[Subscriber] = []
        self._outbox: deque[VersionEdit | SnapshotMark] = deque()

    def add(self, callback: Subscriber) -> None:
        """(lock held) Subscribe ``callback``."""
        self._subscribers.append(callback)

    def remove(self, callback: Subscriber) -> None:
        """(lock held) Unsubscribe ``callback`` (nothing if it is not subscribed)."""
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def idle(self) -> bool:
        """(lock held) No event is waiting for delivery."""
        return not self._outbox

    def publish(self, edit: VersionEdit) -> None:
        """(lock held) Queue ``edit``; the files it removed are deleted once every
        subscriber has it (at once when nobody subscribes)."""
        if not self._subscribers:
            self.files.delete_unneeded(edit.removed)
            return
        self._enqueue(edit, edit.removed)

    def publish_mark(self, snapshot_id: int, entries: Iterable[FileEntry]) -> None:
        """(lock held) Tell subscribers that snapshot ``snapshot_id`` (``entries``) is
        complete; its files stay on disk until every subscriber has been handed the mark."""
        if not self._subscribers:
            return
        mark = SnapshotMark(snapshot_id, self.files.version.seq, tuple(entries))
        self._enqueue(mark, [e.name for e in mark.files])

    def _enqueue(self, event: VersionEdit | SnapshotMark, pinned: Iterable[str]) -> None:
        """(lock held) Queue ``event`` for subscribers, pinning ``pinned`` until delivered."""
        self.files.pin(pinned)
        if len(self._outbox) >= OUTBOX_LIMIT and not self.tasks.maintainer.on_thread():
            self.tasks.wait(lambda: len(self._outbox) < OUTBOX_LIMIT)
        self._outbox.append(event)
        self.tasks.post_once(self.deliver)

    def deliver(self) -> None:
        """(maintainer) Hand queued edits and marks to subscribers in order, without the lock."""
        lock = self.tasks.lock
        while True:
            with lock:
                if not self._outbox:
                    self.tasks.notify()
                    return
                event = self._outbox.popleft()
                subs = list(self._subscribers)
            for cb in subs:
                try:
                    cb(event)
                except Exception:
                    log.exception(
                        "version subscriber %r failed on %r of %s",
                        cb, event, self.files.directory,
                    )
            with lock:
                if isinstance(event, SnapshotMark):
                    self.files.unpin(e.name for e in event.files)
                else:
                    self.files.unpin(event.removed)
