"""Runtime benchmark: YCSB-T on a local cluster (2 workers; ``--workers``) over the real Kafka, open loop.

    python benchmarks/runtime/bench.py --store memonly --keys 10000 --dist uniform --rates 1000
    python benchmarks/runtime/bench.py --sweep --store memonly           # to saturation
    python benchmarks/runtime/bench.py --store lsm --snapshot-interval 0  # rounds and epoch log off
    python benchmarks/runtime/bench.py --store lsm --kill-at 8            # SIGKILL a worker 8 s in
    python benchmarks/runtime/bench.py --store lsm --timeline t.json      # then: tails.py t.json

Snapshot rounds run every ``--snapshot-interval`` seconds (default 1, with the epoch log);
MinIO must be running too for them (``sfaas services up``).

Each point: start a fresh cluster (coordinator + ``--workers`` workers, own namespace), run the load
generator in this process at the offered rate, measure committed TPS, abort rate,
p50/p95/p99 latency and CPU per process (psutil), stop the cluster. Results are appended
as JSON lines to ``results.jsonl``; ``report.py`` turns them into RESULTS.md and plots.
Kafka must be running (``sfaas services up``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime.cpu_meter import (  # noqa: E402
    CpuMeter,
    counted_processes,
    cpu_shares,
)
from launcher import cluster  # noqa: E402
from launcher.loadgen import Zipf, run_open_loop  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

HERE = Path(__file__).resolve().parent


THETAS = {"zipf": 0.99, "zipf0.999": 0.999}


def make_generator(keys: int, dist: str, seed: int):
    rnd = random.Random(seed)
    # "zipf": Zipf 0.99 (YCSB's default skew); "zipf0.999": heavier
    draw = Zipf(keys, THETAS[dist], rnd) if dist in THETAS else (lambda: rnd.randrange(keys))

    def make(i: int):
        a = draw()
        b = draw()
        while b == a:
            b = draw()
        return ("ycsb", str(a), "transfer", [str(b)])

    return make


def preload(settings: Settings, keys: int, cache: str = "") -> float:
    """Write every key's initial value straight into the cluster's (not yet running) stores,
    so the state has ``keys`` keys; returns the seconds it took.

    ``cache``: a directory of preloaded stores, one per (engine, partitions, keys), written
    the first time and copied from after (the stores' files are plain files: 50M keys take
    ~11 minutes to write and ~1 to copy). The stores are written merged (``compact``), as a
    store of that size that grew over time would be; a cache from before that
    (``…-{keys}`` without ``-merged``) is not used."""
    t = time.monotonic()
    root = os.path.join(settings.home, "data", settings.namespace, "ycsbt")
    if not cache:
        _write_initial(settings, keys, root)
        return time.monotonic() - t
    kept = os.path.join(cache, f"{settings.store}-{settings.partitions}p-{keys}-merged")
    if not os.path.isdir(kept):
        print(f"  preloading {keys:,} keys into {kept} (once)", file=sys.stderr, flush=True)
        _write_initial(settings, keys, kept + ".part")
        os.rename(kept + ".part", kept)
    os.makedirs(os.path.dirname(root), exist_ok=True)
    shutil.copytree(kept, root)
    return time.monotonic() - t


def _write_initial(settings: Settings, keys: int, root: str) -> None:
    """Every key's initial value into the stores under ``root``."""
    from examples import ycsbt
    from sfaas.runtime.codec import pack
    from sfaas.runtime.state import open_partition_stores

    if os.path.exists(root):  # (a preload cut short)
        shutil.rmtree(root)
    stores = open_partition_stores(ycsbt.app, root, range(settings.partitions), settings.partitions,
                                   store=settings.store)
    try:
        value = pack(ycsbt.INITIAL)
        batches: dict = {}
        for k in range(keys):
            key = str(k)
            batches.setdefault(stores.for_key("ycsb", key), []).append((key.encode(), value))
            if k % 50_000 == 49_999 or k == keys - 1:
                for store, ops in batches.items():
                    store.write_batch(ops)
                batches = {}
        # A store grown to this size over time has long since merged what it was written
        # with; one written in a minute has not, and its pending merges (the whole state,
        # rewritten) would run in the measured window: settle them here, once.
        for name in stores:
            stores[name].compact()
    finally:
        stores.close()


def _uvloop_run():  # noqa: ANN202 - uvloop.run
    import uvloop
    return uvloop.run


def _first_round(settings: Settings, interval: float, patience: float = 3600.0) -> dict | None:
    """Wait until the cluster's first snapshot round is complete (preloaded stores: it
    uploads all of them; the measured run is then the steady state a cluster of that size
    lives in, not its first backup); what it uploaded and how long it took."""
    if interval <= 0:
        return None
    t0 = time.monotonic()
    log_file = cluster.state_dir(settings) / "coordinator.log"
    pat = re.compile(r"snapshot round (\d+) complete: epoch \d+, (\d+) stores, (\d+) files, ([\d.]+) MB uploaded")
    said = t0
    while True:
        m = pat.search(log_file.read_text()) if log_file.exists() else None
        if m:
            return {"round": int(m[1]), "files": int(m[3]), "mb": float(m[4]),
                    "waited_s": round(time.monotonic() - t0, 1)}
        if time.monotonic() - t0 > patience:
            raise RuntimeError(f"no snapshot round complete within {patience:.0f} s; see {log_file}")
        if time.monotonic() - said > 30:
            print(f"  waiting for the first round (uploads the preloaded stores): "
                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            said = time.monotonic()
        time.sleep(0.5)


def _kill_worker(settings: Settings, t0: float, kill: dict, lose_machine: bool = False) -> None:
    """SIGKILL the last worker; ``lose_machine``: delete its stores' directories first (a
    lost machine: its replacement has nothing local to restore from)."""
    from sfaas.runtime.state import stores_root

    victim = [p for p in cluster.ps(settings) if p.role == "worker" and p.alive][-1]
    deleted = 0
    if lose_machine:
        root = stores_root(settings, "ycsbt")
        for op in os.listdir(root):
            for d in os.listdir(os.path.join(root, op)):  # p{partition} and its p{partition}.ship
                if d[:1] != "p":  # (LAYOUT.json: how the stores were written)
                    continue
                if int(d[1:].split(".")[0]) % settings.workers == victim.index:
                    shutil.rmtree(os.path.join(root, op, d), ignore_errors=True)
                    deleted += 1
    os.kill(victim.pid, signal.SIGKILL)
    kill.update(at=time.monotonic(), offset=round(time.monotonic() - t0, 2), pid=victim.pid, index=victim.index,
                dirs_deleted=deleted)


def live_epoch_rate(log_text: str) -> float | None:
    """Epochs per second before the coordinator's first recovery, from its line every 500
    epochs (``coordinator.epochs.LOG_EVERY``); None: fewer than two such lines."""
    points: list[tuple[float, int]] = []
    for line in log_text.splitlines():
        if re.search(r"recovery \d+|lost worker|worker \d+ lost", line):
            break
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*: epochs (\d+); mean", line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            points.append((t, int(m.group(3))))
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _recovery_stats(res, kill: dict, settings: Settings) -> dict:
    """Longest pause of replies after the kill, when the backlog drained, and the phases."""
    gap, gap_start = res.longest_gap(after=kill["at"] - 0.5)
    pre = sorted(lat for lat, t in zip(res.latencies_ms, res.arrivals, strict=True) if t < kill["at"])
    slow_ms = max(100.0, 3 * (pre[int(0.99 * (len(pre) - 1))] if pre else 0.0))
    slow = [t for lat, t in zip(res.latencies_ms, res.arrivals, strict=True) if t >= kill["at"] and lat > slow_ms]
    out = {"kill_at_s": kill["offset"], "longest_gap_s": round(gap, 2),
           "gap_started_after_kill_s": round(gap_start - kill["at"], 2),
           "drained_after_kill_s": round((max(slow) - kill["at"]) if slow else 0.0, 2), "slow_ms": round(slow_ms, 1)}
    log_text = (cluster.state_dir(settings) / "coordinator.log").read_text()
    m = re.findall(r"recovery \d+ done in ([\d.]+) s: rolled back to round (\d+), replayed (\d+) epochs "
                   r"\(detect\+restart ([\d.]+) s, restore ([\d.]+) s, replay ([\d.]+) s\)", log_text)
    if m:
        total, rnd, epochs, detect, restore, replay = m[-1]
        out.update(recovery_s=float(total), round=int(rnd), epochs_replayed=int(epochs),
                   detect_restart_s=float(detect), restore_s=float(restore), replay_s=float(replay))
        # replay speed (issue 48): logged epochs replayed per second over live epochs per second
        live = live_epoch_rate(log_text)
        if live and float(replay) > 0:
            out.update(live_epochs_per_s=round(live, 1),
                       replay_epochs_per_s=round(int(epochs) / float(replay), 1),
                       replay_speedup=round(int(epochs) / float(replay) / live, 2))
        # what the workers downloaded to restore the round (survivors hold their files: the
        # downloads are the lost slot's)
        files = total_files = adopted = 0
        for f in cluster.state_dir(settings).glob("worker-*.log"):
            text = f.read_text()
            for _st, r, d, t, rest in re.findall(r"restored (\S+) to round (\d+): (\d+) of (\d+) files "
                                                 r"downloaded(.*)$", text, re.M):
                if int(r) == int(rnd):
                    files += int(d)
                    total_files += int(t)
                    adopted += "adopted as promoted" in rest
        # (stores a promoted standby took as they stood, not installed again: worker.protocols.recovery)
        out.update(files_downloaded=files, files_restored=total_files, stores_adopted=adopted)
    out["promoted_standby"] = "promoting standby" in log_text
    return out


def _rescale_stats(res, steps: list[dict], settings: Settings) -> list[dict]:
    """Per rescale: the longest pause of replies while it ran, the switch's pause and what
    moved (bytes shipped to the receivers against the bytes of the moved stores' files)."""
    log_text = (cluster.state_dir(settings) / "coordinator.log").read_text()
    switches = re.findall(r"rescaled to (\d+) workers at round (\d+): moved (\d+) partitions; epochs paused ([\d.]+) s",
                          log_text)
    takeovers: dict[int, list[tuple[int, int, int]]] = {}
    for f in cluster.state_dir(settings).glob("worker-*.log"):
        for rnd, shipped, held, down in re.findall(
                r"took over \d+ stores at round (\d+): (\d+) bytes shipped, (\d+) bytes in their files, (\d+) bytes "
                r"downloaded", f.read_text()):
            takeovers.setdefault(int(rnd), []).append((int(shipped), int(held), int(down)))
    out = []
    for step, sw in zip(steps, switches, strict=False):
        workers, rnd, moved, paused = sw
        times = [t for t in res.arrivals if step["at"] - 0.5 <= t <= step["done"] + 2.0]
        gap = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)
        t = takeovers.get(int(rnd), [])
        out.append({"workers": int(workers), "round": int(rnd), "partitions_moved": int(moved),
                    "epochs_paused_s": float(paused), "longest_gap_s": round(gap, 2),
                    "rescale_s": round(step["done"] - step["at"], 2),
                    "bytes_shipped": sum(x[0] for x in t), "bytes_moved_state": sum(x[1] for x in t),
                    "bytes_downloaded": sum(x[2] for x in t)})
    return out


async def _rescale(settings: Settings, workers: int, steps: list[dict]) -> None:
    step = {"workers": workers, "at": time.monotonic()}
    steps.append(step)
    try:
        step["detail"] = await asyncio.to_thread(cluster.scale, settings, workers)
    finally:
        step["done"] = time.monotonic()


async def one_point(settings: Settings, rate: float, seconds: float, keys: int, dist: str,
                    kill_at: float | None = None, lose_machine: bool = False,
                    rescale: list[tuple[float, int]] = ()) -> dict:  # type: ignore[assignment]
    meter = CpuMeter(*counted_processes(settings))
    # (the cluster's secret and coordinator: a client with them sends its requests
    # straight to the workers, setting direct_calls; SFAAS_DIRECT_CALLS=0 for Kafka)
    cs = cluster.cluster_settings(settings)[1]
    client_settings = dataclasses.replace(settings, secret=cs.secret, coordinator=cs.coordinator)
    async with Client("ycsbt", settings=client_settings, timeout=120) as client:
        # warm up (topics, metadata, first epochs)
        await run_open_loop(client, make_generator(keys, dist, 1), min(rate, 500), 2.0)
        meter.start()
        t0, t0_wall = time.monotonic(), time.time()
        kill: dict = {}
        if kill_at is not None:
            asyncio.get_running_loop().call_later(kill_at, _kill_worker, settings, t0, kill, lose_machine)
        steps: list[dict] = []

        async def rescales() -> None:
            for at, workers in rescale:
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                await _rescale(settings, workers, steps)

        resc = asyncio.create_task(rescales())
        res = await run_open_loop(client, make_generator(keys, dist, 2), rate, seconds, drain_timeout=60.0)
        await resc
        used = meter.stop()
    out = res.summary()
    off = time.time() - time.monotonic()  # (wall-clock arrivals, to line up with the logs)
    out["_timeline"] = {"arrivals": [a + off for a in res.arrivals], "latencies_ms": res.latencies_ms}
    out["quantiles_ms"] = _quantiles(res.latencies_ms)
    out.update(cpu_shares(used, max(1, res.committed + res.aborted)))
    out["cpu_s"] = used.as_dict()  # seconds over the window (cpu_ab.py's totals)
    out["window"] = {"start": round(t0_wall, 3), "end": round(t0_wall + used.wall, 3)}
    out["wall_s"] = round(used.wall, 1)
    if kill:
        out["recovery"] = _recovery_stats(res, kill, settings)
    if steps:
        out["rescales"] = _rescale_stats(res, steps, settings)
    return out


#: Latency quantiles kept per point (the distribution plot is drawn from them).
QUANTILES = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


def _quantiles(latencies_ms: list[float]) -> dict[str, float]:
    xs = sorted(latencies_ms)
    if not xs:
        return {}
    return {str(q): round(xs[min(len(xs) - 1, int(q * len(xs)))], 2) for q in QUANTILES}


#: Stopped benchmark clusters whose logs (``{home}/cluster/bench*/``) are kept, the newest;
#: the logs of older ones are deleted with a point's leftovers.
KEEP_LOGS = 20


def prune_logs(home: str | os.PathLike[str], keep: int = KEEP_LOGS) -> list[Path]:
    """Delete the log directories of stopped benchmark clusters but the newest ``keep``
    (a running cluster's, which has a ``cluster.json``, and other namespaces' stay);
    returns those deleted."""
    root = Path(home) / "cluster"
    stopped = [d for d in root.glob("bench*") if d.is_dir() and not (d / "cluster.json").exists()]
    stopped.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for d in stopped[keep:]:
        shutil.rmtree(d, ignore_errors=True)
    return stopped[keep:]


def cleanup(settings: Settings, app: str = "ycsbt") -> None:
    """Delete what a point left behind — its Kafka topics, its MinIO objects and its local
    stores — so later points do not run against a broker and a bucket that keep growing
    (hundreds of leftover partitions measurably slow the broker down); of the benchmark
    clusters' logs, only the newest :data:`KEEP_LOGS` stay."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def drop_topics() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka)
        await admin.start()
        try:
            ours = [t for t in await admin.list_topics() if t.startswith(f"{settings.namespace}.")]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()

    try:
        asyncio.run(drop_topics())
    except Exception as exc:
        print(f"warning: could not delete the topics of {settings.namespace}: {exc}", file=sys.stderr)
    if settings.snapshot_interval > 0:
        try:
            from minio import Minio
            from minio.deleteobjects import DeleteObject

            # SFAAS_MINIO may list the nodes of one distributed MinIO: any of them serves all
            first = settings.minio_endpoints()[0]
            mc = Minio(first.partition("://")[2] or first, settings.minio_access_key,
                       settings.minio_secret_key, secure=first.startswith("https://"))
            objs = [DeleteObject(o.object_name) for o in
                    mc.list_objects(settings.bucket, prefix=f"{settings.namespace}/", recursive=True)]
            for err in mc.remove_objects(settings.bucket, objs):
                print(f"warning: could not delete {err.name}: {err.message}", file=sys.stderr)
        except Exception as exc:
            print(f"warning: could not delete the MinIO objects of {settings.namespace}: {exc}", file=sys.stderr)
    shutil.rmtree(os.path.join(settings.home, "data", settings.namespace), ignore_errors=True)
    prune_logs(settings.home)


def _reruns(settings: Settings) -> float | None:
    """Conflict re-runs per committed transaction, from the workers' periodic log lines
    (counted over the whole run, warm-up included)."""
    committed = reruns = 0
    for log_file in cluster.state_dir(settings).glob("worker-*.log"):
        last = re.findall(r"committed=(\d+) reruns=(\d+)", log_file.read_text())
        if last:
            committed += int(last[-1][0])
            reruns += int(last[-1][1])
    return round(reruns / committed, 3) if committed else None


def machine_probe(pings: int = 2000) -> dict[str, float]:
    """The machine's state before a point: ``wakeup_us``, the median round trip (µs) of one
    byte over loopback TCP between two threads pinned to different CPUs (what each hop
    between two processes on different cores pays to wake the other: on this VM kind
    15 µs on one vCPU, 50–80 across two), and ``loop_ms``, the best of 3 runs of a fixed
    Python loop (the CPU's speed as the host gives it). Recorded with each point, so
    that pictures taken on different days can be told apart by more than their results."""
    cpus = sorted(os.sched_getaffinity(0))
    mine = set(cpus)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[1]})  # (0: this thread)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(1):
                conn.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    times = []
    try:
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[0]})
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(pings):
                t0 = time.perf_counter()
                c.sendall(b"x")
                c.recv(1)
                times.append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, mine)  # (the cluster started next inherits this thread's)
        t.join(5)
        server.close()
    times.sort()
    loops = []
    for _ in range(3):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        loops.append(time.perf_counter() - t0)
    return {"wakeup_us": round(times[len(times) // 2] * 1e6, 1), "loop_ms": round(min(loops) * 1e3, 1)}


def run(args: argparse.Namespace) -> list[dict]:
    rates = [float(r) for r in args.rates.split(",")]
    out = []
    for rate in rates:
        ns = f"bench{uuid.uuid4().hex[:8]}"
        # the workers inherit the environment: SFAAS_FALLBACK=0 turns their fallback phase off
        env = {"SFAAS_STORE": args.store, "SFAAS_FALLBACK": "0" if args.no_fallback else args.fallback}
        os.environ.update(env)
        s = Settings.load({"namespace": ns, "partitions": args.partitions, "store": args.store,
                           "kafka": args.kafka, "max_batch": args.max_batch,
                           "snapshot_interval": args.snapshot_interval, "workers": args.workers})
        load_before = round(os.getloadavg()[0], 1)
        probe = machine_probe()
        preload_s = preload(s, args.keys, args.preload_cache) if args.preload else None
        cluster.up(s, "examples.ycsbt:app", args.workers, timeout=120, standbys=args.standbys)
        try:
            if args.standbys:  # the standbys follow from the start: wait until they are there
                deadline = time.monotonic() + 60
                while sum(p.role == "standby" and p.alive for p in cluster.ps(s)) < args.workers * args.standbys:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"standbys not up within 60 s: {cluster.ps(s)}")
                    time.sleep(0.2)
            first_round = _first_round(s, args.snapshot_interval) if args.preload else None
            runner = asyncio.run if args.client_loop == "asyncio" else _uvloop_run()
            point = runner(one_point(s, rate, args.seconds, args.keys, args.dist, args.kill_at,
                                     args.lose_machine, _steps(args.rescale)))
        finally:
            cluster.down(s)
        timeline = point.pop("_timeline")
        if args.timeline:  # per reply, for tails.py (one file per rate: the rate is in its name)
            path = Path(args.timeline if len(rates) == 1 else f"{args.timeline}.{int(rate)}")
            timeline["cluster_dir"] = str(cluster.state_dir(s))
            path.write_text(json.dumps(timeline))
        point["conflict_reruns_per_txn"] = _reruns(s)
        if not args.keep:
            cleanup(s)
        if preload_s is not None:
            point["preload_s"] = round(preload_s, 1)
        if first_round is not None:
            point["first_round"] = first_round
        point.update({"phase": "sweep" if args.sweep else "fixed", "loadavg": load_before,
                      **probe,
                      "store": args.store, "keys": args.keys, "dist": args.dist, "seconds": args.seconds,
                      "workers": args.workers, "standbys": args.standbys, "lose_machine": args.lose_machine,
                      "fallback": "0" if args.no_fallback else args.fallback, "snapshot_interval": args.snapshot_interval,
                      "label": args.label, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        print(json.dumps(point), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(point) + "\n")
        out.append(point)
        if args.sweep and (point["p99_ms"] > 500 or point["committed_tps"] < 0.8 * rate):
            break
    return out


def _steps(text: str) -> list[tuple[float, int]]:
    """``"10:3,24:2"`` → rescale to 3 workers 10 s in, to 2 workers 24 s in."""
    try:
        return [(float(a), int(b)) for a, b in (x.split(":") for x in text.split(",") if x)]
    except ValueError:
        raise SystemExit(f"--rescale wants SECONDS:WORKERS[,SECONDS:WORKERS...], got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="memonly")
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--dist", choices=["uniform", *THETAS], default="uniform")
    ap.add_argument("--rates", default="1000")
    ap.add_argument("--sweep", action="store_true", help="rates 1000,2000,... until p99 > 500 ms")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--max-batch", dest="max_batch", type=int, default=1000)
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--fallback", choices=["cross", "local"], default="cross",
                    help="the workers' fallback phase: cross-worker (default) or local-only roots (before 16341c2)")
    ap.add_argument("--no-fallback", dest="no_fallback", action="store_true",
                    help="workers without the fallback phase (conflicts only re-run next epoch)")
    ap.add_argument("--snapshot-interval", dest="snapshot_interval", type=float, default=1.0,
                    help="seconds between snapshot rounds (epoch log on); 0: rounds and epoch log off")
    ap.add_argument("--kill-at", dest="kill_at", type=float, default=None,
                    help="SIGKILL a worker this many seconds into the measured run; report the recovery")
    ap.add_argument("--preload", action="store_true",
                    help="write all --keys keys into the stores before the cluster starts (state of that size)")
    ap.add_argument("--preload-cache", dest="preload_cache", default="",
                    help="with --preload: keep the preloaded stores in this directory and copy them "
                         "for the next point of the same engine, partitions and keys")
    ap.add_argument("--client-loop", dest="client_loop", choices=["asyncio", "uvloop"], default="asyncio",
                    help="the event loop the client (the load generator) runs on; the workers and the "
                         "coordinator run on uvloop")
    ap.add_argument("--label", default="", help="a tag stored with each point (e.g. the repeat of a series)")
    ap.add_argument("--keep", action="store_true",
                    help="keep each point's topics, MinIO objects and stores (default: delete them after the point)")
    ap.add_argument("--workers", type=int, default=2, help="workers of the cluster (default 2)")
    ap.add_argument("--standbys", type=int, default=0, help="standby workers per worker (sfaas up --standbys)")
    ap.add_argument("--rescale", default="", help="SECONDS:WORKERS,... — sfaas scale during the measured run")
    ap.add_argument("--lose-machine", dest="lose_machine", action="store_true",
                    help="with --kill-at: delete the victim's store directories before the SIGKILL")
    ap.add_argument("--timeline", default="",
                    help="write each reply's arrival and latency here (JSON; tails.py reads it)")
    ap.add_argument("--out", default=str(HERE / "results.jsonl"))
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.sweep and args.rates == "1000":
        args.rates = "1000,2000,3000,4000,5000,6000,7000,8000,9000,10000"
    logging.basicConfig(level=logging.WARNING)
    run(args)


if __name__ == "__main__":
    main()
