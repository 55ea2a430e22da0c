"""Durable timers through crashes: ``--timers`` timers due over ``--seconds`` on a 2-worker
cluster while workers and the coordinator are SIGKILLed (a seeded schedule).

    python -m benchmarks.runtime.timers [--timers 10000] [--seconds 30] [--seed N]

Arms the timers (``alarms.arm`` on 50 keys, each due a random 1..``--seconds`` s after
the start of arming), SIGKILLs ``--worker-kills`` workers and ``--coordinator-kills``
coordinators at random times within the window, waits until every timer is due, and
checks every timer fired exactly once and none early (``ctx.now()`` of its transaction
>= its due time). Lateness is ``ctx.now()`` minus the due time; *outside recovery* leaves
out the timers due between a kill and the end of the recovery it caused (the
coordinator's log: "recovery N done"), plus a second. Prints the report (the target:
p99 lateness outside recovery <= 100 ms) and appends it to ``--out``.
Needs Kafka and MinIO (``sfaas services up``; started here when down).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import re
import signal
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.runtime.bench import cleanup, machine_probe  # noqa: E402
from launcher import cluster, services  # noqa: E402
from launcher.loadgen import percentile  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

HERE = Path(__file__).resolve().parent
KEYS = 50


def _kill(s: Settings, role: str, rnd: random.Random) -> bool:
    procs = [p for p in cluster.ps(s) if p.role == role and p.alive]
    if not procs:
        return False
    os.kill(rnd.choice(procs).pid, signal.SIGKILL)
    return True


async def _run(s: Settings, a: argparse.Namespace, rnd: random.Random,
               report: dict[str, object]) -> dict[str, dict[str, list[float]]]:
    async with Client("worldbench", settings=s, timeout=180, max_in_flight=20_000) as c:
        loop = asyncio.get_running_loop()
        faults = sorted([(rnd.uniform(3, a.seconds - 3), "worker") for _ in range(a.worker_kills)]
                        + [(rnd.uniform(3, a.seconds - 3), "coordinator")
                           for _ in range(a.coordinator_kills)])
        report["schedule"] = [(round(t, 2), r) for t, r in faults]
        kills: list[tuple[float, str]] = []

        def due_faults(now: float) -> None:
            """SIGKILL what the schedule says is due by ``now`` (a role with no live
            process yet — restarting — waits for the next look)."""
            while faults and faults[0][0] <= now:
                if not _kill(s, faults[0][1], rnd):
                    break
                kills.append((time.time(), faults.pop(0)[1]))

        t0 = loop.time()
        wall0 = time.time()
        arms = []
        per_s = a.timers / max(1.0, a.seconds / 3)  # armed in the first third
        for i in range(a.timers):
            now = loop.time() - t0
            due_faults(now)
            due_at = rnd.uniform(1.0, a.seconds)  # after the start of arming
            delay = max(0.2, due_at - now)
            arms.append(await c.submit("alarms", f"k{i % KEYS}", "arm", delay, f"t{i}"))
            if i % 100 == 99:
                await asyncio.sleep(max(0.0, (i + 1) / per_s - (loop.time() - t0)))
        while faults or loop.time() - t0 < a.seconds:
            due_faults(loop.time() - t0)
            await asyncio.sleep(0.05)
        replies = await asyncio.wait_for(asyncio.gather(*arms), 300)
        report["armed"] = sum(1 for r in replies if r.ok)
        report["arm_failures"] = [r.reason for r in replies if not r.ok][:3]
        report["kills"] = [(round(t - wall0, 2), role) for t, role in kills]
        rung: dict[str, dict[str, list[float]]] = {}
        for _ in range(600):
            rung = dict(zip([f"k{k}" for k in range(KEYS)], await asyncio.gather(
                *(c.call("alarms", f"rung:k{k}", "rung") for k in range(KEYS))), strict=True))
            if sum(len(v) for v in rung.values()) >= report["armed"]:  # type: ignore[operator]
                break
            await asyncio.sleep(0.5)
        report["_wall0"] = wall0
        report["_kills_wall"] = [t for t, _ in kills]
        return rung


def _recoveries_done(s: Settings) -> list[float]:
    """Wall times of the coordinator log's "recovery N done" lines (every coordinator's)."""
    out = []
    for f in cluster.state_dir(s).glob("coordinator*.log*"):
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*recovery \d+ done", line)
            if m:
                out.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                           .timestamp())
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timers", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--worker-kills", type=int, default=2)
    ap.add_argument("--coordinator-kills", type=int, default=1)
    ap.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 32))
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--out", default=str(HERE / "timers.jsonl"))
    a = ap.parse_args(argv)
    if a.timers < 1 or a.seconds < 8:
        ap.error("--timers must be >= 1 and --seconds >= 8")
    print(f"seed {a.seed} (rerun: --seed {a.seed})", flush=True)
    rnd = random.Random(a.seed)
    services.up(progress=False)
    s = Settings.load({"namespace": f"tm{uuid.uuid4().hex[:8]}", "partitions": 8,
                       "store": "memonly", "kafka": a.kafka, "snapshot_interval": 1.0})
    report: dict[str, object] = {"benchmark": "timers", "seed": a.seed, "timers": a.timers,
                                 "seconds": a.seconds, **machine_probe()}
    cluster.up(s, "benchmarks.runtime.world_app:app", 2, timeout=120)
    try:
        rung = asyncio.run(_run(cluster.cluster_settings(s)[1], a, rnd, report))
        done = _recoveries_done(s)
    finally:
        cluster.down(s)
        cleanup(s, app="worldbench")
    wall0 = float(report.pop("_wall0"))  # type: ignore[arg-type]
    kills = list(report.pop("_kills_wall"))  # type: ignore[call-overload]
    windows = []
    for k in kills:
        end = next((d for d in done if d >= k), k + 10.0)
        windows.append((k, end + 1.0))
    report["recovery_windows_s"] = [(round(x - wall0, 2), round(y - wall0, 2)) for x, y in windows]
    fired = {(key, name): v for key, got in rung.items() for name, v in got.items()}
    counts = [int(v[0]) for v in fired.values()]
    early = [v[1] for v in fired.values() if v[1] < 0]
    late_all = sorted(v[1] for v in fired.values())
    # (due times are the coordinator's clock: the wall clock, on one host)
    outside = sorted(late for _, late, due in fired.values()
                     if not any(x <= due <= y for x, y in windows))
    report.update({
        "fired": len(fired), "missing": int(report["armed"]) - len(fired),  # type: ignore[call-overload]
        "fired_more_than_once": sum(1 for n in counts if n > 1), "early": len(early),
        "lateness_p50_ms": round(1000 * percentile(late_all, 0.5), 1),
        "lateness_p99_ms": round(1000 * percentile(late_all, 0.99), 1),
        "outside_recovery": len(outside),
        "outside_recovery_p50_ms": round(1000 * percentile(outside, 0.5), 1) if outside else None,
        "outside_recovery_p99_ms": round(1000 * percentile(outside, 0.99), 1) if outside else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    print(json.dumps(report), flush=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(report) + "\n")
    ok = report["missing"] == 0 and report["fired_more_than_once"] == 0 and not early
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
