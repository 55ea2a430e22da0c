"""The epoch log's fences (``sfaas.runtime.epochlog``, "Fences"): which records a recovery
replays when records land after their writer gave up on them.

Found by the simulator (issue 51): an epoch's record whose delivery a recovery's halt
cancelled landed after that recovery read the log (seeds 438, 577), and a fresh worker
read the log through a stale leader's short end (seeds 89, 503); either way the recovery
took the record's requests again as new ones in a later epoch, and the next recovery ran
them twice."""

from __future__ import annotations

import pytest

from sfaas.runtime.epochlog import (
    AnyRecord,
    CutRecord,
    EpochLogError,
    EpochRecord,
    FenceRecord,
    decode_record,
    live,
)


def _rec(epoch: int, worker: int, fence: int, generation: int = 0) -> EpochRecord:
    return EpochRecord(epoch, worker, 1.0, ((epoch, worker, epoch),), generation=generation,
                       fence=fence)


def _kept(records: list[tuple[int, AnyRecord]], start: int = 0) -> list[int]:
    return [o for o, _ in live(records, start)]


def test_a_record_landing_after_its_writers_fence_is_void_and_no_other() -> None:
    log: list[tuple[int, AnyRecord]] = [
        (10, _rec(3, 0, -1)),          # before the fence: counts
        (11, FenceRecord(0, 7, 1)),    # worker 0's recovery 1 begins here
        (12, _rec(3, 0, -1)),          # sent before the fence, landed after: void
        (13, _rec(3, 1, -1)),          # another worker's: its own fence comes later
        (14, FenceRecord(1, 8, 1)),
        (15, _rec(4, 0, 11)),          # sent after worker 0's fence: counts
        (16, _rec(2, 1, -1)),          # worker 1's late record: void
        (17, CutRecord(1, 4, 0, (), ())),
    ]
    assert _kept(log) == [10, 13, 15, 17]
    assert all(isinstance(r, (EpochRecord, CutRecord)) for _, r in live(log, 0))


def test_a_fence_before_the_read_still_voids_what_a_later_record_names() -> None:
    """A read from a round's position after the fence does not see it; worker 0's later
    record names it, so a record that landed late after the round is still void — and a
    worker whose fence nothing names keeps its records."""
    log: list[tuple[int, AnyRecord]] = [
        (40, _rec(9, 0, -1)),  # sent before worker 0's fence at offset 11
        (41, _rec(9, 1, 5)),   # worker 1's, naming its fence at 5: no later fence
        (42, _rec(12, 0, 11)),
    ]
    assert _kept(log, start=40) == [41, 42]
    assert _kept(log[:2], start=40) == [40, 41]  # (nothing names the fence: kept)


def test_a_late_fence_of_a_slots_lost_process_voids_none_of_its_successors_records() -> None:
    """A worker cut from the brokers lost its slot with its recovery's fence still in its
    producer; the fence landed after its successor's records. Counted like the
    successor's own, it voided every record the successor sent until its next fence —
    epochs whose replies had left (a direct request answered and in no counted epoch)
    and whose requests the next recovery took again (committed twice)."""
    old, new = 5, 9  # the lost process's generation and its successor's
    log: list[tuple[int, AnyRecord]] = [
        (20, FenceRecord(0, new, 1)),   # the successor's recovery
        (21, _rec(7, 0, 20, new)),      # its records name its fence
        (22, FenceRecord(0, old, 3)),   # the lost process's fence, landing late
        (23, _rec(8, 0, 20, new)),      # counts still
        (24, _rec(6, 0, -1, old)),      # the lost process's late record: void
        (25, FenceRecord(0, new, 2)),   # the successor's next recovery
        (26, _rec(9, 0, 20, new)),      # sent before it, landed after: void
        (27, _rec(9, 0, 25, new)),
    ]
    assert _kept(log) == [21, 23, 27]
    # read from a later round's position: the fences are known by what records name
    assert _kept(log[3:5], start=23) == [23]  # (the successor's record names fence 20)
    late = [(30, _rec(6, 0, 22, old)), (31, _rec(10, 0, 20, new))]
    assert _kept(late, start=30) == [30, 31]  # (nothing of ``new``'s is after fence 22)


def test_fence_records_round_trip_and_bad_ones_name_their_source() -> None:
    f = FenceRecord(2, 1_700_000_000_000, 5)
    assert decode_record(f.encode(), "x@1") == f
    with pytest.raises(EpochLogError, match=r"log@9: malformed body .*three ints >= 0"):
        decode_record(f.encode()[:5] + b"\x93\x01\xff\x02", "log@9")
    with pytest.raises(EpochLogError, match="log@3: header"):
        FenceRecord.decode(b"SFEF\x09" + f.encode()[5:], "log@3")
    bad = EpochRecord(3, 0, 1.0, ((1, 0, 0),), fence=-2).encode()
    with pytest.raises(EpochLogError, match="the fence must be an offset or -1"):
        decode_record(bad, "log@4")


def test_the_cluster_tests_model_counts_a_second_copy_once_and_no_void_record() -> None:
    """The model the cluster tests check the epoch log with (``test_rounds.epoch_records``):
    the nemesis saw a record's second copy — a retired producer delivering it late — land
    60 epochs after the first; the recovery keys records by epoch, so the model counts the
    first copy only, and a void record not at all. A different record of the same epoch
    and worker stays (the tests' "logged twice" check catches it)."""
    from tests.runtime.test_rounds import epoch_records

    a, b = _rec(5, 0, -1), _rec(6, 1, -1)
    other = EpochRecord(5, 0, 2.0, ((9, 0, 9),))
    raw = [(0, a.encode()), (1, b.encode()), (2, FenceRecord(1, 3, 1).encode()),
           (3, a.encode()), (4, _rec(4, 1, -1).encode()), (5, other.encode())]
    assert [off for off, _ in epoch_records(raw)] == [0, 1, 5]
