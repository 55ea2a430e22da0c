"""Stress: ``close()``, ``restore()`` and ``snapshot_async()`` racing with background work.

Every engine runs with the ``TINY`` options (a flush, roll or merge every few operations)
and the calls that must wait for, or stop, background merges and flushes are made right
after a burst of writes, so that work is still in flight when they run. Before each such
call ``stats()`` tells whether it was (``merges_running``, ``flushes_pending``); the tests
assert that this happened often enough, so they fail if they stop exercising the race.

Only the public API (and ``stats()`` keys) is used: the tests must outlive rewrites of the
engines' background machinery.

A hang fails fast: a watchdog (``faulthandler.dump_traceback_later(exit=True)``) prints
every thread's stack and ends the process after ``SFAAS_STRESS_WATCHDOG`` seconds
(default: 60 s, or more for many rounds), with the seed printed just before.

Environment:

* ``SFAAS_STRESS_ROUNDS`` — rounds per test (default 6; the file takes ~15 s on 2 cores).
* ``SFAAS_STRESS_SEED`` — the seed (default: a random one; every failure prints it).
* ``SFAAS_STRESS_WATCHDOG`` — seconds before the watchdog fires.

``scripts/stress_loop.sh`` runs this file many times with fresh seeds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import faulthandler
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import remotes
import statestores
from tests.hang import terminal_fd

from .engines import TINY

ROUNDS = int(os.environ.get("SFAAS_STRESS_ROUNDS") or 6)
SEED = int(os.environ.get("SFAAS_STRESS_SEED") or random.SystemRandom().randrange(1 << 32))
#: snapshots in flight at most in the threads test (each an upload through the background
#: process): the writer's pace, not the host's load, sets how many it takes
MAX_SNAPSHOT_BACKLOG = 8
WATCHDOG_S = float(os.environ.get("SFAAS_STRESS_WATCHDOG") or max(60.0, 10.0 * ROUNDS))
#: pytest-timeout's limit: a backstop behind the watchdog.
TIMEOUT_S = int(WATCHDOG_S) + 60

#: Engines that do work in the background (and report it in ``stats()``).
BACKGROUND = ("lsm", "appendlog", "hybridlog")

#: A small key space: values are overwritten often, so merges have something to drop.
KEYS = [b"key-%03d" % i for i in range(48)]
#: Value sizes, ``0`` (``b""``, a value) included.
SIZES = (0, 0, 1, 7, 30, 100, 300, 1200)

Ops = list[tuple[bytes, bytes | None]]

#: Waits on a future of the store: bounded, so that a lost future fails instead of hanging.
FUTURE_WAIT_S = 30.0


# ---------------------------------------------------------------------- seed and watchdog


@dataclass
class Stress:
    """One test's seed, random source and progress (named in every failure)."""

    name: str
    seed: int
    rng: random.Random
    step: str = "start"
    recent: list[str] = field(default_factory=list)

    def at(self, step: str) -> None:
        self.step = step
        self.recent = (self.recent + [step])[-12:]

    def where(self) -> str:
        return (
            f"stress seed {self.seed} (rerun: SFAAS_STRESS_SEED={self.seed} "
            f"SFAAS_STRESS_ROUNDS={ROUNDS} pytest '{self.name}'); at: {self.step}"
        )


@pytest.fixture
def stress(request: pytest.FixtureRequest) -> Iterator[Stress]:
    """The test's seeded random source, under a watchdog that dumps every thread's stack
    and exits if the test hangs."""
    name = request.node.nodeid
    st = Stress(name, SEED, random.Random(f"{SEED}/{request.node.name}"))
    print(f"stress seed {SEED}, rounds {ROUNDS}, watchdog {WATCHDOG_S:.0f} s")
    fd = terminal_fd(request.config)

    def last_words() -> None:  # a Python thread still runs when the store threads deadlock
        msg = (
            f"\n*** stress watchdog: {name} still running after {WATCHDOG_S - 1:.0f} s "
            f"(seed {SEED}, rounds {ROUNDS}); last steps: {st.recent}\n"
            "*** every thread's stack follows, then the process exits\n"
        )
        os.write(fd, msg.encode())

    timer = threading.Timer(WATCHDOG_S - 1, last_words)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=fd)
    try:
        yield st
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.cancel()


@contextlib.contextmanager
def noted(st: Stress) -> Iterator[None]:
    """Add the seed and the step to any exception raised inside (assertions included)."""
    try:
        yield
    except BaseException as exc:
        exc.add_note(st.where())
        exc.add_note("last steps: " + " | ".join(st.recent))
        raise


# ---------------------------------------------------------------------- workload


class Writer:
    """Random puts, deletes and batches, mirrored in ``model``; every value is unique
    (but ``b""``) and remembered in ``seen`` before it is written."""

    def __init__(self, rng: random.Random, model: dict[bytes, bytes], tag: bytes) -> None:
        self.rng = rng
        self.model = model
        self.tag = tag
        self.n = 0
        self.seen: dict[bytes, set[bytes]] = {k: set() for k in KEYS}
        self.log: list[Ops] = []  # every op applied, in order (a put is a batch of one)

    def value(self) -> bytes:
        size = self.rng.choice(SIZES)
        if size == 0:
            return b""
        self.n += 1
        head = b"%s:%d:" % (self.tag, self.n)
        return (head + b"x" * size)[: max(size, len(head))]

    def one(self, s: statestores.Store) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.6:
            k, v = rng.choice(KEYS), self.value()
            self.seen[k].add(v)
            s.put(k, v)
            ops: Ops = [(k, v)]
        elif r < 0.75:
            k = rng.choice(KEYS)
            s.delete(k)
            ops = [(k, None)]
        else:
            ops = []
            for _ in range(rng.randint(1, 8)):  # the same key may occur twice: order counts
                k = rng.choice(KEYS)
                bv: bytes | None = None if rng.random() < 0.25 else self.value()
                if bv is not None:
                    self.seen[k].add(bv)
                ops.append((k, bv))
            s.write_batch(ops)
        apply(self.model, ops)
        self.log.append(ops)

    def burst(self, s: statestores.Store, n: int) -> None:
        for _ in range(n):
            self.one(s)


def apply(model: dict[bytes, bytes], ops: Ops) -> None:
    for k, v in ops:
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


@dataclass
class InFlight:
    """How often background work was in flight when a racing call was made."""

    calls: dict[str, int] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    merges_done: int = 0

    def check(self, s: statestores.Store, call: str) -> None:
        st = s.stats()
        self.merges_done = max(self.merges_done, int(st.get("merges_done", 0)))
        busy = bool(st.get("merges_running", 0) or st.get("flushes_pending", 0))
        self.calls[call] = self.calls.get(call, 0) + 1
        self.busy[call] = self.busy.get(call, 0) + busy

    def summary(self) -> str:
        return ", ".join(f"{c} {self.busy.get(c, 0)}/{n}" for c, n in sorted(self.calls.items())) + (
            f"; merges_done max {self.merges_done}"
        )


def contents(s: statestores.Store) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for k, v in s.items():
        assert k not in out, f"items() yielded {k!r} twice"
        out[k] = v
    return out


def diff(got: dict[bytes, bytes], want: dict[bytes, bytes]) -> str:
    keys = sorted(set(got) | set(want))
    bad = [(k, got.get(k), want.get(k)) for k in keys if got.get(k) != want.get(k)]
    lines = [f"  {k!r}: store {g!r:.50} model {w!r:.50}" for k, g, w in bad[:8]]
    return f"{len(bad)} keys differ (of {len(keys)}):\n" + "\n".join(lines)


def assert_equal(got: dict[bytes, bytes], want: dict[bytes, bytes], what: str) -> None:
    assert got == want, f"{what}: {diff(got, want)}"


# ---------------------------------------------------------------------- the tests


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_close_restore_and_snapshots_race_background_work(
    engine: str, tmp_path: Path, stress: Stress
) -> None:
    """Rounds of open → writes with snapshot_async / restore right after bursts → close,
    always on the same directory and remote; the model says what every state must be."""
    opts = TINY[engine]
    remote = remotes.PathRemote(tmp_path / "remote")
    directory = tmp_path / "db"
    rng = stress.rng
    model: dict[bytes, bytes] = {}
    w = Writer(rng, model, b"w")
    snaps: dict[int, dict[bytes, bytes]] = {}  # snapshot id -> the model at its freeze
    futures: list[tuple[int, concurrent.futures.Future[statestores.SnapshotInfo]]] = []
    seen = InFlight()
    next_id = 1
    t0 = time.monotonic()

    with noted(stress):
        for rnd in range(ROUNDS):
            stress.at(f"round {rnd}: open")
            s = statestores.open(engine, directory, remote=remote, **opts)
            assert_equal(contents(s), model, f"round {rnd}: reopen after close")
            listed = s.snapshots()
            assert set(snaps) <= set(listed), f"round {rnd}: snapshots() {listed} lacks {sorted(set(snaps) - set(listed))}"

            for ev in range(rng.randint(3, 7)):
                n = rng.randint(5, 60)
                stress.at(f"round {rnd} event {ev}: {n} writes")
                w.burst(s, n)
                if snaps and rng.random() < 0.3:
                    sid = rng.choice(sorted(snaps))
                    stress.at(f"round {rnd} event {ev}: restore({sid}) after {n} writes")
                    seen.check(s, "restore")
                    rinfo = s.restore(sid)
                    assert rinfo.snapshot_id == sid
                    model.clear()
                    model.update(snaps[sid])
                    assert_equal(contents(s), model, f"round {rnd}: after restore({sid})")
                else:
                    stress.at(f"round {rnd} event {ev}: snapshot_async({next_id}) after {n} writes")
                    seen.check(s, "snapshot_async")
                    futures.append((next_id, s.snapshot_async(next_id)))
                    snaps[next_id] = dict(model)
                    next_id += 1

            if snaps and rng.random() < 0.4:
                # a restore restarts merges of the restored state; close right after it
                sid = rng.choice(sorted(snaps))
                stress.at(f"round {rnd}: restore({sid}) before close")
                seen.check(s, "restore")
                s.restore(sid)
                model.clear()
                model.update(snaps[sid])
                assert_equal(contents(s), model, f"round {rnd}: after restore({sid})")
                n = rng.randint(0, 8)
            else:
                n = rng.randint(20, 150)
            stress.at(f"round {rnd}: close after {n} writes")
            w.burst(s, n)
            seen.check(s, "close")
            s.close()
            stress.at(f"round {rnd}: closed")
            for sid, fut in futures:
                sinfo = fut.result(timeout=FUTURE_WAIT_S)  # raises what the upload raised
                assert sinfo.snapshot_id == sid
            futures.clear()

        stress.at("final reopen")
        with statestores.open(engine, directory, remote=remote, **opts) as s:
            assert_equal(contents(s), model, "final reopen")
            assert set(snaps) <= set(s.snapshots())
            sid = rng.choice(sorted(snaps))
            stress.at(f"final restore({sid})")
            s.restore(sid)
            assert_equal(contents(s), snaps[sid], f"final restore({sid})")

    print(f"{engine}: {ROUNDS} rounds, {next_id - 1} snapshots, {w.n} values in "
          f"{time.monotonic() - t0:.1f} s; in flight: {seen.summary()}")
    if engine in BACKGROUND:
        msg = f"background work in flight: {seen.summary()}; {stress.where()}"
        assert seen.merges_done > 0, msg
        for call in ("snapshot_async", "restore", "close"):
            assert seen.busy.get(call, 0) >= min_busy(seen.calls.get(call, 0)), msg


def min_busy(calls: int) -> int:
    """Racing calls that must have found background work in flight: at least one, and at
    least a fifth of them (observed: about half or more; see the report of the change)."""
    return max(1, calls // 5)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_snapshots_while_threads_read_and_write(engine: str, tmp_path: Path, stress: Stress) -> None:
    """A writer thread and a reader thread on one store while the main thread takes
    snapshots; then the threads stop and the store closes with merges in flight.

    Reads never return a value the key never had; every snapshot checked is the state
    after some prefix of the writer's ops (taken while snapshot_async ran); reopening gives
    the writer's final state."""
    opts = TINY[engine]
    remote = remotes.PathRemote(tmp_path / "remote")
    directory = tmp_path / "db"
    rng = stress.rng
    model: dict[bytes, bytes] = {}
    w = Writer(random.Random(rng.random()), model, b"t")
    n_writes = 250 * ROUNDS
    stop = threading.Event()
    errors: list[str] = []
    bad_reads: list[str] = []
    reads = [0]
    seen = InFlight()

    s = statestores.open(engine, directory, remote=remote, **opts)

    def writer() -> None:
        try:
            for _ in range(n_writes):
                if stop.is_set():
                    return
                w.one(s)
        except BaseException as exc:
            errors.append(f"writer: {exc!r}")
        finally:
            stop.set()

    def reader() -> None:
        rrng = random.Random(rng.random())
        try:
            while not stop.is_set():
                if rrng.random() < 0.02:
                    got = list(s.items())
                else:
                    k = rrng.choice(KEYS)
                    v = s.get(k)
                    got = [] if v is None else [(k, v)]
                reads[0] += 1
                for k, v in got:
                    if v not in w.seen.get(k, ()):
                        bad_reads.append(f"{k!r} -> {v!r:.60}")
        except BaseException as exc:
            errors.append(f"reader: {exc!r}")

    threads = [threading.Thread(target=writer, name="stress-writer"), threading.Thread(target=reader, name="stress-reader")]
    taken: list[tuple[int, int, int, concurrent.futures.Future[statestores.SnapshotInfo]]] = []
    with noted(stress):
        for t in threads:
            t.start()
        sid = 0
        while not stop.is_set():
            time.sleep(rng.uniform(0, 0.01))
            sid += 1
            stress.at(f"snapshot_async({sid}) after {len(w.log)} writer ops")
            seen.check(s, "snapshot_async")
            lo = len(w.log)
            fut = s.snapshot_async(sid)
            taken.append((sid, lo, len(w.log), fut))
            # (a bounded backlog: on a loaded host the writer slows, this loop does not, and
            # 355 snapshots queued behind their uploads kept close() past the watchdog)
            backlog = [f for *_, f in taken if not f.done()]
            if len(backlog) > MAX_SNAPSHOT_BACKLOG:
                stress.at(f"waiting for snapshot backlog of {len(backlog)}")
                backlog[0].result(timeout=FUTURE_WAIT_S)
        stress.at("joining the threads")
        for t in threads:
            t.join(FUTURE_WAIT_S)
            assert not t.is_alive(), f"thread {t.name} did not stop"
        assert not errors, errors
        assert not bad_reads, f"{len(bad_reads)} reads returned values never written: {bad_reads[:5]}"
        stress.at(f"close after {len(w.log)} writer ops")
        seen.check(s, "close")
        s.close()
        for sid, _lo, _hi, fut in taken:
            assert fut.result(timeout=FUTURE_WAIT_S).snapshot_id == sid

        stress.at("reopen")
        with statestores.open(engine, directory, remote=remote, **opts) as s:
            assert_equal(contents(s), model, "reopen after the threads' writes")
            assert {t[0] for t in taken} <= set(s.snapshots())

        # Each snapshot is the state after the writer's first j ops for a j the
        # snapshot_async call saw: lo <= j <= hi + 1 (op #hi may have been in progress).
        check = rng.sample(taken, min(4, len(taken)))
        with statestores.open(engine, tmp_path / "verify", remote=remote, **opts) as v:
            for sid, lo, hi, _fut in sorted(check):
                stress.at(f"verify snapshot {sid} (writer ops {lo}..{hi + 1})")
                v.restore(sid)
                got = contents(v)
                state: dict[bytes, bytes] = {}
                for ops in w.log[:lo]:
                    apply(state, ops)
                matches = state == got
                for ops in w.log[lo : hi + 1]:
                    if matches:
                        break
                    apply(state, ops)
                    matches = state == got
                assert matches, f"snapshot {sid} is no state the writer had between ops {lo} and {hi + 1}"

    print(f"{engine}: {len(w.log)} writer ops, {reads[0]} reads, {len(taken)} snapshots; "
          f"in flight: {seen.summary()}")
    if engine in BACKGROUND:
        msg = f"background work in flight: {seen.summary()}; {stress.where()}"
        assert seen.merges_done > 0, msg
        assert seen.busy.get("snapshot_async", 0) >= min_busy(seen.calls["snapshot_async"]), msg
