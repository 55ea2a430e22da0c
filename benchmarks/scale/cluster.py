"""How the cluster's costs grow with its state and its workers: one command per curve.

    python -m benchmarks.scale.cluster keys      # 10K → 50M keys (lsm), 2 workers
    python -m benchmarks.scale.cluster workers   # 1 → 2 → 4 workers, 10K keys
    python -m benchmarks.scale.cluster keys --keys 10K,1M --seconds 20 --no-sweep

Each point is ``benchmarks/runtime/bench.py`` (YCSB-T transfers, open loop, a fresh
cluster over the real Kafka and MinIO — ``sfaas services up`` first) with the stores
preloaded straight from disk (``--preload``, not through transactions):

- ``keys``: at 1,000 TPS the p50 / p99 and CPU per transaction; a worker SIGKILLed 10 s
  in, without and with a standby (the reply gap, the recovery's phases, what the
  replacement downloaded); and the saturation (the sweep, unless ``--no-sweep``).
- ``workers``: 1, 2, 4 workers at 1,000 TPS and their saturation. This machine has 2
  cores: beyond 2 workers they share them, so the curve measures the protocol's overhead
  per worker, not added capacity — the model printed at the end (capacity of N machines
  from the measured CPU per transaction) says what more machines would give.

Every point prints as it finishes and is appended to ``--out`` (JSON lines); the tables
go into benchmarks/README.md ("Cost curves") by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.scale.state import parse_count  # noqa: E402

Row = dict[str, Any]
Emit = Callable[[Row], None]
BENCH = ROOT / "benchmarks" / "runtime" / "bench.py"


def bench(*args: str) -> list[Row]:
    """Run bench.py with ``args``; its points."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        cmd = [sys.executable, str(BENCH), *args, "--out", out.name]
        print("  $ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
        res = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if res.returncode != 0:
            raise SystemExit(f"bench.py {' '.join(args)} failed (exit {res.returncode})")
        return [json.loads(x) for x in Path(out.name).read_text().splitlines() if x.strip()]


def _row(kind: str, p: Row, **extra: object) -> Row:
    row = {"curve": kind, "keys": p["keys"], "workers": p["workers"], "standbys": p["standbys"],
           "offered_tps": p["offered_tps"], "committed_tps": p["committed_tps"],
           "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"], "cpu_us_per_txn": p["cpu_us_per_txn"],
           "preload_s": p.get("preload_s"), "time": p["time"], **extra}
    if "recovery" in p:
        row["recovery"] = p["recovery"]
    return row


def saturation(points: list[Row]) -> float:
    """The highest offered rate whose p99 stayed ≤ 500 ms and that committed ≥ 80% of it."""
    ok = [p["offered_tps"] for p in points if p["p99_ms"] <= 500 and p["committed_tps"] >= 0.8 * p["offered_tps"]]
    return float(max(ok, default=0.0))


def keys_curve(a: argparse.Namespace, emit: Emit) -> None:
    for k in [parse_count(x, "--keys") for x in a.keys.split(",")]:
        base = ["--store", a.store, "--keys", str(k), "--preload", "--seconds", str(a.seconds)]
        p = bench(*base, "--rates", "1000")[0]
        emit(_row("keys", p, point="1000 TPS"))
        p = bench(*base, "--rates", "1000", "--kill-at", "10")[0]
        emit(_row("keys", p, point="worker killed"))
        p = bench(*base, "--rates", "1000", "--kill-at", "10", "--standbys", "1")[0]
        emit(_row("keys", p, point="worker killed, standby"))
        if a.sweep:
            pts = bench(*base, "--sweep", "--rates", a.rates)
            emit({"curve": "keys", "keys": k, "point": "saturation", "saturation_tps": saturation(pts),
                  "sweep": [(p["offered_tps"], p["p99_ms"]) for p in pts]})


def workers_curve(a: argparse.Namespace, emit: Emit) -> None:
    cpu: dict[int, dict[str, int]] = {}
    for n in [int(x) for x in a.workers.split(",")]:
        base = ["--store", a.store, "--keys", str(parse_count(a.keys.split(",")[0], "--keys")),
                "--workers", str(n), "--partitions", str(max(8, 2 * n)), "--seconds", str(a.seconds)]
        p = bench(*base, "--rates", "1000")[0]
        cpu[n] = p["cpu_us_per_txn"]
        emit(_row("workers", p, point="1000 TPS"))
        if a.sweep:
            pts = bench(*base, "--sweep", "--rates", a.rates)
            emit({"curve": "workers", "workers": n, "point": "saturation",
                  "saturation_tps": saturation(pts), "sweep": [(p["offered_tps"], p["p99_ms"]) for p in pts]})
    # the model: a machine per worker, each with this machine's cores; a transaction costs
    # the workers' and the broker's CPU measured at N workers (the coordinator's is one
    # process, shared); capacity = machines × cores / (CPU per transaction per machine)
    cores = 2
    for n, c in sorted(cpu.items()):
        per_txn = (c.get("worker", 0) + c.get("kafka", 0)) / 1e6
        emit({"curve": "workers", "workers": n, "point": "model",
              "cpu_s_per_txn": round(per_txn, 6),
              "this_machine_tps": round(cores / max(per_txn, 1e-9)),
              "n_machines_tps": round(n * cores / max(per_txn, 1e-9))})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("curve", choices=["keys", "workers"])
    ap.add_argument("--keys", default=None, help="key counts (keys: 10K,100K,1M,10M,50M; workers: 10K)")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--store", default="lsm")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rates", default="1000,2000,3000,4000,6000,8000", help="the sweep's rates")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale-cluster.jsonl")
    a = ap.parse_args(argv)
    a.keys = a.keys or ("10K,100K,1M,10M,50M" if a.curve == "keys" else "10K")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def emit(row: Row) -> None:
        print(json.dumps(row), flush=True)
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")

    (keys_curve if a.curve == "keys" else workers_curve)(a, emit)
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
