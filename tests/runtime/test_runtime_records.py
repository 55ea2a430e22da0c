"""The runtime finds its own records in a store (timers, post-commit actions) and answers
a scan read without walking every key: at 10M keys a whole-store scan held a recovering
worker's event loop for 2.5 s, past its heartbeat timeout, and the recovery never ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import statestores
from sfaas.runtime.txn.internal import action_key, timer_key
from sfaas.runtime.txn.reads import scan_partition
from sfaas.runtime.txn.timers import TimerIndex
from sfaas.runtime.values import ValueCodec


class NoFullScans:
    """A store whose ``items`` fails: what the runtime reads must come by prefix."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.prefixes: list[bytes] = []

    def items(self) -> Any:
        raise AssertionError("the runtime scanned every key of a store")

    def prefixed(self, prefix: bytes) -> Any:
        self.prefixes.append(prefix)
        return self._store.prefixed(prefix)


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_timers_are_found_by_prefix_among_many_user_keys(engine: str, tmp_path: Path) -> None:
    timers = [timer_key(f"k{i}", 1000.0 + i, 7, i) for i in range(3)]
    with statestores.open(engine, tmp_path) as s:
        s.write_batch([(b"k%06d" % i, b"v") for i in range(5000)]
                      + [(t.encode(), b"") for t in timers]
                      + [(action_key("k1", 9, 0).encode(), b"a")])
        s.flush()
        index = TimerIndex()
        wrapped = NoFullScans(s)
        index.load({("op", 0): wrapped})
        assert len(index) == 3
        assert index.next_due() == 1000.0
        assert index.take_due(1001.5, 10) == [("op", timers[0]), ("op", timers[1])]


@pytest.mark.parametrize("engine", ["lsm", "memonly"])
def test_a_scan_read_returns_its_prefix_in_key_order_up_to_the_limit(engine: str, tmp_path: Path) -> None:
    from sfaas.runtime.codec import pack

    with statestores.open(engine, tmp_path) as s:
        s.write_batch([(b"user:%04d" % i, pack(i)) for i in range(500)]
                      + [(b"other:%d" % i, pack(-i)) for i in range(500)]
                      + [(timer_key("user:1", 5.0, 1, 0).encode(), b"")])
        wrapped = NoFullScans(s)
        got = scan_partition(wrapped, "user:00", 5, ValueCodec("op"), 0.0)
        assert got == [[f"user:{i:04d}", i] for i in range(5)]
        assert wrapped.prefixes == [b"user:00"]
        assert scan_partition(wrapped, "", 3, ValueCodec("op"), 0.0) == [["other:0", 0], ["other:1", -1],
                                                                    ["other:10", -10]]
