"""What an AppendLog or HybridLog store holds beside its :class:`~.sealed.Segments`:
:class:`Handoffs`, the slow file work handed to the maintainer, and :func:`pairs`, the
live pairs of a list of keys read through the store.

Slow file work an engine must do at a snapshot (AppendLog: a sealed segment's hint;
HybridLog: writing its in-memory regions) is *handed off* to the maintainer, so
``snapshot_async`` returns in a few milliseconds; at most ``MAX_HANDOFFS`` are in flight,
then the writer waits (releasing the lock) for one.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..tasks import Tasks
from . import levels
from .host import HandoffHost, Indexed, Readable

log = logging.getLogger("statestores")

__all__ = ["Handoffs", "pairs", "MAX_HANDOFFS"]

#: Hand-offs (seals, region flushes) in flight at most; then the writer waits for one.
MAX_HANDOFFS = 4

_MISSING: Any = object()


class Handoffs:
    """The hand-offs of one store in flight (its one owner: the count)."""

    def __init__(self, tasks: Tasks, host: HandoffHost, directory: str) -> None:
        #: constant after construction
        self.tasks = tasks
        self.host = host
        self.directory = directory
        self.count = 0  # in flight (lock held to read or change)

    @property
    def full(self) -> bool:
        """(lock held) ``MAX_HANDOFFS`` are in flight."""
        return self.count >= MAX_HANDOFFS

    def wait_slot(self) -> None:
        """(lock held) Wait, releasing the lock, until fewer than ``MAX_HANDOFFS`` are in
        flight or the store closed (no error either way)."""
        if self.count >= MAX_HANDOFFS:
            self.tasks.wait(self._slot_free)

    def reserve(self) -> None:
        """(lock held, caller's thread) Before touching any state a hand-off will take:
        wait, releasing the lock, while ``MAX_HANDOFFS`` are in flight — the write path's
        backpressure. When this returns the lock is held again and a slot is free."""
        if self.count >= MAX_HANDOFFS:
            self.tasks.wait(self._slot_free)
            self.host.check_open()

    def _slot_free(self) -> bool:
        return self.count < MAX_HANDOFFS or self.host.closed

    def hand_off(self, job: Callable[[], None]) -> concurrent.futures.Future[None]:
        """(lock held, after :meth:`reserve`) Run ``job`` on the maintainer; the future
        resolves when it is done."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.count += 1
        self.tasks.post(self._run, job, fut)
        return fut

    def _run(self, job: Callable[[], None], fut: concurrent.futures.Future[None]) -> None:
        try:
            job()
        except BaseException as exc:
            log.error("background write in %s failed: %s", self.directory, exc)
            fut.set_exception(exc)
        else:
            fut.set_result(None)
        finally:
            with self.tasks.lock:
                self.count -= 1
                self.tasks.notify()

    def drain(self) -> None:
        """(lock held) Wait, releasing the lock, until every hand-off is done."""
        if self.count:
            self.tasks.wait(self._drained)

    def _drained(self) -> bool:
        return not self.count or self.host.closed


def pairs(store: Readable, keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The live pairs of ``keys``, in their order, values read 1,024 at a time."""
    get = store.get
    for i in range(0, len(keys), 1024):
        with store.lock:
            store.check_open()
            chunk = [(k, get(k, _MISSING)) for k in keys[i : i + 1024]]
        for k, v in chunk:
            if v is not _MISSING and v is not None:  # (never None: the default stands for none)
                yield k, v


def live_pairs(store: Readable, segments: Indexed, prefix: bytes | None,
               memory: Callable[[], Iterable[bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """The live pairs of ``segments``' index and of the keys ``memory()`` gives (those the
    store holds in memory, perhaps deleted), each once; with a ``prefix``, only its
    matches, sorted. The keys are taken now, under the store lock; their values are read
    as the pairs are walked (:func:`pairs`)."""
    segments.await_index()
    with store.lock:
        keys = levels.live_keys(segments.index, prefix, memory())
    return pairs(store, keys)
