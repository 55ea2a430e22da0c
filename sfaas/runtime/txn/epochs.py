"""Deterministic-epoch transaction logic (Aria-style), with no I/O.

Every transaction gets a **tid** that orders it totally: ``(first epoch, worker, seq)``
packed into one int. A conflict-aborted transaction keeps its tid when it re-runs, so it
keeps its priority, and the lowest pending tid can never be aborted: progress is guaranteed.

In an epoch every transaction runs against the state as of the epoch start, buffering its
writes; the worker owning each key records which tids read and wrote it. At the barrier:

* ``find_conflicts``: a tid conflicts if a *lower* tid wrote a key it read or wrote
  (write-after-write and read-after-write hazards). Write reservations count for every
  tid, also ones that later abort — conservative, hence safe.
* ``decide``: conflicting tids re-run next epoch (their user aborts are ignored: they read
  stale data); the others either abort for good (a user abort — the function raised) or
  commit. Committed transactions never share a written key and never read a key a lower
  committed tid wrote, so applying their writes equals running them serially in tid order.
  Across epochs the serial order is (epoch of commit, tid): a re-run keeps its old tid,
  which puts it first within the epoch it finally commits in, after everything committed
  in earlier epochs.

A *fallback phase* follows the commit: every conflicting root re-runs at once against
the committed state, under ordered locks across workers (``Engine.begin_fallback``; a key
is used by the re-runs in tid order), and sits in the serial order right after the
epoch's commits, in tid order; one that uses a key its first run did not re-runs next
epoch. (``Engine.run_fallback`` is the older, per-worker form: only roots whose calls
never left their worker, one at a time; ``SFAAS_FALLBACK=local``.)
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sfaas.runtime.partitioning import partition_of

__all__ = [
    "Key",
    "make_tid",
    "tid_parts",
    "find_conflicts",
    "find_blockers",
    "Decision",
    "decide",
    "AccessLog",
    "Sequencer",
    "execution_finished",
    "MAX_WORKERS",
    "MAX_SEQ",
]

#: ``(operator, key)``: the unit of conflict detection.
Key = tuple[str, str]

_WORKER_BITS = 12
_SEQ_BITS = 24
#: Most workers a tid can name.
MAX_WORKERS = 1 << _WORKER_BITS
#: Most transactions one worker may sequence in one epoch.
MAX_SEQ = 1 << _SEQ_BITS


def make_tid(epoch: int, worker: int, seq: int) -> int:
    """Pack ``(epoch, worker, seq)`` into one int whose order is the lexicographic order."""
    if epoch < 0 or not 0 <= worker < MAX_WORKERS or not 0 <= seq < MAX_SEQ:
        raise ValueError(f"tid parts out of range: epoch={epoch} worker={worker} seq={seq}")
    return (epoch << (_WORKER_BITS + _SEQ_BITS)) | (worker << _SEQ_BITS) | seq


def tid_parts(tid: int) -> tuple[int, int, int]:
    """Inverse of :func:`make_tid`."""
    return (
        tid >> (_WORKER_BITS + _SEQ_BITS),
        (tid >> _SEQ_BITS) & (MAX_WORKERS - 1),
        tid & (MAX_SEQ - 1),
    )


def find_blockers(
    reads: Mapping[int, Iterable[Key]], writes: Mapping[int, Iterable[Key]]
) -> dict[int, int]:
    """Conflicting tids, each mapped to its *blocker*.

    A tid conflicts if some lower tid wrote a key it read or wrote. Its blocker is the
    nearest such writer (the highest lower tid writing one of its keys): re-running
    before the blocker commits would just conflict again, so schedulers defer it (see
    :meth:`Sequencer.take_retries`). On a hot key this forms a chain in tid order.
    """
    writers: dict[Key, list[int]] = {}
    for tid, keys in writes.items():
        for key in keys:
            writers.setdefault(key, []).append(tid)
    for tids in writers.values():
        if len(tids) > 1:
            tids.sort()
    blockers: dict[int, int] = {}
    for accesses in (writes, reads):
        for tid, keys in accesses.items():
            best = blockers.get(tid, -1)
            for key in keys:
                ws = writers.get(key)
                if ws is None or ws[0] >= tid:
                    continue
                # the highest writer below tid
                i = bisect.bisect_left(ws, tid)
                if ws[i - 1] > best:
                    best = ws[i - 1]
            if best >= 0:
                blockers[tid] = best
    return blockers


def find_conflicts(
    reads: Mapping[int, Iterable[Key]], writes: Mapping[int, Iterable[Key]]
) -> set[int]:
    """Tids that must re-run: some lower tid wrote a key they read or wrote."""
    return set(find_blockers(reads, writes))


@dataclass
class Decision:
    """The fate of each transaction of an epoch."""

    committed: list[int] = field(default_factory=list)
    rerun: list[int] = field(default_factory=list)
    #: tid → (error type, reason) for user aborts that are final.
    aborted: dict[int, tuple[str, str]] = field(default_factory=dict)


def decide(
    tids: Iterable[int],
    conflicts: set[int],
    user_aborts: Mapping[int, tuple[str, str]],
) -> Decision:
    """Split ``tids`` into committed, re-run and (finally) aborted."""
    d = Decision()
    for tid in sorted(tids):
        if tid in conflicts:
            d.rerun.append(tid)
        elif tid in user_aborts:
            d.aborted[tid] = user_aborts[tid]
        else:
            d.committed.append(tid)
    return d


class AccessLog:
    """One worker's record of one epoch: who read/wrote which of its keys, who failed."""

    __slots__ = ("reads", "writes", "user_aborts", "seqs")

    def __init__(self) -> None:
        self.reads: dict[int, set[Key]] = {}
        #: tid → {key: encoded value, or None for a delete}
        self.writes: dict[int, dict[Key, bytes | None]] = {}
        self.user_aborts: dict[int, tuple[str, str]] = {}
        #: (tid, key) → effects, actions and timers numbered so far in this run
        self.seqs: dict[tuple[int, Key], int] = {}

    def next_seq(self, tid: int, key: Key) -> int:
        """The number of ``tid``'s next effect, action or timer on ``key`` in this run (the
        same on every run that does the same thing: they count in the order made)."""
        n = self.seqs.get((tid, key), 0)
        self.seqs[(tid, key)] = n + 1
        return n

    def record_read(self, tid: int, key: Key) -> None:
        """``tid`` read ``key`` from the epoch-start state."""
        s = self.reads.get(tid)
        if s is None:
            self.reads[tid] = {key}
        else:
            s.add(key)

    def record_write(self, tid: int, key: Key, value: bytes | None) -> None:
        """``tid`` wrote ``value`` (None: deleted) to ``key``; buffered until commit."""
        w = self.writes.get(tid)
        if w is None:
            self.writes[tid] = {key: value}
        else:
            w[key] = value

    def record_abort(self, tid: int, error_type: str, reason: str) -> None:
        """``tid`` failed here; the first failure recorded is the one reported."""
        self.user_aborts.setdefault(tid, (error_type, reason))

    def buffered(self, tid: int, key: Key) -> tuple[bool, bytes | None]:
        """``(True, value)`` if ``tid`` wrote ``key`` this epoch, else ``(False, None)``."""
        w = self.writes.get(tid)
        if w is not None and key in w:
            return True, w[key]
        return False, None

    def conflicts(self) -> dict[int, int]:
        """Tids conflicting on this worker's keys → their blockers (see :func:`find_blockers`)."""
        return find_blockers(self.reads, self.writes)

    def commit_batches(
        self, committed: Iterable[int], partitions: int
    ) -> dict[tuple[str, int], list[tuple[bytes, bytes | None]]]:
        """Per ``(operator, partition)`` store, the ``write_batch`` ops applying the committed
        tids' writes (``partitions``: the key space's partition count)."""
        batches: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        for tid in committed:
            w = self.writes.get(tid)
            if not w:
                continue
            for (op, key), value in w.items():
                where = (op, partition_of(op, key, partitions))
                batches.setdefault(where, []).append((key.encode(), value))
        return batches


def execution_finished(
    n_workers: int, counters: Mapping[int, tuple[Sequence[int], Sequence[int]]]
) -> bool:
    """Whether an epoch's execution is over, given each worker's latest ``(sent, served)``.

    ``sent[j]``/``served[j]``: calls a worker sent to / finished serving for worker ``j``.
    Over when every worker reported (its roots are done) and every call sent was served.
    """
    if len(counters) < n_workers:
        return False
    return all(
        counters[i][0][j] == counters[j][1][i] for i in range(n_workers) for j in range(n_workers)
    )


@dataclass(order=True)
class _Retry:
    tid: int
    item: Any = field(compare=False)
    blocker: int = field(default=-1, compare=False)


class Sequencer:
    """Assigns tids to new work and keeps conflict-aborted work (with its tid) for re-runs."""

    def __init__(self, worker: int) -> None:
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"worker index must be in [0, {MAX_WORKERS}), got {worker}")
        self.worker = worker
        self._retries: list[_Retry] = []

    def requeue(self, tid: int, item: Any, blocker: int = -1) -> None:
        """Keep ``item`` (conflict-aborted by ``blocker``) to re-run later under the same
        ``tid``."""
        heapq.heappush(self._retries, _Retry(tid, item, blocker))

    @property
    def pending_retries(self) -> int:
        """How many re-runs are waiting."""
        return len(self._retries)

    def discard(self, tids: Iterable[int]) -> None:
        """Drop the waiting re-runs with these tids (a replay runs them from its log)."""
        drop = set(tids)
        if drop and any(r.tid in drop for r in self._retries):
            self._retries = [r for r in self._retries if r.tid not in drop]
            heapq.heapify(self._retries)

    def retries(self) -> list[tuple[int, Any]]:
        """The waiting re-runs as ``(tid, item)``, lowest tid first (nothing is taken)."""
        return [(r.tid, r.item) for r in sorted(self._retries)]

    def pending_tids(self) -> set[int]:
        """The tids of the waiting re-runs."""
        return {r.tid for r in self._retries}

    def take_retries(
        self, max_retries: int | None = None, blocked: set[int] | frozenset[int] = frozenset()
    ) -> list[tuple[int, Any]]:
        """Re-runs for this epoch: lowest tids first, at most ``max_retries``.

        A re-run whose blocker is in ``blocked`` (still pending) waits: it would only
        conflict again. The lowest pending tid's blocker is never pending, so it always
        runs — progress is kept. Bounding the re-runs keeps epochs short under contention.
        """
        limit = len(self._retries) if max_retries is None else max_retries
        chosen: list[_Retry] = []
        waiting: list[_Retry] = []
        while self._retries and len(chosen) < limit:
            r = heapq.heappop(self._retries)
            (waiting if r.blocker in blocked else chosen).append(r)
        for r in waiting:
            heapq.heappush(self._retries, r)
        return [(r.tid, r.item) for r in chosen]

    def assign(self, epoch: int, new_items: Iterable[Any]) -> list[tuple[int, Any]]:
        """Fresh tids for new work, in arrival order."""
        return [(make_tid(epoch, self.worker, seq), item) for seq, item in enumerate(new_items)]

    def batch(
        self,
        epoch: int,
        new_items: Iterable[Any],
        max_retries: int | None = None,
        blocked: set[int] | frozenset[int] = frozenset(),
    ) -> list[tuple[int, Any]]:
        """:meth:`take_retries` followed by :meth:`assign` of ``new_items``."""
        return self.take_retries(max_retries, blocked) + self.assign(epoch, new_items)
