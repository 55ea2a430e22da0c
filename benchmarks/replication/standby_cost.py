"""What a standby costs: a shipped standby against a self-merging one and none (the
Tebis / RubbleDB experiment on our engines), in one run.

A primary store takes a write-heavy load (YCSB-A: 50% reads, 50% updates; or 100%
updates; uniform or Zipf 0.99 keys) with one standby in another process, three ways:

* ``shipped``: the standby is a ``statestores.replica`` follower fed over ``tcp`` — the
  primary ships the runs it flushed and merged, with their indexes; the standby never
  flushes or merges;
* ``replay``: the standby receives the writes (batches of 1,000, as a Kafka Streams
  changelog would carry them) and applies them to its own store, which flushes and
  merges again — what Kafka Streams standbys and Flink's local recovery do;
* ``none``: no standby.

Reported per point: the primary's throughput during the run phase, the standby's CPU
(its process and its background merge/flush processes, separately), the primary's CPU,
and the network bytes shipped per byte written. Both the load and the run phase are
replicated; only the run phase is measured (after the standby caught up with the load).

    python -m benchmarks.replication.standby_cost                 # 1M keys, every mode/workload/dist
    python -m benchmarks.replication.standby_cost --keys 20000 --ops 20000 --no-readme   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil

from benchmarks.readme import publish

ROOT = Path(__file__).resolve().parents[2]
_LEN = struct.Struct("<I")
BATCH = 1000
VALUE_BYTES = 100


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of its live descendants: the background lanes)."""
    t = proc.cpu_times()
    own = t.user + t.system
    kids = 0.0
    for c in proc.children(recursive=True):
        try:
            ct = c.cpu_times()
            kids += ct.user + ct.system
        except psutil.NoSuchProcess:
            pass
    return own, kids


# ---------------------------------------------------------------------------------- standby


def standby_main(mode: str, engine: str, directory: str, host: str, port: int, secret: str) -> None:
    """The standby process: follow (shipped) or apply batches (replay); answer ``sync`` lines."""
    import statestores
    from statestores.replica import TcpSource

    me = psutil.Process()
    applied = [0]
    received = [0]
    if mode == "shipped":
        follower = statestores.follow(engine, directory, TcpSource(host, port, "bench", secret))
        store = None
    else:
        store = statestores.open(engine, directory)
        sock = socket.create_connection((host, port))

        def reader() -> None:
            buf = sock.makefile("rb")
            while True:
                head = buf.read(4)
                if len(head) < 4:
                    return
                (n,) = _LEN.unpack(head)
                body = buf.read(n)
                received[0] += 4 + n
                store.write_batch([(k, v) for k, v in msgpack.unpackb(body)])
                applied[0] += 1

        threading.Thread(target=reader, daemon=True).start()
    for line in sys.stdin:
        cmd, target = line.split()
        deadline = time.monotonic() + 600
        if mode == "shipped":
            follower.wait(seq=int(target), timeout=600)
            got = follower.stats()["bytes_received"]
        else:
            while applied[0] < int(target) and time.monotonic() < deadline:
                time.sleep(0.01)
            got = received[0]
        own, kids = _cpu(me)
        print(json.dumps({"cpu": own, "bg_cpu": kids, "bytes": got, "bg_procs": len(me.children(recursive=True))}),
              flush=True)
        if cmd == "stop":
            break
    if store is not None:
        store.close()
    else:
        follower.close()


# ---------------------------------------------------------------------------------- primary


def _keys(n: int) -> list[bytes]:
    return [b"user%012d" % i for i in range(n)]


def run_point(mode: str, workload: str, dist: str, engine: str, n_keys: int, n_ops: int, seed: int) -> dict[str, Any]:
    import statestores
    from benchmarks.stores.workloads import index_sequence
    from statestores.replica import Shipper, TcpServer

    tmp = Path(tempfile.mkdtemp(prefix="sfaas-standby-cost-"))
    secret = secrets.token_hex(16)
    db = statestores.open(engine, tmp / "primary")
    keys = _keys(n_keys)
    rnd = random.Random(seed)
    listener = None
    server = None
    child = None
    conn: socket.socket | None = None
    sent = [0]
    batches = [0]
    pending: list[tuple[bytes, bytes | None]] = []

    def send(ops: list[tuple[bytes, bytes | None]]) -> None:
        assert conn is not None
        body = msgpack.packb(ops)
        conn.sendall(_LEN.pack(len(body)) + body)
        sent[0] += 4 + len(body)
        batches[0] += 1

    try:
        if mode == "shipped":
            server = TcpServer({"bench": Shipper(db, name="bench")}, secret)
            host, port = server.address
        elif mode == "replay":
            listener = socket.create_server(("127.0.0.1", 0))
            host, port = listener.getsockname()[:2]
        if mode != "none":
            child = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.replication.standby_cost", "--standby", mode, "--engine", engine,
                 "--dir", str(tmp / "standby"), "--connect", f"{host}:{port}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "SFAAS_BENCH_SECRET": secret},
            )
            if listener is not None:
                conn, _ = listener.accept()

        def sync(cmd: str = "sync") -> dict[str, Any]:
            if child is None:
                return {}
            if pending:
                send(pending[:])
                pending.clear()
            target = db.version()[0] if mode == "shipped" else batches[0]
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(f"{cmd} {target}\n")
            child.stdin.flush()
            return json.loads(child.stdout.readline())  # type: ignore[no-any-return]

        value = os.urandom(VALUE_BYTES)
        for i in range(0, n_keys, BATCH):  # load
            ops: list[tuple[bytes, bytes | None]] = [(k, value) for k in keys[i:i + BATCH]]
            db.write_batch(ops)
            if conn is not None:
                send(ops)
        db.flush()
        db.settle()
        base = sync()
        me = psutil.Process()
        p0 = _cpu(me)
        idx = index_sequence(dist, n_keys, n_ops, seed).tolist()
        reads = [rnd.random() < 0.5 for _ in range(n_ops)] if workload == "ycsb-a" else [False] * n_ops
        written = 0
        t0 = time.perf_counter()
        for i, is_read in zip(idx, reads, strict=True):
            k = keys[i]
            if is_read:
                db.get(k)
                continue
            v = value[: VALUE_BYTES - 1] + bytes([i & 0xFF])
            db[k] = v
            written += len(k) + len(v)
            if conn is not None:
                pending.append((k, v))
                if len(pending) >= BATCH:
                    send(pending[:])
                    pending.clear()
        wall = time.perf_counter() - t0
        db.flush()
        db.settle()
        p1 = _cpu(me)
        end = sync("stop")
        row: dict[str, Any] = {
            "mode": mode, "workload": workload, "dist": dist, "engine": engine, "keys": n_keys, "ops": n_ops,
            "primary_ops_per_s": round(n_ops / wall), "run_s": round(wall, 2), "bytes_written": written,
            "primary_cpu_s": round(p1[0] - p0[0], 2), "primary_bg_cpu_s": round(p1[1] - p0[1], 2),
        }
        if end:
            row.update({
                "standby_cpu_s": round(end["cpu"] - base["cpu"], 2), "standby_bg_cpu_s": round(end["bg_cpu"] - base["bg_cpu"], 2),
                "standby_bg_procs": end["bg_procs"],
                "bytes_shipped": end["bytes"] - base["bytes"],
            })
            row["shipped_per_written"] = round(row["bytes_shipped"] / written, 2) if written else None
        return row
    finally:
        if child is not None:
            child.wait(60)
        if conn is not None:
            conn.close()
        if listener is not None:
            listener.close()
        if server is not None:
            server.close()
        db.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------- report


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the numeric medians of repeats of the same point."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[k] for r in rows if r.get(k) is not None]
            out[k] = round(statistics.median(vals), 2) if vals else None
    out["repeats"] = len(rows)
    return out


def report(rows: list[dict[str, Any]]) -> str:
    """Medians of the repeats per point: the targets, then every number."""
    n = max((r.get("repeat", 1) for r in rows), default=1)
    out = [f"Medians of {n} repeat(s); {rows[0]['keys']:,} keys, {rows[0]['ops']:,} operations per run phase, engine "
           f"`{rows[0]['engine']}`; CPU in seconds over the run phase and the standby's catch-up.", "",
           "| workload | dist | mode | primary ops/s (vs none) | primary CPU s (bg) | standby CPU s | standby merge/flush CPU s | bytes shipped / written |",
           "|---|---|---|---|---|---|---|---|"]
    targets = []
    for (wl, dist) in sorted({(r["workload"], r["dist"]) for r in rows}):
        by = {m: _medians([r for r in rows if (r["workload"], r["dist"], r["mode"]) == (wl, dist, m)])
              for m in {r["mode"] for r in rows if (r["workload"], r["dist"]) == (wl, dist)}}
        none = by.get("none")
        for mode in ("none", "shipped", "replay"):
            r = by.get(mode)
            if r is None:
                continue
            ratio = f" ({r['primary_ops_per_s'] / none['primary_ops_per_s']:.0%})" if none and mode != "none" else ""
            r["primary_ops_per_s"] = int(r["primary_ops_per_s"])
            sb = lambda k, r=r: f"{r[k]}" if k in r else "–"  # noqa: E731
            out.append(f"| {wl} | {dist} | {mode} | {r['primary_ops_per_s']:,}{ratio} | {r['primary_cpu_s']} ({r['primary_bg_cpu_s']}) "
                       f"| {sb('standby_cpu_s')} | {sb('standby_bg_cpu_s')} | {sb('shipped_per_written')} |")
        s, rp = by.get("shipped"), by.get("replay")
        if s and rp and none:
            tot = lambda r: r["standby_cpu_s"] + r["standby_bg_cpu_s"]  # noqa: E731
            targets.append(f"| {wl} {dist} | {s['standby_bg_cpu_s']} s {'✓' if s['standby_bg_cpu_s'] == 0 else '✗'} "
                           f"| {tot(s) / tot(rp):.0%} {'✓' if tot(s) <= 0.3 * tot(rp) else '✗'} "
                           f"| {s['primary_ops_per_s'] / none['primary_ops_per_s']:.0%} "
                           f"{'✓' if s['primary_ops_per_s'] >= 0.9 * none['primary_ops_per_s'] else '✗'} |")
    head = ["| point | shipped standby merge/flush CPU (= 0) | shipped / self-merging standby CPU (≤ 30%) | primary throughput with a shipped standby (≥ 90% of none) |",
            "|---|---|---|---|"]
    return "\n".join(head + targets) + "\n\n" + "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--engine", default="lsm")
    ap.add_argument("--modes", default="none,shipped,replay")
    ap.add_argument("--workloads", default="ycsb-a,update")
    ap.add_argument("--dists", default="uniform,zipf")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / time.strftime("%Y-%m-%d-standby-cost"))
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--standby", choices=["shipped", "replay"], help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--connect", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.standby:
        host, port = a.connect.rsplit(":", 1)
        standby_main(a.standby, a.engine, a.dir, host, int(port), os.environ["SFAAS_BENCH_SECRET"])
        return
    if a.keys < 2 or a.ops < 1:
        ap.error(f"--keys must be >= 2 and --ops >= 1, got {a.keys} and {a.ops}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    points = [(rep, w, d, m) for rep in range(1, a.repeats + 1) for w in a.workloads.split(",")
              for d in a.dists.split(",") for m in a.modes.split(",")]
    t0 = time.monotonic()
    with open(a.out / "standby_cost.jsonl", "a") as f:
        for i, (rep, w, d, m) in enumerate(points, 1):
            print(f"[{i}/{len(points)}, {time.monotonic() - t0:.0f} s] repeat {rep}: {w} {d} {m}: {a.keys:,} keys, "
                  f"{a.ops:,} ops", file=sys.stderr, flush=True)
            seed = 1000 * rep + 10 * a.workloads.split(",").index(w) + a.dists.split(",").index(d)  # paired across modes
            row = run_point(m, w, d, a.engine, a.keys, a.ops, seed=seed)
            row["loadavg"] = round(os.getloadavg()[0], 1)
            row["repeat"] = rep
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
            rows.append(row)
    text = report(rows)
    print(text)
    if not a.no_readme:
        publish("standby-cost", "Replication: what a standby costs", text, a.out,
                "python -m benchmarks.replication.standby_cost", "standby_cost.jsonl")
    else:
        (a.out / "REPORT.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
