"""How the cluster's costs grow with its state and its workers: one command per curve.

    python -m benchmarks.scale.cluster keys      # 10K → 50M keys (lsm), 2 workers
    python -m benchmarks.scale.cluster workers   # 1 → 2 → 4 workers, 10K keys
    python -m benchmarks.scale.cluster keys --keys 10K,1M --seconds 20 --no-sweep

Each point is ``benchmarks/runtime/bench.py`` (YCSB-T transfers, open loop, a fresh
cluster over the real Kafka and MinIO — ``sfaas services up`` first) with the stores
preloaded straight from disk (``--preload``, not through transactions; written once per key
count into ``--preload-cache`` and copied for each point):

- ``keys``: at 1,000 TPS the p50 / p99 and CPU per transaction; a worker SIGKILLed 10 s
  in, without and with a standby (the reply gap, the recovery's phases, what the
  replacement downloaded); a rescale 2 → 3 workers 8 s in (its pause, the bytes moved);
  and the saturation (the sweep, unless ``--no-sweep``). A point measures once the
  cluster's first snapshot round (which uploads the preloaded stores) is complete.
- ``workers``: 1, 2, 4 workers at 1,000 TPS and their saturation. This machine has 2
  cores: beyond 2 workers they share them, so the curve measures the protocol's overhead
  per worker, not added capacity — the model (``_model``: capacity of N machines from the
  CPU per transaction measured at the highest rate held) says what more machines would
  give, and its this-machine figure is checked against the measured saturation.

Every point prints as it finishes and is appended to ``--out`` (JSON lines); the tables
go into benchmarks/README.md ("Cost curves") by hand.
"""

from __future__ import annotations

import argparse
import json
import os
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
    for extra_key in ("recovery", "rescales", "first_round"):
        if extra_key in p:
            row[extra_key] = p[extra_key]
    return row


def saturation(points: list[Row]) -> float:
    """The highest offered rate whose p99 stayed ≤ 500 ms and that committed ≥ 80% of it."""
    ok = [p["offered_tps"] for p in points if p["p99_ms"] <= 500 and p["committed_tps"] >= 0.8 * p["offered_tps"]]
    return float(max(ok, default=0.0))


def keys_curve(a: argparse.Namespace, emit: Emit) -> None:
    for k in [parse_count(x, "--keys") for x in a.keys.split(",")]:
        base = ["--store", a.store, "--keys", str(k), "--preload", "--preload-cache", str(a.preload_cache),
                "--seconds", str(a.seconds)]
        p = bench(*base, "--rates", "1000")[0]
        emit(_row("keys", p, point="1000 TPS"))
        p = bench(*base, "--rates", "1000", "--kill-at", "10")[0]
        emit(_row("keys", p, point="worker killed"))
        p = bench(*base, "--rates", "1000", "--kill-at", "10", "--standbys", "1")[0]
        emit(_row("keys", p, point="worker killed, standby"))
        p = bench(*base, "--rates", "1000", "--rescale", "8:3")[0]
        emit(_row("keys", p, point="rescale 2 → 3"))
        if a.sweep:
            pts = bench(*base, "--sweep", "--rates", a.rates)
            emit({"curve": "keys", "keys": k, "point": "saturation", "saturation_tps": saturation(pts),
                  "sweep": [(p["offered_tps"], p["p99_ms"]) for p in pts]})


def _cpu_per_txn(p: Row) -> dict[str, float]:
    """A point's CPU seconds per committed transaction by role, the client included (the
    load generator's share of a core over the run)."""
    out = {k: v / 1e6 for k, v in p["cpu_us_per_txn"].items()}
    loadgen = p.get("cpu_percent", {}).get("loadgen")
    if loadgen is not None and p.get("committed_tps"):
        out["client"] = loadgen / 100 / p["committed_tps"]
    return out


def workers_curve(a: argparse.Namespace, emit: Emit) -> None:
    for n in [int(x) for x in a.workers.split(",")]:
        base = ["--store", a.store, "--keys", str(parse_count(a.keys.split(",")[0], "--keys")),
                "--workers", str(n), "--partitions", str(max(8, 2 * n)), "--seconds", str(a.seconds)]
        p = bench(*base, "--rates", "1000")[0]
        emit(_row("workers", p, point="1000 TPS"))
        if not a.sweep:
            continue
        pts = bench(*base, "--sweep", "--rates", a.rates)
        sat = saturation(pts)
        emit({"curve": "workers", "workers": n, "point": "saturation", "saturation_tps": sat,
              "sweep": [(p["offered_tps"], p["p99_ms"]) for p in pts]})
        held = [p for p in pts if p["offered_tps"] == sat]
        if held:
            emit(_model(n, held[-1], a.cores))


def _model(n: int, p: Row, cores: int) -> Row:
    """The capacity model, from the CPU per transaction at the highest rate ``n`` workers
    held on this machine (batching makes it far lower than at 1,000 TPS):

    - this machine: ``cores / (every process's CPU per transaction)``, the client's
      included — against the measured saturation, it says whether the point is CPU-bound;
    - N machines of ``cores`` cores, one worker and its share of the brokers on each, the
      clients elsewhere: ``N × cores / (workers' + Kafka's CPU per transaction)``, and never
      more than the coordinator's one core allows (``1 / its CPU per transaction``): the
      protocol's cost of more workers is in the measured CPU per transaction at ``n``.
    """
    c = _cpu_per_txn(p)
    total = sum(c.values())
    spread = c.get("worker", 0) + c.get("kafka", 0) + c.get("background", 0)
    coord = c.get("coordinator", 0)
    n_machines = n * cores / max(spread, 1e-9)
    return {"curve": "workers", "workers": n, "point": "model", "at_tps": p["offered_tps"],
            "cpu_us_per_txn": {k: round(v * 1e6) for k, v in c.items()},
            "this_machine_tps": round(cores / max(total, 1e-9)),
            "measured_tps": p["committed_tps"],
            "n_machines_tps": round(min(n_machines, 1 / max(coord, 1e-9))),
            "coordinator_bound_tps": round(1 / max(coord, 1e-9))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("curve", choices=["keys", "workers"])
    ap.add_argument("--keys", default=None, help="key counts (keys: 10K,100K,1M,10M,50M; workers: 10K)")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--store", default="lsm")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rates", default="1000,2000,3000,4000,6000,8000,10000,12000,14000",
                    help="the sweep's rates")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                    help="cores per machine in the capacity model (default: this machine's)")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    ap.add_argument("--preload-cache", dest="preload_cache", type=Path,
                    default=Path.home() / ".cache" / "sfaas" / "preload",
                    help="preloaded stores kept here, written once per key count and copied per point "
                         "(50M lsm keys: ~6 GB)")
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
