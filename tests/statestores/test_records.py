"""The log-record codec: round trips, batches all-or-nothing, torn tails vs corruption."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statestores import records
from statestores.errors import CorruptionError

keys = st.binary(min_size=1, max_size=40)
values = st.one_of(st.none(), st.binary(max_size=200))


def scan_all(buf: bytes) -> tuple[list[tuple[bytes, bytes | None]], records.ScanResult]:
    res = records.ScanResult(0, False)
    out = [(k, v) for _o, k, v in records.scan(buf, "test.log", res)]
    return out, res


@given(st.lists(st.tuples(keys, values), max_size=20))
def test_records_round_trip(ops: list[tuple[bytes, bytes | None]]) -> None:
    buf = b"".join(records.encode(k, v) for k, v in ops)
    out, res = scan_all(buf)
    assert out == ops
    assert res.valid_end == len(buf) and not res.torn


@given(st.lists(st.tuples(keys, values), min_size=1, max_size=10), st.data())
def test_a_batch_cut_anywhere_is_dropped_whole(ops: list[tuple[bytes, bytes | None]], data: st.DataObject) -> None:
    head = records.encode(b"before", b"1")
    batch = records.encode_batch(ops)
    cut = data.draw(st.integers(0, len(batch) - 1))
    out, res = scan_all(head + batch[:cut])
    assert out == [(b"before", b"1")]
    assert res.valid_end == len(head)
    # the complete batch applies fully
    out, _ = scan_all(head + batch)
    assert out == [(b"before", b"1"), *ops]


def test_corruption_in_the_middle_raises_naming_the_file() -> None:
    buf = bytearray(records.encode(b"a", b"x" * 50) + records.encode(b"b", b"y" * 50))
    buf[20] ^= 0xFF
    with pytest.raises(CorruptionError, match="test.log"):
        scan_all(bytes(buf))


def test_decode_at_rejects_a_flipped_value_byte() -> None:
    buf = bytearray(records.encode(b"key", b"value"))
    buf[-1] ^= 1
    with pytest.raises(CorruptionError, match="checksum"):
        records.decode_at(bytes(buf), 0, "seg.log")


def test_empty_value_is_not_a_tombstone() -> None:
    out, _ = scan_all(records.encode(b"k", b"") + records.encode(b"d", None))
    assert out == [(b"k", b""), (b"d", None)]
