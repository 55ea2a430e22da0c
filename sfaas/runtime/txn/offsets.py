"""Which ingress offsets are safe to commit: only those below which every request completed.

A worker takes requests off its Kafka partitions in offset order, but they complete
(commit or finally abort, and their reply is acknowledged by the broker) out of order: a
conflicting request may wait several epochs to re-run while later ones complete. Committing
the offset of the last request *taken* would let a restart skip the ones still waiting.
:class:`OffsetTracker` keeps, per partition, the taken-but-not-completed offsets and
reports the **low watermark**: the smallest such offset, or one past the last taken
offset when none is outstanding — the position a restarted consumer must resume from.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

__all__ = ["OffsetTracker"]


@dataclass(slots=True)
class _Partition:
    #: taken offsets not yet known to be below the watermark, in increasing order
    taken: collections.deque[int] = field(default_factory=collections.deque)
    #: completed offsets still in ``taken`` (behind an outstanding one)
    done: set[int] = field(default_factory=set)
    #: one past the highest offset taken
    next: int = 0


class OffsetTracker:
    """Per-partition low watermark of completed ingress offsets (see module docstring)."""

    def __init__(self) -> None:
        self._parts: dict[int, _Partition] = {}
        self._committed: dict[int, int] = {}
        #: taken requests not yet completed, over every partition
        self.in_flight = 0

    def take(self, partition: int, offset: int) -> None:
        """Record that the request at ``offset`` of ``partition`` was taken for processing.

        Offsets of one partition must be taken in increasing order.
        """
        p = self._parts.get(partition)
        if p is None:
            p = self._parts[partition] = _Partition()
        if offset < p.next:
            raise ValueError(
                f"offset {offset} of partition {partition} taken out of order (next is {p.next})"
            )
        p.taken.append(offset)
        p.next = offset + 1
        self.in_flight += 1

    def complete(self, partition: int, offset: int) -> None:
        """Record that the request at ``offset`` of ``partition`` completed (reply delivered)."""
        p = self._parts.get(partition)
        if p is None or offset >= p.next:
            raise ValueError(f"offset {offset} of partition {partition} completed but never taken")
        if p.taken and offset == p.taken[0]:
            p.taken.popleft()
            while p.taken and p.taken[0] in p.done:
                p.done.discard(p.taken.popleft())
        elif not p.taken or offset < p.taken[0]:
            raise ValueError(f"offset {offset} of partition {partition} completed twice")
        else:
            if offset in p.done:
                raise ValueError(f"offset {offset} of partition {partition} completed twice")
            p.done.add(offset)
        self.in_flight -= 1

    def watermark(self, partition: int) -> int | None:
        """The offset a restart must resume ``partition`` from; None if nothing was taken."""
        p = self._parts.get(partition)
        if p is None:
            return None
        return p.taken[0] if p.taken else p.next

    def watermarks(self) -> dict[int, int]:
        """:meth:`watermark` of every partition that had requests taken."""
        return {part: (p.taken[0] if p.taken else p.next) for part, p in self._parts.items()}

    def completed_above(self) -> dict[int, list[int]]:
        """Per partition, the completed offsets above its watermark (behind an outstanding one)."""
        return {part: sorted(p.done) for part, p in self._parts.items() if p.done}

    def outstanding(self, partition: int) -> int:
        """How many taken requests of ``partition`` have not completed."""
        p = self._parts.get(partition)
        return 0 if p is None else len(p.taken) - len(p.done)

    def next_offset(self, partition: int) -> int | None:
        """One past the highest offset taken of ``partition`` (None: nothing taken)."""
        p = self._parts.get(partition)
        return None if p is None else p.next

    def drop(self, partition: int) -> None:
        """Forget ``partition`` (it moved to another worker)."""
        self.in_flight -= self.outstanding(partition)
        self._parts.pop(partition, None)
        self._committed.pop(partition, None)

    def to_commit(self) -> dict[int, int]:
        """Watermarks that moved since the last :meth:`mark_committed` (what to send to Kafka)."""
        return {part: o for part, o in self.watermarks().items() if self._committed.get(part) != o}

    def mark_committed(self, offsets: dict[int, int]) -> None:
        """Remember that ``offsets`` (from :meth:`to_commit`) were committed to the group."""
        self._committed.update(offsets)
