"""Recovery under load, against the real Kafka and MinIO and a supervised ``sfaas up`` cluster.

A seeded fault schedule SIGKILLs workers (and, in the long run, the coordinator) at random
times while clients send transfers with overdraft aborts and counter bumps that return the
pre-increment value, skewed (half of them on one hot account and one hot counter). Afterwards: every request got exactly one reply, the egress topic
holds each request id once, money is conserved and never negative, each counter's
returned pre-values are exactly 0..n-1 and its final value is n (every committed increment
applied once, replies agreeing with the state).

Every fault must be seen to take effect (``tests.cluster.faults``: the killed pid gone,
the stopped service's port closed) or the run fails naming it; the report gives per kind
how many fired and took effect.

``SFAAS_CHAOS_SEED`` reproduces a schedule (the seed is printed on failure, and in the
session's summary of seeds whatever the outcome);
``SFAAS_CHAOS_SECONDS`` / ``SFAAS_CHAOS_KILLS`` / ``SFAAS_CHAOS_COORDINATOR_KILLS`` size it.
``SFAAS_CHAOS_LONG=1`` is the long run: 60 s, 5 worker kills, 1 coordinator kill, MinIO
stopped for 10 s and the Kafka broker restarted once (both must have been started by
sfaas, e.g. by this test session, since they are stopped and started again).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from sfaas.runtime import wire
from sfaas.runtime.protocols.rounds import RoundManifest
from sfaas.runtime.settings import Settings
from tests.cluster.faults import FaultLog, port_closed, process_halted
from tests.conftest import TEST_BUCKET
from tests.namespaces import fresh_namespace
from tests.runtime.test_rounds import (
    _ingress_requests,
    _read_topic,
    _replay,
    epoch_records,
    logged_request,
)

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
LONG = os.environ.get("SFAAS_CHAOS_LONG") == "1"
SECONDS = float(os.environ.get("SFAAS_CHAOS_SECONDS") or (60 if LONG else 14))
KILLS = int(os.environ.get("SFAAS_CHAOS_KILLS") or (5 if LONG else 3))
COORDINATOR_KILLS = int(os.environ.get("SFAAS_CHAOS_COORDINATOR_KILLS") or 1)
#: (fault, seconds it lasts) beyond process kills, in the long run
OUTAGES = [("minio", 10.0), ("kafka", 0.0)] if LONG else []
ACCOUNTS = [f"acct-{i}" for i in range(10)]
COUNTERS = [f"ctr-{i}" for i in range(5)]
#: keys of ``clock``: their state and replies depend on ``ctx.now()`` (a re-run keeps its first run's)
CLOCKS = [f"clock-{i}" for i in range(4)]
START = 1000
PARTITIONS = 4


async def _outage(service: str, seconds: float, faults: FaultLog, confirm_timeout: float = 5.0) -> str:
    """Stop ``service`` (as sfaas started it) for ``seconds``, then start it again; its
    port is seen closed meanwhile, or the run fails (``faults``)."""
    from launcher import services
    from launcher.procs import _KAFKA, _MINIO, ServiceSettings

    kw = {"kafka": service == "kafka", "minio": service == "minio"}
    t = time.monotonic()
    await asyncio.to_thread(services.down, **kw, progress=False)
    stopped = time.monotonic()
    port = (_KAFKA if service == "kafka" else _MINIO).port(ServiceSettings.from_env())
    await faults.confirm(service, f"{service} stopped", port_closed("127.0.0.1", port),
                         timeout=confirm_timeout)
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - stopped)))
    await asyncio.to_thread(services.up, **kw, progress=False)
    return f"{service} down for {time.monotonic() - t:.1f} s"


def chaos_settings(kafka: Any, minio: Any, tmp_path: Path, **extra: Any) -> Settings:
    """A fresh namespace's settings for a cluster test: lsm stores, rounds every second."""
    return Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(), "home": str(tmp_path),
        "store": "lsm", "partitions": PARTITIONS, "snapshot_interval": 1.0, "snapshot_retain": 2,
        "minio": minio.minio_endpoint, "minio_access_key": minio.minio_access_key,
        "minio_secret_key": minio.minio_secret_key, "bucket": TEST_BUCKET, **extra,
    })


def log_tails(s: Settings, coordinator_chars: int = 6000, worker_chars: int = 6000) -> str:
    """The end of every process log of the local cluster (without aiokafka's lines)."""
    return "\n".join(f"--- {f.name}\n" + "\n".join(
        line for line in f.read_text().splitlines() if " aiokafka" not in line
    )[-(coordinator_chars if "coord" in f.name else worker_chars):] for f in sorted(cluster.state_dir(s).glob("*.log")))


def _kill(s: Settings, role: str, rnd: random.Random) -> int | None:
    """SIGKILL a live ``role`` process; None when there is none right now (e.g. the workers
    are restarting after a coordinator kill): the caller retries a moment later."""
    procs = [p for p in cluster.ps(s) if p.role == role and p.alive]
    if not procs:
        return None
    victim = rnd.choice(procs)
    os.kill(victim.pid, signal.SIGKILL)
    return victim.pid


#: A fault of a schedule: seconds into the load, and what (a role to kill, a service's outage, ...).
Fault = tuple[float, str]
#: Injects a fault: what it did (e.g. a pid), or None when it cannot yet (tried again soon);
#: a fault that lasts (an outage) is a task of the list it is given, awaited after the load.
#: It confirms the fault's effect in the :class:`FaultLog` (the kind: the first word of the
#: fault), which fails the run if a fault did not take effect.
Fire = Callable[[str, list["asyncio.Task[str]"], FaultLog], Any]


async def _scenario(s: Settings, cs: Settings, rnd: random.Random, report: dict[str, object], replay_dir: Path,
                    maps: Callable[[], list[tuple[int, list[int]]]] = list, *,
                    faults: list[Fault] | None = None, fire: Fire | None = None,
                    seconds: float | None = None, workers: int = 2,
                    replies_at: list[float] | None = None,
                    done: Callable[[], bool] | None = None) -> None:
    """The load, the fault schedule and the invariants; ``maps()`` gives the partition maps
    the epochs ran under after rescales (see ``test_rounds._replay``). ``faults`` and
    ``fire``: another schedule and how to inject it (by default: kills of the local
    cluster's processes and outages of its services); ``workers``: the cluster's size;
    ``replies_at``: filled with every reply's arrival, in seconds into the load (the
    schedule's clock; ``report["began"]`` is the load's start on the logs' wall clock);
    ``done``: the load stops early once it says so (``seconds`` bounds it still)."""

    async def fire_local(role: str, outages: list[asyncio.Task[str]], log: FaultLog) -> object | None:
        if role in dict(OUTAGES):
            outages.append(asyncio.create_task(_outage(role, dict(OUTAGES)[role], log)))
            return 0
        pid = _kill(s, role, rnd)  # (or what a test put in its place: it halts a process)
        if pid is not None:
            await log.confirm(role, f"{role} pid {pid} halted", process_halted(pid), timeout=5.0)
        return pid

    fire = fire or fire_local
    seconds = SECONDS if seconds is None else seconds  # (read now: tests patch SECONDS)
    async with Client("ledger", settings=cs, timeout=120) as c:
        await asyncio.gather(*(c.call("accounts", a, "deposit", START) for a in ACCOUNTS))
        futs: list[tuple[str, str, asyncio.Future[wire.Reply]]] = []
        arrivals: list[float] = []
        if faults is None:
            faults = sorted([(rnd.uniform(1.5, seconds - 2), "worker") for _ in range(KILLS)]
                            + [(rnd.uniform(1.5, seconds - 2), "coordinator") for _ in range(COORDINATOR_KILLS)]
                            + [(rnd.uniform(1.5, seconds - 15), name) for name, _ in OUTAGES])
        faults = sorted(faults)
        scheduled = {what.split()[0] for _, what in faults}
        log = FaultLog()
        outages: list[asyncio.Task[str]] = []
        report["schedule"] = [(round(t, 2), role) for t, role in faults]
        t0 = time.monotonic()
        report["began"] = time.time()
        killed = []
        while (now := time.monotonic() - t0) < seconds and not (done and done()):
            while faults and faults[0][0] <= now:
                _, role = faults.pop(0)
                if (what := await fire(role, outages, log)) is not None:
                    killed.append((round(now, 2), role, what))
                else:  # nobody to kill yet: try again in half a second
                    faults.append((now + 0.5, role))
                    faults.sort()
                    break
            for _ in range(3):
                # skewed: half the transfers leave one hot account, half the bumps hit one counter
                a = ACCOUNTS[0] if rnd.random() < 0.5 else rnd.choice(ACCOUNTS)
                b = rnd.choice([x for x in ACCOUNTS if x != a])
                f = await c.submit("accounts", a, "transfer", b, rnd.randint(1, 400))
                futs.append(("t", "", f))
                k = COUNTERS[0] if rnd.random() < 0.5 else rnd.choice(COUNTERS)
                f = await c.submit("counters", k, "bump")
                futs.append(("b", k, f))
            a, b = rnd.sample(CLOCKS, 2)  # two crossing clocks: one conflicts (see ledger.clock)
            futs.append(("c", a, await c.submit("counters", a, "clock", b)))
            futs.append(("c", b, await c.submit("counters", b, "clock", a)))
            for _, _, f in futs[-8:]:
                f.add_done_callback(lambda _f: arrivals.append(time.monotonic()))
            await asyncio.sleep(0.02)
        report["killed"] = killed
        report["outages"] = await asyncio.gather(*outages)
        report["unfired"] = [what for _, what in faults]
        # every fault took effect (the process gone or paused, the service down, the link
        # cut): a run whose faults did not happen proves nothing
        report["faults"] = log.summary()
        log.check(scheduled)
        _, pending = await asyncio.wait([f for _, _, f in futs], timeout=180)
        if replies_at is not None:  # (before any check: a failed run's gaps tell too)
            replies_at.extend(sorted(a - t0 for a in arrivals))
        if pending:
            stuck = [(kind, key) for kind, key, f in futs if f in pending]
            waiting = {rid: fut for rid, fut in c._waiting.items() if fut in pending}
            report["unanswered"] = {"n": len(pending), "first": stuck[:5], "rids": sorted(waiting)[:10]}
            raise AssertionError(f"{len(pending)} of {len(futs)} requests unanswered 180 s after the load: "
                                 f"{report['unanswered']}")
        replies = [f.result() for _, _, f in futs]
        assert not c._waiting, f"{len(c._waiting)} requests never answered"
        arrivals.sort()
        gaps = sorted(((b - a, a - t0) for a, b in zip(arrivals, arrivals[1:], strict=False)),
                      reverse=True)
        report["longest_gap_s"] = round(gaps[0][0], 2) if gaps else 0.0
        # the three longest, each with when it began (s into the load: the schedule's time)
        report["gaps"] = [(round(g, 2), round(at, 1)) for g, at in gaps[:3]]
        bumps: dict[str, list[int]] = {k: [] for k in COUNTERS}
        for (kind, key, _), reply in zip(futs, replies, strict=True):
            if kind == "b":
                assert reply.ok, reply
                bumps[key].append(reply.value)
            elif kind == "c":
                assert reply.ok, reply
            elif not reply.ok:
                assert "insufficient funds" in (reply.reason or ""), reply
        for k, vals in bumps.items():  # each increment once, and the replies agree with it
            assert sorted(vals) == list(range(len(vals))), (k, sorted(vals))
        balances = await asyncio.gather(*(c.call("accounts", a, "balance") for a in ACCOUNTS))
        assert sum(balances) == START * len(ACCOUNTS) and min(balances) >= 0, balances
        finals = await asyncio.gather(*(c.call("counters", k, "value") for k in COUNTERS + CLOCKS))
        finals_of = dict(zip(COUNTERS + CLOCKS, finals, strict=True))
        assert {k: finals_of[k] for k in COUNTERS} == {k: len(v) for k, v in bumps.items()}
        sent = {r.rid for r in replies}
        got = {r.rid: r for r in replies}
    # the committed history is serializable and is the one the clients saw: re-executing the
    # whole epoch log from the empty state, in the protocol's serial order (tids within an
    # epoch, then the fallback phase), gives every request exactly its reply, and the same state
    raw_log = await _read_topic(cs, cs.epoch_log_topic("ledger"), 1)
    records = epoch_records(raw_log[0])
    epochs = [rec.epoch for _, rec in records]
    assert epochs == sorted(epochs), "the epoch log is out of epoch order"
    assert len({(rec.epoch, rec.worker) for _, rec in records}) == len(records), "an epoch logged twice by a worker"
    empty = RoundManifest(0, 0, workers, PARTITIONS, (), {p: 0 for p in range(PARTITIONS)}, {}, {}, (), 0)
    requests = await _ingress_requests(cs)
    fates, accounts, counters = await _replay(empty, records, requests, replay_dir, maps())
    by_pos = {(p, o): req for p, reqs in requests.items() for o, req in reqs}
    kept = {logged_request(rec, tid, p, o, by_pos).function
            for _, rec in records for tid, p, o in rec.batch if tid in dict(rec.kept_now)}
    assert "clock" in kept, f"no clock re-ran in a later epoch ({kept}): the clocks' check would check nothing"
    for rid, reply in got.items():
        assert rid in fates, f"request {rid} answered but never in a logged epoch"
        ok, value = fates[rid]
        assert (ok, value if ok else list(value)) == (reply.ok, reply.value if ok else [reply.error_type, reply.reason]), \
            (rid, fates[rid], reply)
    assert sum(accounts.values()) == START * len(ACCOUNTS)
    assert {k: v for k, v in counters.items() if k in COUNTERS} == {k: len(v) for k, v in bumps.items() if v}
    # the clocks: each committed transaction's now, as it ran (re-runs keep their first run's)
    assert {k: counters.get(k, 0) for k in CLOCKS} == {k: finals_of[k] for k in CLOCKS}
    raw = await _read_topic(cs, cs.topics("ledger")[1], PARTITIONS, committed=True)
    counts = Counter(wire.Reply.decode(v).rid for recs in raw.values() for _, v in recs)
    dups = {rid: n for rid, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} request ids answered more than once in the egress topic, e.g. {list(dups)[:3]}"
    # a direct call (sfaas.direct) is answered on its channel, not in the egress topic: its
    # run is in the log (and the replay above checked that no request id committed twice)
    direct = {wire.Request.decode(raw_req).rid for _, rec in records for _, raw_req in rec.direct}
    assert sent <= set(counts) | direct
    print(f"{len(sent)} requests answered: {len(sent & direct)} direct, {len(sent - direct)} through Kafka")


def _no_secret_in_logs(s: Settings, minio_secret: str) -> None:
    """Every log line of the run (the supervisor's, the coordinator's, each worker's, the
    stores' background processes' — they share their worker's log), and ``sfaas ps``,
    hold neither the cluster secret nor the MinIO secret key."""
    import contextlib
    import io

    from launcher import main

    sd = cluster.state_dir(s)
    secrets = [(sd / "secret").read_text().strip(), minio_secret]
    assert all(len(x) >= 8 for x in secrets)
    lines = [line for f in sorted(sd.glob("*.log")) for line in f.read_text(errors="replace").splitlines()]
    assert len(lines) > 100, "the run must have logged something to check"
    leaks = [line[:120] for line in lines if any(x in line for x in secrets)]
    out = io.StringIO()
    old = os.environ.get("SFAAS_HOME")
    os.environ["SFAAS_HOME"] = s.home
    try:
        with contextlib.redirect_stdout(out):
            assert main(["ps", "--json", "--namespace", s.namespace]) == 0
    finally:
        if old is None:
            del os.environ["SFAAS_HOME"]
        else:
            os.environ["SFAAS_HOME"] = old
    assert '"role": "coordinator"' in out.getvalue()
    assert not leaks and not any(x in out.getvalue() for x in secrets), leaks[:3]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("lease", [0, 8], ids=["coordinator-driven", "leased"])
def test_kills_under_load_lose_nothing_and_duplicate_nothing(kafka, minio, tmp_path: Path, lease: int) -> None:
    """``lease``: epochs driven by the coordinator (the default), or leased to the workers
    (``worker.protocols.lease``), whose runs a recovery or a restarted coordinator must end cleanly."""
    rnd = random.Random(SEED)
    s = chaos_settings(kafka, minio, tmp_path, epoch_lease=lease)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    report: dict[str, object] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]
        asyncio.run(_scenario(s, cs, rnd, report, tmp_path / "replay"))
        procs = cluster.ps(s)
        # a killed coordinator takes its workers along (they exit and are restarted)
        kills = [k for k in report["killed"] if k[1] in ("worker", "coordinator")]  # type: ignore[union-attr]
        assert kills and sum(p.restarts for p in procs) >= len(kills), (procs, kills)
        assert all(p.alive and not p.gave_up for p in procs), procs
        report["restarts"] = {f"{p.role}-{p.index}": p.restarts for p in procs}
        _no_secret_in_logs(s, minio.minio_secret_key)
        log = (cluster.state_dir(s) / "coordinator.log").read_text()
        report["recoveries"] = [line.split("WARNING sfaas.coordinator.recovery: ")[1][:160]
                                for line in log.splitlines() if "sfaas.coordinator.recovery: recovery" in line]
        assert ("leased run from epoch" in log) == (lease > 0), "the cluster did not run the epochs asked for"
        print(f"chaos report: {report}")
    except BaseException:
        print(f"chaos seed {SEED} failed (rerun: SFAAS_CHAOS_SEED={SEED}); report {report}\n{log_tails(s, 15000, 4000)}")
        raise
    finally:
        cluster.down(s)


def test_workers_wait_for_a_restarted_coordinator_and_keep_their_state(kafka, minio, tmp_path: Path) -> None:
    """A coordinator SIGKILLed (here before and after any work) comes back under the
    supervisor; the workers are not restarted: they rejoin in their slots, and the state
    written before the crash is still there afterwards."""
    s = Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(), "home": str(tmp_path),
        "store": "lsm", "partitions": PARTITIONS, "snapshot_interval": 1.0,
        "minio": minio.minio_endpoint, "minio_access_key": minio.minio_access_key,
        "minio_secret_key": minio.minio_secret_key, "bucket": TEST_BUCKET,
    })
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        killed: list[int] = []

        def kill_coordinator() -> None:
            # the one alive now, and never one already killed: a SIGKILLed process is not a
            # zombie at once (a loaded host takes a while to tear it down), and a read is
            # answered by the workers without the coordinator — a kill right after one once
            # hit the dying process again and the restarts counted 2 of 3 kills. (On a
            # loaded host the supervisor's watchdog may also have just killed a stalled one,
            # restarting it at once; the official CI saw none alive.)
            deadline = time.monotonic() + 30
            while not (alive := [p for p in cluster.ps(s) if p.role == "coordinator"
                                 and p.alive and p.pid not in killed]):
                assert time.monotonic() < deadline, (cluster.ps(s), killed, log_tails(s))
                time.sleep(0.1)
            pid = alive[0].pid
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            halted = process_halted(pid)
            while not halted():  # (the fault took effect)
                assert time.monotonic() < deadline, f"coordinator {pid} still runs after SIGKILL"
                time.sleep(0.02)

        async def bumps(n: int) -> list[int]:
            async with Client("ledger", settings=cs, timeout=60) as c:
                return [await c.call("counters", "c", "bump") for _ in range(n)]

        kill_coordinator()  # nothing has run yet
        # a read (answered by a worker outside any epoch, often before the new coordinator
        # runs) while the workers begin empty epochs, which log no batch (no epoch-log
        # record), then a kill: the restarted coordinator must still begin above the
        # workers' epoch (it once began at 1 again and the workers ignored it: it hung)
        from launcher.readiness import round_trip
        asyncio.run(round_trip(s.kafka, "ledger", s.namespace, 60))
        kill_coordinator()
        assert asyncio.run(bumps(3)) == [0, 1, 2]
        kill_coordinator()  # now with state and an epoch log
        assert asyncio.run(bumps(2)) == [3, 4]
        procs = cluster.ps(s)
        # the workers were never restarted; the coordinator by the three kills, and once
        # more for each stall the supervisor's watchdog killed it for (a loaded host)
        stalls = json.loads((cluster.state_dir(s) / "cluster.json").read_text())[
            "processes"][0].get("stalls", 0)
        assert [(p.role, p.restarts) for p in procs] == [
            ("coordinator", 3 + stalls), ("worker", 0), ("worker", 0)], (procs, stalls)
    finally:
        cluster.down(s)
