"""Metamorphic, model-based test: one random history against every engine and several
parameter sets, compared step by step with a dict (Pebble's metamorphic test, driven by
Hypothesis' stateful testing).

Values include expiring ones (``statestores.expiry``: ``0xC1``, flags, a big-endian u64
expiry time) and look-alikes that never expire; the history moves the store's expiry
horizon and runs whole merge cycles. For a key whose newest value is expired at the
horizon the model accepts that value or absence — never an older value of the key;
everything else exactly.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import remotes
import statestores
from statestores import snapshots
from statestores.testing import FaultyFS

from .engines import CONFIGS, config_id

KEYS = st.sampled_from([b"k%02d" % i for i in range(24)] + [b"\x00", b"\xff" * 3, b"long" * 40])
PLAIN = st.one_of(st.just(b""), st.binary(max_size=12), st.binary(min_size=200, max_size=600))
#: Expiry times and horizons share a small range, so values expire during a history.
TIMES = st.integers(0, 40)


def _expiring(t: int, flags: int, tail: bytes) -> bytes:
    return bytes((0xC1, flags)) + struct.pack(">Q", t) + tail


EXPIRING = st.builds(
    _expiring, TIMES, st.sampled_from([0x01, 0x03]), st.one_of(st.just(b""), st.binary(max_size=300))
)
#: 0xC1-prefixed values that never expire: flag bit 0 unset, or too short for the time.
LOOKALIKES = st.one_of(
    st.builds(_expiring, TIMES, st.sampled_from([0x00, 0x02]), st.binary(max_size=8)),
    st.builds(lambda n: b"\xc1\x01" + b"\x00" * n, st.integers(0, 7)),
    st.just(b"\xc1"),
)
VALUES = st.one_of(PLAIN, EXPIRING, LOOKALIKES)


def expires_at(value: bytes) -> int | None:
    """The model's own reading of the format (independent of statestores.expiry)."""
    if len(value) >= 10 and value[0] == 0xC1 and value[1] & 1:
        t: int = struct.unpack(">Q", value[2:10])[0]
        return t
    return None


def acceptable(want: bytes | None, got: bytes | None, horizon: int | None) -> bool:
    """``got`` is a correct read of a key whose newest value is ``want``."""
    if want is None:
        return got is None
    t = expires_at(want)
    if horizon is not None and t is not None and t <= horizon:
        return got in (want, None)
    return got == want
OPS = st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), max_size=8)


def make_machine(engine: str, options: dict[str, Any]) -> type[RuleBasedStateMachine]:
    class StoreVsDict(RuleBasedStateMachine):
        @initialize()
        def open_store(self) -> None:
            self.tmp = Path(tempfile.mkdtemp(prefix="sfaas-model-"))
            self.remote = remotes.PathRemote(self.tmp / "remote")
            self.fs = FaultyFS()
            self.store = statestores.open(engine, self.tmp / "db", remote=self.remote, fs=self.fs, **options)
            self.model: dict[bytes, bytes] = {}
            self.snaps: dict[int, dict[bytes, bytes]] = {}
            self.next_id = 1
            self.horizon: int | None = None  # the highest horizon any store object was given

        def teardown(self) -> None:
            try:
                self.store.close()
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)

        @rule(key=KEYS, value=VALUES)
        def put(self, key: bytes, value: bytes) -> None:
            self.store.put(key, value)
            self.model[key] = value

        @rule(key=KEYS)
        def delete(self, key: bytes) -> None:
            self.store.delete(key)
            self.model.pop(key, None)

        @rule(ops=OPS)
        def batch(self, ops: list[tuple[bytes, bytes | None]]) -> None:
            self.store.write_batch(ops)
            for k, v in ops:
                if v is None:
                    self.model.pop(k, None)
                else:
                    self.model[k] = v

        @rule(key=KEYS)
        def get(self, key: bytes) -> None:
            want = self.model.get(key)
            got = self.store.get(key)
            assert acceptable(want, got, self.horizon), (key, want, got, self.horizon)
            # a background merge may drop an expired value between the two reads
            present = key in self.store
            assert acceptable(want, want if present else None, self.horizon), (key, want, present)

        @rule(t=TIMES)
        def set_horizon(self, t: int) -> None:
            self.store.set_expiry_horizon(t)
            self.horizon = t if self.horizon is None else max(self.horizon, t)
            assert self.store.expiry_horizon is not None
            assert self.store.expiry_horizon >= t  # never backwards

        @rule()
        def compact(self) -> None:
            self.store.compact()
            h = self.store.expiry_horizon
            if h is not None:  # one merge cycle leaves no value that was expired before it
                for k, v in self.store.items():
                    t = expires_at(v)
                    assert t is None or t > h, (k, v, h)

        @rule()
        def flush(self) -> None:
            self.store.flush()

        def _reopen(self, fs: statestores.FileSystem) -> None:
            self.fs = fs  # type: ignore[assignment]
            self.store = statestores.open(engine, self.tmp / "db", remote=self.remote, fs=fs, **options)

        @rule()
        def reopen(self) -> None:
            self.store.close()
            self._reopen(FaultyFS())

        @rule()
        def crash_and_reopen(self) -> None:
            # kill -9: nothing more reaches the disk, no close() runs; sync="os" loses nothing.
            self.fs.crash()
            snapshots.wait_uploads(self.store)
            self._reopen(FaultyFS())

        @rule()
        def snapshot(self) -> None:
            sid = self.next_id
            self.next_id += 1
            info = self.store.snapshot(sid)
            assert info.snapshot_id == sid
            self.snaps[sid] = dict(self.model)

        @rule()
        def snapshot_async_then_write(self) -> None:
            sid = self.next_id
            self.next_id += 1
            fut = self.store.snapshot_async(sid)
            self.snaps[sid] = dict(self.model)
            self.store.put(b"k00", b"during-upload")
            self.model[b"k00"] = b"during-upload"
            assert fut.result(timeout=60).snapshot_id == sid

        @precondition(lambda self: bool(self.snaps))
        @rule(data=st.data())
        def restore(self, data: st.DataObject) -> None:
            sid = data.draw(st.sampled_from(sorted(self.snaps)))
            self.store.restore(sid)
            self.model = dict(self.snaps[sid])
            # snapshot ids continue above every id in the remote (older and newer restores)

        @rule(prefix=st.sampled_from([b"", b"k", b"k0", b"k1", b"k2", b"k23", b"\x00", b"\xff",
                                      b"long", b"kz"]))
        def prefixed(self, prefix: bytes) -> None:
            """``prefixed`` is ``items`` filtered by the prefix, in key order."""
            got = list(self.store.prefixed(prefix))
            keys = [k for k, _ in got]
            assert keys == sorted(set(keys)), (prefix, keys)
            assert all(k.startswith(prefix) for k in keys), (prefix, keys)
            assert dict(got) == {k: v for k, v in self.store.items() if k.startswith(prefix)}
            for k in self.model.keys() | set(keys):
                if k.startswith(prefix):
                    assert acceptable(self.model.get(k), dict(got).get(k), self.horizon), (
                        prefix, k, self.model.get(k), dict(got).get(k))

        @invariant()
        def same_contents(self) -> None:
            if not hasattr(self, "store"):
                return
            items = list(self.store.items())
            got = dict(items)
            assert len(items) == len(got)  # every key once
            for k in got.keys() | self.model.keys():
                assert acceptable(self.model.get(k), got.get(k), self.horizon), (
                    k, self.model.get(k), got.get(k), self.horizon,
                )
            if engine == "lsm":
                assert [k for k, _ in items] == sorted(got)

    StoreVsDict.__name__ = f"StoreVsDict_{engine}"
    return StoreVsDict


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_engine_matches_a_dict(cfg: tuple[str, dict[str, Any]]) -> None:
    engine, options = cfg
    machine = make_machine(engine, options)
    machine.TestCase.settings = settings(
        max_examples=12,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    machine.TestCase().runTest()
