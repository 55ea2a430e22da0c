"""The pure epoch logic: tids, conflict detection, decisions, and serializability."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.txn.epochs import (
    MAX_SEQ,
    AccessLog,
    Sequencer,
    decide,
    find_conflicts,
    make_tid,
    tid_parts,
)


def test_tid_order_is_epoch_then_worker_then_seq() -> None:
    tids = [make_tid(e, w, s) for e in (1, 2) for w in (0, 3) for s in (0, 5, MAX_SEQ - 1)]
    assert tids == sorted(tids)
    assert all(tid_parts(make_tid(*p)) == p for p in [(0, 0, 0), (7, 4095, MAX_SEQ - 1)])
    with pytest.raises(ValueError, match="out of range"):
        make_tid(1, 1, MAX_SEQ)


def test_write_after_write_aborts_the_higher_tid() -> None:
    k = ("op", "a")
    assert find_conflicts({}, {1: [k], 2: [k]}) == {2}


def test_read_after_lower_write_aborts_reader_but_not_lower_reader() -> None:
    k = ("op", "a")
    # 2 writes a; 1 read it (1 is before 2: fine), 3 read it (stale): conflict
    assert find_conflicts({1: [k], 3: [k]}, {2: [k]}) == {3}


def test_disjoint_transactions_all_commit() -> None:
    reads = {1: [("o", "a")], 2: [("o", "b")]}
    writes = {1: [("o", "a")], 2: [("o", "b")]}
    assert find_conflicts(reads, writes) == set()


def test_decide_conflicts_beat_user_aborts() -> None:
    d = decide([3, 1, 2], conflicts={2}, user_aborts={2: ("Abort", "x"), 3: ("Abort", "no")})
    assert d.committed == [1]
    assert d.rerun == [2]
    assert d.aborted == {3: ("Abort", "no")}


def test_sequencer_reruns_first_with_their_old_tids() -> None:
    seq = Sequencer(1)
    first = seq.batch(1, ["a", "b"])
    seq.requeue(first[1][0], "b")
    second = seq.batch(2, ["c"])
    assert [item for _, item in second] == ["b", "c"]
    assert second[0][0] == first[1][0] < second[1][0]


def test_commit_batches_only_committed_writes_grouped_by_partition_store() -> None:
    log = AccessLog()
    log.record_write(1, ("x", "k1"), b"1")
    log.record_write(2, ("x", "k2"), None)
    log.record_write(3, ("y", "k3"), b"3")
    log.record_write(3, ("y", "k4"), b"4")
    p2, p3, p4 = (partition_of(op, k, 8) for op, k in (("x", "k2"), ("y", "k3"), ("y", "k4")))
    want: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {("x", p2): [(b"k2", None)]}
    for part, entry in ((p3, (b"k3", b"3")), (p4, (b"k4", b"4"))):
        want.setdefault(("y", part), []).append(entry)
    assert log.commit_batches([2, 3], 8) == want


# --- randomized serializability ------------------------------------------------------------

KEYS = ["a", "b", "c", "d", "e"]
# a transaction program: a list of steps (key, kind) with kind in read / write / rmw
program = st.lists(
    st.tuples(st.sampled_from(KEYS), st.sampled_from(["read", "write", "rmw"])),
    min_size=1,
    max_size=4,
)


def run_program(idx: int, prog: list[tuple[str, str]], read_fn, write_fn) -> tuple[bool, list]:
    """Run ``prog`` deterministically; returns (user-aborted?, observations)."""
    seen: list = []
    acc = idx
    for key, kind in prog:
        if kind in ("read", "rmw"):
            v = read_fn(key)
            seen.append((key, v))
            acc = (acc * 31 + v) % 1009
        if kind in ("write", "rmw"):
            write_fn(key, acc)
    # a data-dependent user abort, so aborts depend on what was read
    return acc % 7 == 0, seen


@settings(max_examples=150, deadline=None)
@given(
    programs=st.lists(program, min_size=1, max_size=25),
    batch=st.integers(min_value=1, max_value=10),
    workers=st.integers(min_value=1, max_value=3),
)
def test_committed_history_equals_serial_execution_in_epoch_then_tid_order(programs, batch, workers) -> None:
    state: dict[str, int] = {}
    seqs = [Sequencer(w) for w in range(workers)]
    pending = list(enumerate(programs))
    # txn index -> ((commit epoch, tid), aborted, seen): the serial order is epoch, then tid
    # (a re-run keeps its old tid, which orders it first within the epoch it finally runs in)
    outcome: dict[int, tuple[tuple[int, int], bool, list]] = {}
    epoch = 0
    while pending or any(s.pending_retries for s in seqs):
        epoch += 1
        assert epoch < 10_000, "no progress"
        new, pending = pending[: batch * workers], pending[batch * workers :]
        work = []
        blocked = set().union(*(s.pending_tids() for s in seqs))
        for w in range(workers):
            work += seqs[w].batch(epoch, new[w::workers], max_retries=batch, blocked=blocked)
        log = AccessLog()
        results = {}
        for tid, (idx, prog) in work:
            buf: dict[str, int] = {}

            def read(key: str, tid: int = tid, buf: dict[str, int] = buf, log: AccessLog = log) -> int:
                if key in buf:
                    return buf[key]
                log.record_read(tid, ("o", key))
                return state.get(key, 0)

            def write(
                key: str, value: int, tid: int = tid, buf: dict[str, int] = buf, log: AccessLog = log
            ) -> None:
                buf[key] = value
                log.record_write(tid, ("o", key), str(value).encode())

            aborted, seen = run_program(idx, prog, read, write)
            if aborted:
                log.record_abort(tid, "Abort", "data-dependent")
            results[tid] = (idx, prog, aborted, seen)
        blockers = log.conflicts()
        assert all(b < t for t, b in blockers.items())
        d = decide(results, set(blockers), log.user_aborts)
        for tid in d.committed:
            for (_, key), raw in log.writes.get(tid, {}).items():
                state[key] = int(raw)
        for tid in d.rerun:
            idx, prog, _, _ = results[tid]
            seqs[tid_parts(tid)[1]].requeue(tid, (idx, prog), blockers[tid])
        for tid in list(d.committed) + list(d.aborted):
            idx, _, aborted, seen = results[tid]
            outcome[idx] = ((epoch, tid), aborted, seen)
        if work:
            # the lowest tid of an epoch never re-runs: progress
            assert min(t for t, _ in work) not in d.rerun

    assert sorted(outcome) == list(range(len(programs)))
    # serial execution in tid order must observe and produce exactly the same
    serial: dict[str, int] = {}
    for idx, (_tid, aborted, seen) in sorted(outcome.items(), key=lambda kv: kv[1][0]):
        buf: dict[str, int] = {}
        s_aborted, s_seen = run_program(
            idx, programs[idx], lambda k, buf=buf: buf.get(k, serial.get(k, 0)), buf.__setitem__
        )
        assert (s_aborted, s_seen) == (aborted, seen), f"txn {idx} diverged from serial order"
        if not s_aborted:
            serial.update(buf)
    assert serial == state


def test_sequencer_bounds_reruns_lowest_tids_first() -> None:
    seq = Sequencer(0)
    for tid in (50, 10, 30):
        seq.requeue(tid, f"t{tid}")
    assert [t for t, _ in seq.batch(9, [], max_retries=2)] == [10, 30]
    assert seq.pending_retries == 1
    assert [t for t, _ in seq.batch(10, [])] == [50]


def test_execution_is_finished_only_when_every_call_sent_was_served() -> None:
    from sfaas.runtime.txn.epochs import execution_finished

    # worker 0 sent 2 calls to worker 1; worker 1 has served only one so far
    assert not execution_finished(2, {0: ([0, 2], [0, 0]), 1: ([0, 0], [1, 0])})
    assert execution_finished(2, {0: ([0, 2], [0, 0]), 1: ([0, 0], [2, 0])})
    # a worker that has not reported yet (roots still running) blocks the barrier
    assert not execution_finished(2, {0: ([0, 0], [0, 0])})
    # nested: 1 served 0's call and called 2, whose serve is not reported yet
    three = {0: ([0, 1, 0], [0, 0, 0]), 1: ([0, 0, 1], [1, 0, 0]), 2: ([0, 0, 0], [0, 0, 0])}
    assert not execution_finished(3, three)
    three[2] = ([0, 0, 0], [0, 1, 0])
    assert execution_finished(3, three)


def test_blocked_reruns_wait_for_their_blocker_but_the_lowest_always_runs() -> None:
    from sfaas.runtime.txn.epochs import find_blockers

    k = ("o", "hot")
    assert find_blockers({}, {1: [k], 2: [k], 3: [k]}) == {2: 1, 3: 2}
    assert find_blockers({5: [k]}, {1: [k], 3: [k]}) == {3: 1, 5: 3}
    seq = Sequencer(0)
    seq.requeue(20, "b", blocker=10)
    seq.requeue(30, "c", blocker=20)
    # 30 waits for 20, which is pending; 20's blocker 10 is gone: it runs
    assert seq.take_retries(blocked=seq.pending_tids()) == [(20, "b")]
    assert seq.take_retries(blocked={20}) == []
    assert seq.take_retries(blocked=set()) == [(30, "c")]


@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=6),
                          st.lists(st.tuples(st.integers(0, 20), st.sampled_from("AB"), st.text(max_size=3)),
                                   max_size=4)), max_size=4))
def test_merge_votes_keeps_each_tids_highest_blocker_and_first_abort(votes) -> None:
    from sfaas.runtime.txn.loop import merge_votes

    conflicts, aborts = merge_votes(votes)
    pairs = [p for cs, _ in votes for p in cs]
    assert conflicts == {t: max(b for t2, b in pairs if t2 == t) for t, _ in pairs}
    firsts: dict[int, tuple[str, str]] = {}
    for _, us in votes:
        for t, e, r in us:
            firsts.setdefault(t, (e, r))
    assert aborts == firsts
