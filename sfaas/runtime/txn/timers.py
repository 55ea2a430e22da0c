"""Which durable timers are due: an in-memory index over the timer records of one
process's stores (``sfaas.runtime.txn.internal``).

The records are the truth — written and deleted by transactions, snapshotted, restored,
moved — and this index only follows them: :meth:`TimerIndex.load` reads them from the
stores (at start, after a recovery or a rescale), :meth:`TimerIndex.on_record` follows
every commit. Each epoch the process that owns a timer's partition takes the timers due by
the epoch's ``now`` (:meth:`TimerIndex.take_due`) and runs each as its own transaction,
which deletes the record and makes the call; a timer taken stays *in flight* (never taken
twice) until its record is deleted.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any

from sfaas.runtime.txn.internal import TIMER, TIMER_B, due_of

__all__ = ["TimerIndex"]


class TimerIndex:
    """The timers of one process's partitions, by due time (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str, str]] = []
        #: (operator, record key) of every timer record here
        self._live: set[tuple[str, str]] = set()
        self.in_flight: set[tuple[str, str]] = set()
        self.fired = 0

    def __len__(self) -> int:
        return len(self._live)

    def add(self, operator: str, key: str) -> None:
        if (operator, key) not in self._live:
            self._live.add((operator, key))
            heapq.heappush(self._heap, (due_of(key), operator, key))

    def remove(self, operator: str, key: str) -> None:
        self._live.discard((operator, key))
        self.in_flight.discard((operator, key))

    def on_record(self, operator: str, key: str, value: bytes | None) -> None:
        """A runtime record was applied to a store here."""
        if key.startswith(TIMER):
            if value is None:
                self.remove(operator, key)
            else:
                self.add(operator, key)

    def load(self, stores: Mapping[tuple[str, int], Any]) -> None:
        """Index every timer record of ``stores`` (``(operator, partition) → Store``)."""
        self.clear()
        for (operator, _), store in stores.items():
            for k in _records(store):
                self.add(operator, k.decode())

    def clear(self) -> None:
        self._heap, self._live, self.in_flight = [], set(), set()

    def take_due(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` timers due at ``now`` and not in flight, earliest first; they are
        in flight from now on."""
        out: list[tuple[str, str]] = []
        heap = self._heap
        while heap and len(out) < limit and heap[0][0] <= now:
            _, operator, key = heapq.heappop(heap)
            if (operator, key) in self._live and (operator, key) not in self.in_flight:
                self.in_flight.add((operator, key))
                out.append((operator, key))
        self.fired += len(out)
        return out

    def next_due(self) -> float | None:
        """When the earliest timer not in flight is due (None: no timer)."""
        heap = self._heap
        while heap and ((heap[0][1], heap[0][2]) not in self._live):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: float) -> bool:
        """Is a timer not in flight due at ``now``?"""
        nxt = self.next_due()
        return nxt is not None and nxt <= now


def _records(store: Any) -> Iterable[bytes]:
    """The timer record keys of a store (``Store.prefixed``: not a scan of every key, which
    held a worker's loop for seconds at 10M keys)."""
    return (k for k, _ in store.prefixed(TIMER_B))
