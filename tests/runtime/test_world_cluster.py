"""Functions that touch the world on a real cluster (Kafka, MinIO, ``sfaas up``): journaled
effects and post-commit actions under contention, durable timers — and all of it across
worker and coordinator SIGKILLs (a seeded schedule; ``SFAAS_CHAOS_SEED`` reproduces it)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas import NondeterminismError, TransactionAborted
from sfaas.client import Client
from sfaas.runtime.protocols.rounds import RoundManifest
from tests.runtime.apps import world
from tests.runtime.test_recovery import PARTITIONS, _kill, chaos_settings, log_tails
from tests.runtime.test_rounds import _ingress_requests, _read_topic, epoch_records, replay_log

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))


@pytest.fixture
def world_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    d = tmp_path / "world"
    d.mkdir()
    monkeypatch.setenv("SFAAS_WORLD_DIR", str(d))
    return str(d)


def _up(kafka: Any, minio: Any, tmp_path: Path, **extra: Any) -> Any:
    extra.setdefault("check_determinism", True)  # (the suite's default: tests/conftest.py)
    s = chaos_settings(kafka, minio, tmp_path, store="memonly", **extra)
    cluster.up(s, "tests.runtime.apps.world:app", 2, timeout=90)
    return s


@pytest.mark.timeout(600)
def test_hot_key_orders_charge_once_and_email_once_per_commit(
        kafka: Any, minio: Any, tmp_path: Path, world_dir: str) -> None:
    s = _up(kafka, minio, tmp_path, reply_tracebacks=True)
    n, stock = 80, 50
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> list[Any]:
            async with Client("world", settings=cs, timeout=60) as c:
                await c.call("stock", "apple", "restock", stock)
                futs = [await c.submit("orders", f"o{i}", "order", "apple", 10) for i in range(n)]
                # the determinism check refuses a function drawing from random
                with pytest.raises(NondeterminismError, match="alarms.noisy on key 'x' is not "
                                                              "deterministic"):
                    await c.call("alarms", "x", "noisy")
                # a plain exception: the reply carries its traceback (reply_tracebacks), the
                # worker logs it with the request id
                with pytest.raises(TransactionAborted, match="card number invalid") as info:
                    await c.call("alarms", "y", "broken", "4111")
                tb = info.value.traceback or ""
                assert "in broken" in tb and "in _check_card" in tb and "ValueError" in tb, tb
                return list(await asyncio.gather(*futs))
        replies = asyncio.run(go())
        logs = "".join(f.read_text() for f in cluster.state_dir(s).glob("worker-*.log"))
        assert re.search(r"alarms.broken on key 'y' raised in request \S+ \(transaction", logs)
        committed = {f"o{i}" for i, r in enumerate(replies) if r.ok}
        assert len(committed) == stock, [r for r in replies if not r.ok][:3]
        assert all("sold out" in (r.reason or "") for r in replies if not r.ok)
        charges = world.lines("charge", world_dir)
        assert len(charges) == n and len({c.split()[1] for c in charges}) == n
        deadline = asyncio.run(_until(lambda: len(world.lines("email", world_dir)) >= stock, 30))
        emails = world.lines("email", world_dir)
        assert deadline and sorted(e.split()[0] for e in emails) == sorted(committed), emails
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


@pytest.mark.timeout(300)
def test_a_replay_that_diverges_is_reported_on_the_status_page(
        kafka: Any, minio: Any, tmp_path: Path, world_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the determinism check, a function drawing from ``random``, and one taking the
    first of a set of strings (its order depends on the process's hash seed: the check
    cannot see that in one process), commit; after a worker's SIGKILL the replay — on a new
    process for the killed worker's keys — answers their requests otherwise than before:
    the coordinator's log, /metrics and status page say so, naming the functions."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # (a seed per process)
    s = _up(kafka, minio, tmp_path, check_determinism=False, snapshot_interval=120.0)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            # (through Kafka: the replay compares with the replies in the egress topic;
            # a direct call's reply is in no log to compare with)
            async with Client("world", settings=cs, timeout=60, direct_calls=False) as c:
                await asyncio.gather(*(c.call("alarms", f"n{i}", "noisy") for i in range(10)))
                # (a list of its own per key: with one list, a process answers every key
                # alike, and a new process picks the same first name 1 time in 20 — the
                # replay then diverges nowhere; with ten lists, ~5 of them on the killed
                # worker, that takes 20⁵ runs)
                await asyncio.gather(*(c.call("alarms", f"f{i}", "first_of",
                                              [f"name-{i}-{j}" for j in range(20)])
                                       for i in range(10)))
        asyncio.run(go())

        async def committed() -> int:  # (the replay compares with committed replies only:
            for _ in range(300):         # a reply transaction stays open reply_commit_ms)
                raw = await _read_topic(cs, cs.topics("world")[1], PARTITIONS, committed=True)
                if (n := sum(len(recs) for recs in raw.values())) >= 20:
                    return n
                await asyncio.sleep(0.1)
            return n
        assert asyncio.run(committed()) == 20
        assert _kill(s, "worker", random.Random(SEED)) is not None
        url = cluster.status_url(s)

        def diverged() -> int:
            try:
                raw = json.loads(urllib.request.urlopen(url + "status.json", timeout=5).read())
            except OSError:
                return 0
            return int(raw["raw"].get("replay_divergences", 0))
        assert asyncio.run(_until(lambda: diverged() > 0, 60)), log_tails(s)
        page = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "alarms.noisy" in page and "Replays that diverged" in page
        metrics = urllib.request.urlopen(url + "metrics", timeout=5).read().decode()
        assert re.search(r"^sfaas_replay_divergences_total [1-9]", metrics, re.M), metrics[-2000:]
        log = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert "replay diverged: alarms.noisy on key 'n" in log
        assert asyncio.run(_until(lambda: "replay diverged: alarms.first_of on key 'f" in (
            cluster.state_dir(s) / "coordinator.log").read_text(), 30)), log[-3000:]
    finally:
        cluster.down(s)


async def _history(cs: Any, directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    raw_log = await _read_topic(cs, cs.epoch_log_topic("world"), 1)
    records = epoch_records(raw_log[0])
    assert [r.epoch for _, r in records] == sorted(r.epoch for _, r in records)
    assert any(r.runtime for _, r in records) and any(r.journals for _, r in records), \
        "the log holds no timer or journal: the check would check nothing"
    empty = RoundManifest(0, 0, 2, PARTITIONS, (), {p: 0 for p in range(PARTITIONS)}, {}, {},
                          (), 0)
    requests = await _ingress_requests(cs, "world")
    return await replay_log(world.app, empty, records, requests, directory, store="memonly")


async def _until(cond: Any, seconds: float) -> bool:
    for _ in range(int(seconds * 10)):
        if cond():
            return True
        await asyncio.sleep(0.1)
    return bool(cond())


@pytest.mark.timeout(900)
def test_effects_actions_and_timers_survive_kills(
        kafka: Any, minio: Any, tmp_path: Path, world_dir: str) -> None:
    """Orders (an effect and an action each) and timers — a quarter of them cancelled —
    under load while two workers and the coordinator are SIGKILLed: every committed order's
    email went out, every timer fired exactly once and never early, a timer cancelled
    before it was due never; effects ran once per order except at a crash; and the whole
    epoch log re-executes to the replies the clients got."""
    rnd = random.Random(SEED)
    s = _up(kafka, minio, tmp_path)
    report: dict[str, Any] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]
        seconds, n_timers = 12.0, 300

        async def go() -> tuple[list[Any], list[Any], dict[str, dict[str, list[float]]]]:
            async with Client("world", settings=cs, timeout=120) as c:
                await c.call("stock", "apple", "restock", 10_000)
                faults = sorted([(rnd.uniform(2, seconds - 3), "worker") for _ in range(2)]
                                + [(rnd.uniform(2, seconds - 3), "coordinator")])
                report["schedule"] = [(round(t, 2), r) for t, r in faults]
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                orders, arms, disarms = [], [], []
                #: a cancelled timer's name → (earliest due time, when the cancel's reply came)
                cancelled: dict[str, list[float]] = {}
                i = 0
                while (now := loop.time() - t0) < seconds:
                    while faults and faults[0][0] <= now:
                        _, role = faults[0]
                        if _kill(s, role, rnd) is None:
                            break
                        faults.pop(0)
                    orders.append(await c.submit("orders", f"o{i}", "order", "apple", 1))
                    if i < n_timers:
                        delay = rnd.uniform(0.5, seconds) if i % 4 else rnd.uniform(3, seconds)
                        due = time.time() + delay
                        arms.append(await c.submit("alarms", f"k{i % 7}", "arm", delay, f"t{i}"))
                        if i % 4 == 0:  # cancelled right away (it is due in 3 s at least)
                            # (once armed: two calls in flight at once may run in either order
                            # when a worker fails between them, docs/guide/clients.md)
                            await arms[-1]
                            f = await c.submit("alarms", f"k{i % 7}", "disarm", f"t{i}")
                            cancelled[f"t{i}"] = [due, 0.0]
                            f.add_done_callback(
                                lambda _f, name=f"t{i}": cancelled[name].__setitem__(
                                    1, time.time()))
                            disarms.append(f)
                    i += 1
                    await asyncio.sleep(0.02)
                order_replies = list(await asyncio.wait_for(asyncio.gather(*orders), 240))
                arm_replies = list(await asyncio.wait_for(asyncio.gather(*arms), 240))
                assert all(r.ok and r.value is True
                           for r in await asyncio.wait_for(asyncio.gather(*disarms), 240))
                rung: dict[str, dict[str, list[float]]] = {}
                for _ in range(300):  # every timer armed is due by now or soon
                    rung = {f"k{k}": await c.call("alarms", f"rung:k{k}", "rung")
                            for k in range(7)}
                    if sum(len(v) for v in rung.values()) >= len(arm_replies) - len(cancelled):
                        await asyncio.sleep(2)  # (a cancelled timer firing late would show)
                        rung = {f"k{k}": await c.call("alarms", f"rung:k{k}", "rung")
                                for k in range(7)}
                        break
                    await asyncio.sleep(0.1)
                return order_replies, arm_replies, rung, cancelled
        orders, arms, rung, cancelled = asyncio.run(go())
        assert all(r.ok for r in orders + arms), [r for r in orders + arms if not r.ok][:3]
        names = {f"k{i % 7}": set() for i in range(7)}
        for i in range(len(arms)):
            names[f"k{i % 7}"].add(f"t{i}")
        late = []
        fired_anyway = 0
        for key, want in names.items():
            got = rung[key]
            for name in sorted(want & set(cancelled)):
                due, cancel_done = cancelled[name]
                if name in got:  # fired: only allowed if it was due before the cancel committed
                    assert due - 0.5 < cancel_done, (key, name, due, cancel_done)
                    fired_anyway += 1
                want.discard(name)
                got = {n: v for n, v in got.items() if n != name}
            assert set(got) == want, (key, sorted(want - set(got))[:5], sorted(set(got) - want)[:5])
            for name, (count, seconds_late) in got.items():
                assert count == 1, (key, name, count)  # exactly once
                assert seconds_late >= 0, (key, name, seconds_late)  # never early
                late.append(seconds_late)
        late.sort()
        report["timers"] = len(late)
        report["cancelled"] = len(cancelled)
        report["cancelled_but_due_first"] = fired_anyway
        report["lateness_p50_ms"] = round(1000 * late[len(late) // 2], 1)
        report["lateness_p99_ms"] = round(1000 * late[int(len(late) * 0.99)], 1)
        # every committed order's email went out; twice only for one running at a crash
        assert asyncio.run(_until(lambda: len(world.lines("email", world_dir)) >= len(orders),
                                  60))
        emails = Counter(e.split()[0] for e in world.lines("email", world_dir))
        assert set(emails) == {f"o{i}" for i in range(len(orders))}
        charges = Counter(c.split()[0] for c in world.lines("charge", world_dir))
        assert set(charges) == {f"o{i}" for i in range(len(orders))}
        report["orders"] = len(orders)
        report["email_duplicates"] = sum(n - 1 for n in emails.values())
        report["charge_duplicates"] = sum(n - 1 for n in charges.values())
        # the history is the one the clients saw: re-executing the whole epoch log from the
        # empty state — timers and action cleanups from their records, every run with the
        # journal it ran with, no effect run — gives every request its reply and the same
        # timers' state
        fates, state = asyncio.run(_history(cs, tmp_path / "replay"))
        for reply in orders + arms:
            assert reply.rid in fates, f"request {reply.rid} answered but never in a logged epoch"
            ok, value = fates[reply.rid]
            assert (ok, value if ok else list(value)) == (
                reply.ok, reply.value if reply.ok else [reply.error_type, reply.reason]), reply
        assert {k: {n: v[0] for n, v in got.items()} for k, got in rung.items()} == {
            k[len("rung:"):]: {n: v[0] for n, v in got.items()}
            for k, got in state["alarms"].items() if k.startswith("rung:")}
        report["replayed_requests"] = len(fates)
        print(f"world chaos report: {report}")
    except BaseException:
        print(f"world chaos seed {SEED} failed (rerun: SFAAS_CHAOS_SEED={SEED}); {report}\n"
              f"{log_tails(s, 15000, 6000)}")
        raise
    finally:
        cluster.down(s)


async def _arm(cs: Any, n: int, rnd: random.Random, low: float, high: float) -> None:
    async with Client("world", settings=cs, timeout=120) as c:
        await asyncio.gather(*(c.call("alarms", f"m{i % 20}", "arm", rnd.uniform(low, high),
                                      f"t{i}") for i in range(n)))


async def _rung(cs: Any, n: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """Every ``rung:m*`` key's timers, once ``n`` fired (or ``seconds`` passed)."""
    async with Client("world", settings=cs, timeout=120) as c:
        for _ in range(int(seconds * 5)):
            got = {f"m{k}": await c.call("alarms", f"rung:m{k}", "rung") for k in range(20)}
            if sum(len(v) for v in got.values()) >= n:
                await asyncio.sleep(1.0)  # (one firing twice would show now)
                return {f"m{k}": await c.call("alarms", f"rung:m{k}", "rung") for k in range(20)}
            await asyncio.sleep(0.2)
    return got


def _each_once(rung: dict[str, dict[str, list[float]]], n: int) -> None:
    fired = {name: v for got in rung.values() for name, v in got.items()}
    assert set(fired) == {f"t{i}" for i in range(n)}, sorted({f"t{i}" for i in range(n)} - set(fired))
    assert all(v[0] == 1 for v in fired.values()), {k: v for k, v in fired.items() if v[0] != 1}
    assert all(v[1] >= 0 for v in fired.values())  # never early


@pytest.mark.timeout(600)
def test_timers_follow_a_standby_promotion_and_a_rescale(
        kafka: Any, minio: Any, tmp_path: Path, world_dir: str) -> None:
    """Timers are state: a standby promoted in a SIGKILLed worker's place fires that
    worker's timers, and a rescale 2 → 3 moves timers with their partitions — each fires
    exactly once, never early."""
    rnd = random.Random(SEED)
    s = chaos_settings(kafka, minio, tmp_path, store="lsm", check_determinism=True)
    cluster.up(s, "tests.runtime.apps.world:app", 2, timeout=90, standbys=1)
    try:
        cs = cluster.cluster_settings(s)[1]
        asyncio.run(_arm(cs, 60, rnd, 4, 8))
        time.sleep(1.5)  # (a round holds the timers)
        (victim,) = [p for p in cluster.ps(s) if p.role == "worker" and p.index == 0]
        os.kill(victim.pid, signal.SIGKILL)
        _each_once(asyncio.run(_rung(cs, 60, 60)), 60)
        log = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert "promoting standby" in log, log[-3000:]
    except BaseException:
        print(f"seed {SEED}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
    s = chaos_settings(kafka, minio, tmp_path / "rescale", store="lsm", check_determinism=True)
    cluster.up(s, "tests.runtime.apps.world:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]
        asyncio.run(_arm(cs, 60, rnd, 5, 9))
        summary = cluster.scale(s, 3, timeout=120)
        assert "3 workers" in summary, summary
        _each_once(asyncio.run(_rung(cs, 60, 60)), 60)
    except BaseException:
        print(f"seed {SEED}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
