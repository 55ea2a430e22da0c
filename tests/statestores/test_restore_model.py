"""Snapshots and restores against a model, three ways, for every engine and both
durability modes with tiny thresholds: the store restored in place to *any* earlier
snapshot (not only the newest), a store restored from the remote into an empty
directory, and a follower promoted at a snapshot (the replication path). Histories mix
empty values and deletes in every region (mutable, read-only, being flushed, on disk),
reopen between snapshots, and snapshots while regions are being written.

Two drivers share one model: a Hypothesis state machine, whose failures shrink to a
minimal history, and seeded random histories (longer, cheaper per step; the seed is in
every failure). Loop the latter from the command line::

    python -m tests.statestores.test_restore_model --engine hybridlog --runs 200
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import remotes
import statestores
from statestores.replica import LocalSource, Shipper

#: Thresholds that make every region turn over every few operations, per engine.
TINY: dict[str, dict[str, Any]] = {
    "lsm": {"memtable_bytes": 256, "max_runs_per_level": 2, "density_factor": 2},
    "appendlog": {"threshold": 256, "max_runs_per_level": 2, "max_snapshot_wals": 2},
    "hybridlog": {"ro_lag_interval": 2, "flush_interval": 4, "max_runs_per_level": 2, "max_wal_bytes": 512,
                  "max_snapshot_wals": 4},
    "memonly": {},
}
#: The thresholds of the held-out test that found the hybridlog restore bug (larger regions:
#: a tail then holds part of a region that later flushes).
SMALL: dict[str, dict[str, Any]] = {
    "lsm": {"memtable_bytes": 512, "max_runs_per_level": 3},
    "appendlog": {"threshold": 512, "max_runs_per_level": 3},
    "hybridlog": {"ro_lag_interval": 32, "flush_interval": 32, "max_runs_per_level": 3},
    "memonly": {},
}
SYNCS = ("none", "os")
CONFIGS = [(e, s) for e in statestores.ENGINES for s in SYNCS]


def options(engine: str, sync: str, sizes: dict[str, dict[str, Any]] = TINY) -> dict[str, Any]:
    return {**sizes[engine], "sync": sync}


#: Expiry times and horizons (ms) share a small range, so values expire during a history.
EXPIRY_RANGE = 40


def expiring(t: int, tail: bytes = b"") -> bytes:
    """A value in ``statestores.expiry``'s format that expires at ``t``."""
    return b"\xc1\x01" + struct.pack(">Q", t) + tail


def acceptable(want: bytes | None, got: bytes | None, horizon: int | None) -> bool:
    """``got`` is a correct read of a key whose newest value is ``want``: exactly it, or —
    when it is expired at ``horizon`` (merges may have dropped it) — it or nothing, never
    an older value."""
    if want is None:
        return got is None
    if horizon is not None and len(want) >= 10 and want[:2] == b"\xc1\x01":
        if struct.unpack(">Q", want[2:10])[0] <= horizon:
            return got in (want, None)
    return got == want


class _Errors(logging.Handler):
    """Collects the stores' ERROR records: a background task or a version subscriber
    (the shipper) that failed is logged, not raised, and must fail the model too."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage().splitlines()[0][:300] + (f" ({record.exc_info[1]!r})" if record.exc_info else ""))


class Harness:
    """A primary store in a scratch directory, its remote, a follower fed by a shipper,
    and the model: the dict the store must equal, and the dict each snapshot saw."""

    def __init__(self, engine: str, opts: dict[str, Any]) -> None:
        self.errors = _Errors()
        logging.getLogger("statestores").addHandler(self.errors)
        self.engine = engine
        self.opts = opts
        self.tmp = Path(tempfile.mkdtemp(prefix="sfaas-restore-model-"))
        self.remote = remotes.PathRemote(self.tmp / "remote")
        self.store: Any = statestores.open(engine, self.tmp / "db", remote=self.remote, **opts)
        self.model: dict[bytes, bytes] = {}
        self.snaps: dict[int, dict[bytes, bytes]] = {}
        self.next_id = 1
        self.horizon: int | None = None  # the highest expiry horizon any store object was given
        self.n = 0  # scratch directories handed out
        self.shipper: Shipper | None = None
        self.follower: Any = None
        self._follow()

    def _scratch(self, what: str) -> Path:
        self.n += 1
        return self.tmp / f"{what}{self.n}"

    def _follow(self) -> None:
        self.shipper = Shipper(self.store)
        self.follower = statestores.follow(self.engine, self._scratch("replica"), LocalSource(self.shipper), **self.opts)
        self.followed_from = self.next_id  # a follower learns of the snapshots taken from now on

    def _unfollow(self) -> None:
        if self.follower is not None:
            self.follower.close()
            shutil.rmtree(self.follower.directory, ignore_errors=True)
            self.follower = None
        if self.shipper is not None:
            self.shipper.close()
            self.shipper = None

    def close(self) -> None:
        try:
            self._unfollow()
            self.store.close()
        finally:
            logging.getLogger("statestores").removeHandler(self.errors)
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ writes

    def put(self, key: bytes, value: bytes) -> None:
        self.store.put(key, value)
        self.model[key] = value

    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        self.model.pop(key, None)

    def batch(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        self.store.write_batch(ops)
        for k, v in ops:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    def flush(self) -> None:
        self.store.flush()

    def set_horizon(self, t: int) -> None:
        self.store.set_expiry_horizon(t)
        self.horizon = t if self.horizon is None else max(self.horizon, t)

    def compact(self) -> None:
        """One merge cycle (expired values dropped from the files a snapshot ships)."""
        self.store.compact()

    def stall(self, seconds: float = 0.05) -> None:
        """Keep the store's maintainer thread busy for ``seconds``: the flushes and merges
        handed off meanwhile stay in flight across the next steps (microseconds each), so
        snapshots and restores meet regions still being written, whatever the machine's
        speed."""
        self.store.tasks.maintainer.post(time.sleep, seconds)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> None:
        sid = self.next_id
        self.next_id += 1
        assert self.store.snapshot(sid).snapshot_id == sid
        self.snaps[sid] = dict(self.model)

    def snapshot_then_write(self, key: bytes, value: bytes | None) -> None:
        """Freeze, write while the upload runs: the snapshot holds the state at the freeze."""
        sid = self.next_id
        self.next_id += 1
        fut = self.store.snapshot_async(sid)
        self.snaps[sid] = dict(self.model)
        if value is None:
            self.delete(key)
        else:
            self.put(key, value)
        assert fut.result(timeout=60).snapshot_id == sid

    def restore(self, sid: int) -> None:
        self.store.restore(sid)
        self.model = dict(self.snaps[sid])
        self.check(f"after restore({sid}) in place")

    def reopen(self) -> None:
        self._unfollow()
        self.store.close()
        self.store = statestores.open(self.engine, self.tmp / "db", remote=self.remote, **self.opts)
        self._follow()
        self.check("after reopen")

    def restore_elsewhere(self, sid: int) -> None:
        """A new store in an empty directory, restored from the remote."""
        where = self._scratch("elsewhere")
        with statestores.open(self.engine, where, remote=self.remote, **self.opts) as other:
            other.restore(sid)
            got = dict(other.items())
        shutil.rmtree(where, ignore_errors=True)
        assert self._matches(got, self.snaps[sid]), self._diff(f"restore({sid}) into an empty directory", got, self.snaps[sid])

    def promote(self, pick: int) -> None:
        """Let the follower catch up, promote it at one of the snapshots it retains, compare,
        then follow again from a new directory."""
        if self.next_id == self.followed_from:
            self.snapshot()  # none since this follower started
        self.store.settle()
        self.follower.wait(seq=self.store.version()[0], snapshot_id=max(self.snaps), timeout=20)
        retained = [s for s in self.follower.snapshots() if s in self.snaps and s >= self.followed_from]
        assert retained, f"the follower retains none of {sorted(self.snaps)}: {self.follower.snapshots()}"
        sid = retained[pick % len(retained)]
        promoted = self.follower.promote(sid)
        try:
            got = dict(promoted.items())
        finally:
            promoted.close()
            shutil.rmtree(promoted.directory, ignore_errors=True)
        assert self._matches(got, self.snaps[sid]), self._diff(f"a follower promoted at snapshot {sid}", got, self.snaps[sid])
        # follow again, from a new directory, through the same shipper: it serves a second
        # follower after the first one was promoted (its staged links — one per file
        # generation, a restore can write a file of a reused name — must all still be there)
        self.follower = statestores.follow(self.engine, self._scratch("replica"),
                                           LocalSource(self.shipper), **self.opts)
        self.followed_from = self.next_id

    # ------------------------------------------------------------------ checks

    def get(self, key: bytes) -> None:
        want, got = self.model.get(key), self.store.get(key)
        assert acceptable(want, got, self.horizon), (key, got, want, self.horizon)
        present = key in self.store  # a background merge may drop an expired value meanwhile
        assert acceptable(want, want if present else None, self.horizon), (key, present, want)

    def check(self, when: str = "") -> None:
        assert not self.errors.seen, f"{when or 'the live store'}: errors logged: {self.errors.seen}"
        items = list(self.store.items())
        got = dict(items)
        assert len(got) == len(items), f"{when or 'the live store'}: a key listed twice"
        assert self._matches(got, self.model), self._diff(when or "the live store", got, self.model)

    def _matches(self, got: dict[bytes, bytes], want: dict[bytes, bytes]) -> bool:
        return all(acceptable(want.get(k), got.get(k), self.horizon) for k in got.keys() | want.keys())

    def _diff(self, when: str, got: dict[bytes, bytes], want: dict[bytes, bytes]) -> str:
        wrong = sorted(k for k in got.keys() | want.keys() if not acceptable(want.get(k), got.get(k), self.horizon))
        return (f"{when}: {len(wrong)} wrong values {[(k, got.get(k), want.get(k)) for k in wrong[:3]]}, "
                f"missing {sorted(want.keys() - got.keys())[:5]}, extra {sorted(got.keys() - want.keys())[:5]}")


# ---------------------------------------------------------------------- hypothesis

KEYS = st.sampled_from([b"k%02d" % i for i in range(12)])
VALUES = st.one_of(
    st.just(b""), st.just(b""), st.binary(max_size=10), st.binary(min_size=100, max_size=300),
    st.builds(expiring, st.integers(0, EXPIRY_RANGE), st.binary(max_size=20)),
)
OPS = st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), min_size=1, max_size=6)


def make_machine(engine: str, opts: dict[str, Any]) -> type[RuleBasedStateMachine]:
    class RestoreModel(RuleBasedStateMachine):
        h: Harness

        @initialize()
        def open_store(self) -> None:
            self.h = Harness(engine, opts)

        def teardown(self) -> None:
            if hasattr(self, "h"):
                self.h.close()

        @rule(key=KEYS, value=VALUES)
        def put(self, key: bytes, value: bytes) -> None:
            self.h.put(key, value)

        @rule(key=KEYS)
        def delete(self, key: bytes) -> None:
            self.h.delete(key)

        @rule(ops=OPS)
        def batch(self, ops: list[tuple[bytes, bytes | None]]) -> None:
            self.h.batch(ops)

        @rule(key=KEYS)
        def get(self, key: bytes) -> None:
            self.h.get(key)

        @rule()
        def flush(self) -> None:
            self.h.flush()

        @rule()
        def stall(self) -> None:
            self.h.stall()

        @rule(t=st.integers(0, EXPIRY_RANGE))
        def set_horizon(self, t: int) -> None:
            self.h.set_horizon(t)

        @rule()
        def compact(self) -> None:
            self.h.compact()

        @rule()
        def snapshot(self) -> None:
            self.h.snapshot()

        @rule(key=KEYS, value=st.one_of(st.none(), VALUES))
        def snapshot_then_write(self, key: bytes, value: bytes | None) -> None:
            self.h.snapshot_then_write(key, value)

        @rule()
        def reopen(self) -> None:
            self.h.reopen()

        @precondition(lambda self: bool(self.h.snaps))
        @rule(data=st.data())
        def restore(self, data: st.DataObject) -> None:
            self.h.restore(data.draw(st.sampled_from(sorted(self.h.snaps)), label="restore to"))

        @precondition(lambda self: bool(self.h.snaps))
        @rule(data=st.data())
        def restore_elsewhere(self, data: st.DataObject) -> None:
            self.h.restore_elsewhere(data.draw(st.sampled_from(sorted(self.h.snaps)), label="restore elsewhere"))

        @precondition(lambda self: bool(self.h.snaps))
        @rule(pick=st.integers(0, 1))
        def promote(self, pick: int) -> None:
            self.h.promote(pick)

        @invariant()
        def same_contents(self) -> None:
            if hasattr(self, "h"):
                self.h.check()

    RestoreModel.__name__ = f"RestoreModel_{engine}_{opts['sync']}"
    return RestoreModel


@pytest.mark.parametrize("engine,sync", CONFIGS, ids=[f"{e}-{s}" for e, s in CONFIGS])
def test_restores_match_the_model(engine: str, sync: str) -> None:
    machine = make_machine(engine, options(engine, sync))
    machine.TestCase.settings = settings(
        max_examples=int(os.environ.get("SFAAS_MODEL_EXAMPLES", "15")),
        stateful_step_count=50,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    machine.TestCase().runTest()


# ---------------------------------------------------------------------- seeded histories


def run_history(engine: str, opts: dict[str, Any], seed: int, steps: int = 1500) -> None:
    """One random history of ``steps`` operations over 150 keys, values of 0-40 bytes
    (empty ones included, ~20% expiring); ~5% snapshots, ~2.5% restores in place to any
    earlier snapshot, ~1% restores elsewhere, ~0.5% promotions, ~2% reopens, ~1% expiry
    horizon moves, ~0.3% merge cycles."""
    rng = random.Random(seed)
    keys = [b"key%03d" % i for i in range(150)]
    clock = 0  # the expiry horizon walks up through the histories' expiry times

    def value() -> bytes:
        r = rng.random()
        if r < 0.2:
            return expiring(max(0, clock + rng.randint(-10, 60)), rng.randbytes(rng.randint(0, 20)))
        return b"" if r < 0.35 else rng.randbytes(rng.randint(1, 40))

    h = Harness(engine, opts)
    step = 0
    try:
        for step in range(steps):  # noqa: B007 - named in the failure
            r = rng.random()
            if r < 0.45:
                h.put(rng.choice(keys), value())
            elif r < 0.60:
                h.delete(rng.choice(keys))
            elif r < 0.78:
                h.batch([(rng.choice(keys), None if rng.random() < 0.3 else value()) for _ in range(rng.randint(1, 8))])
            elif r < 0.79:
                h.flush()
            elif r < 0.80:
                h.stall()
            elif r < 0.83:
                h.snapshot()
            elif r < 0.85:
                h.snapshot_then_write(rng.choice(keys), None if rng.random() < 0.3 else value())
            elif r < 0.875 and h.snaps:
                h.restore(rng.choice(sorted(h.snaps)))
            elif r < 0.885 and h.snaps:
                h.restore_elsewhere(rng.choice(sorted(h.snaps)))
            elif r < 0.89 and h.snaps:
                h.promote(rng.randrange(2))
            elif r < 0.91:
                h.reopen()
            elif r < 0.92:
                clock += rng.randint(0, 20)
                h.set_horizon(clock)
            elif r < 0.923:
                h.compact()
            else:
                h.get(rng.choice(keys))
        h.check("at the end")
    except Exception as e:
        raise AssertionError(f"{engine} {opts} seed {seed} step {step}: {e!r}") from e
    finally:
        h.close()


SEEDED = [(e, s, sizes) for e, s in CONFIGS for sizes in ("tiny", "small")]


@pytest.mark.parametrize("engine,sync,sizes", SEEDED, ids=[f"{e}-{s}-{z}" for e, s, z in SEEDED])
def test_seeded_histories_match_the_model(engine: str, sync: str, sizes: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    run_history(engine, options(engine, sync, TINY if sizes == "tiny" else SMALL), seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Loop the seeded restore model with random seeds.")
    p.add_argument("--engine", choices=statestores.ENGINES, action="append", help="default: every engine")
    p.add_argument("--runs", type=int, default=200, help="histories per engine (default 200)")
    p.add_argument("--steps", type=int, default=1500)
    a = p.parse_args(argv)
    failed = 0
    for engine in a.engine or statestores.ENGINES:
        t0 = time.monotonic()
        bad = 0
        for i in range(a.runs):
            seed = random.randrange(1 << 30)
            sync = SYNCS[i % 2]
            sizes = TINY if (i // 2) % 2 == 0 else SMALL
            try:
                run_history(engine, options(engine, sync, sizes), seed, a.steps)
            except Exception as e:  # any failure counts (a follower that never catches up too)
                bad += 1
                print(f"FAIL {engine} sync={sync} {'tiny' if sizes is TINY else 'small'} seed {seed}: {e!r}"[:2000], flush=True)
        print(f"{engine}: {a.runs - bad} of {a.runs} histories passed ({time.monotonic() - t0:.0f} s)", flush=True)
        failed += bad
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
