"""Hint files: round trip, bulk decoding, and corruption detection."""

from __future__ import annotations

import array

import pytest

from statestores import CorruptionError, hints


def sample() -> bytes:
    keys = [bytes(range(256)), b"a", b"bb" * 40]
    addrs = [hints.address(7, off) for off in (0, 100, 5000)]
    return hints.encode(7, 9000, keys, addrs, [b"gone", b"x"])  # keys and tombstones sorted


def test_round_trip_keeps_keys_addresses_and_tombstones() -> None:
    h = hints.decode(sample(), "h", seq=7)
    assert h.seq == 7 and h.data_size == 9000
    assert h.keys == [bytes(range(256)), b"a", b"bb" * 40]
    assert list(h.addresses) == [(7 << hints.OFFSET_BITS) | off for off in (0, 100, 5000)]
    assert h.tombstones == [b"gone", b"x"]
    assert dict(zip(h.keys, h.addresses, strict=True))[bytes(range(256))] & hints.OFFSET_MASK == 0


def test_empty_hint_round_trips() -> None:
    h = hints.decode(hints.encode(3, 0, [], array.array("Q"), []), "h")
    assert (h.keys, list(h.addresses), h.tombstones) == ([], [], [])


def test_every_flipped_byte_is_detected_and_names_the_file() -> None:
    data = sample()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x40
        with pytest.raises(CorruptionError, match="seg-1.hint"):
            hints.decode(bytes(bad), "seg-1.hint", seq=7)


def test_truncated_hint_is_corruption() -> None:
    data = sample()
    for n in (0, 10, 47, len(data) - 1):
        with pytest.raises(CorruptionError):
            hints.decode(data[:n], "h")


def test_hint_of_another_segment_is_rejected() -> None:
    with pytest.raises(CorruptionError, match="segment 7, expected 8"):
        hints.decode(sample(), "h", seq=8)


def test_mismatched_lengths_are_a_value_error() -> None:
    with pytest.raises(ValueError, match="2 keys but 1 addresses"):
        hints.encode(1, 0, [b"a", b"b"], [0], [])


def test_many_keys_span_several_arrays_and_round_trip() -> None:
    keys = sorted(b"key-%07d" % i for i in range(20_000))
    tombs = sorted(b"gone-%07d" % i for i in range(9_000))
    addrs = array.array("Q", (hints.address(3, 40 * i) for i in range(len(keys))))
    data = hints.encode(3, 40 * len(keys), keys, addrs, tombs)
    h = hints.decode(data, "big.hint", seq=3)
    assert h.keys == keys and h.tombstones == tombs and h.addresses == addrs
