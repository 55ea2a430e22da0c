"""Turn ``results.jsonl`` (from bench.py) into ``RESULTS.md`` and PNG plots.

    python benchmarks/runtime/report.py
"""

from __future__ import annotations

import json
import os
import platform
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def sweep_axes(a1: Any, a2: Any) -> None:
    """Label a sweep's two panels: committed TPS and p99 (log, the 500 ms line) vs offered TPS."""
    a1.set_xlabel("offered TPS")
    a1.set_ylabel("committed TPS")
    a2.set_xlabel("offered TPS")
    a2.set_ylabel("p99 latency (ms)")
    a2.set_yscale("log")
    a2.axhline(500, color="grey", ls="--", lw=0.8)


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plots(rows: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    sweeps: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("phase") == "sweep":
            sweeps[(r["store"], r["keys"], r["dist"])].append(r)
    if sweeps:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for (store, keys, dist), pts in sorted(sweeps.items()):
            pts.sort(key=lambda p: p["offered_tps"])
            label = f"{store} {keys // 1000}K {dist}"
            a1.plot([p["offered_tps"] for p in pts], [p["committed_tps"] for p in pts], "o-", label=label)
            a2.plot([p["offered_tps"] for p in pts], [p["p99_ms"] for p in pts], "o-", label=label)
        sweep_axes(a1, a2)
        a1.legend(fontsize=7)
        fig.suptitle("YCSB-T, 2 workers, open loop: throughput and p99 vs offered load")
        fig.tight_layout()
        name = "sweep.png"
        fig.savefig(HERE / name, dpi=110)
        out.append(name)
    fixed = [r for r in rows if r.get("phase") == "fixed"]
    if fixed:
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{r['store']}\n{r['keys'] // 1000}K {r['dist']}" + ("" if r.get("fallback") not in (False, "0", None) else "\nno fallback")
                  for r in fixed]
        xs = range(len(fixed))
        ax.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in fixed], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in fixed], 0.4, label="p99")
        ax.axhline(7, color="C0", ls=":", lw=0.8)
        ax.axhline(30, color="C1", ls=":", lw=0.8)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("latency (ms)")
        ax.set_title("YCSB-T at 1,000 offered TPS (targets: p50 7 ms, p99 30 ms dotted)")
        ax.legend()
        fig.tight_layout()
        name = "latency_1000tps.png"
        fig.savefig(HERE / name, dpi=110)
        out.append(name)
    return out


def table(rows: list[dict]) -> str:
    head = ("| phase | store | keys | dist | fallback | offered | committed TPS | lost | user-abort rate "
            "| conflicts per txn | p50 ms | p95 ms | p99 ms "
            "| CPU % (coord / w0 / w1 / loadgen / kafka) | CPU µs per txn (coord / workers / kafka) "
            "| load avg |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        cpu = r.get("cpu_percent", {})
        coord = [v for k, v in cpu.items() if k.startswith("coordinator")]
        workers = [v for k, v in cpu.items() if k.startswith("worker")]
        kafka = [v for k, v in cpu.items() if k.startswith("kafka")]
        cpu_s = " / ".join(f"{v:.0f}" for v in coord + workers + [cpu.get("loadgen", 0)] + kafka)
        per = r.get("cpu_us_per_txn", {})
        us = " / ".join(str(per.get(k, "-")) for k in ("coordinator", "worker", "kafka"))
        lines.append(
            f"| {r.get('phase', '')} | {r['store']} | {r['keys']} | {r['dist']} "
            f"| {'on' if r.get('fallback') else 'off'} | {r['offered_tps']:.0f} "
            f"| {r['committed_tps']:.0f} | {r.get('lost', '-')} | {r['abort_rate']:.3f} | {r.get('conflict_reruns_per_txn', '-')} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {cpu_s} | {us} | {r.get('loadavg', '')} |"
        )
    return head + "\n".join(lines) + "\n"


def zipf(rows: list[dict]) -> str:
    """The skewed fixed points side by side: fallback phase on vs off."""
    lines = ["| store | fallback | committed TPS (of 1,000) | lost replies | p50 ms | p99 ms | load avg |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("phase") == "fixed" and r["dist"] == "zipf":
            lines.append(f"| {r['store']} | {'on' if r.get('fallback') else 'off'} | {r['committed_tps']:.0f} "
                         f"| {r.get('lost', '-')} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r.get('loadavg', '')} |")
    return "\n".join(lines) + "\n"


def saturation(rows: list[dict]) -> str:
    best: dict[tuple, float] = {}
    for r in rows:
        if r.get("phase") != "sweep":
            continue
        k = (r["store"], r["keys"], r["dist"])
        if r["p99_ms"] <= 500 and r["committed_tps"] >= 0.95 * r["offered_tps"]:
            best[k] = max(best.get(k, 0.0), r["committed_tps"])
        else:
            best.setdefault(k, 0.0)
    lines = ["| store | keys | dist | saturation: highest committed TPS with p99 ≤ 500 ms |", "|---|---|---|---|"]
    for (store, keys, dist), tps in sorted(best.items()):
        lines.append(f"| {store} | {keys} | {dist} | {tps:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = load(HERE / "results.jsonl")
    images = plots(rows)
    md = [
        "# Runtime benchmark: YCSB-T on 2 workers over real Kafka",
        "",
        "Produced by `benchmarks/runtime/run_all.sh` (which calls `bench.py` per point and then",
        "`report.py`). Every point starts a fresh cluster (coordinator + 2 worker processes) in",
        "its own Kafka namespace; the open-loop load generator runs in the benchmark process.",
        "Kafka (and MinIO) run on the same machine. Each transaction reads and updates two keys",
        "(`examples/ycsbt.py`: `transfer`), the second usually on the other worker.",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}.",
        "**Caveat:** other agents ran their own tests and benchmarks on the same 2 cores while",
        "these numbers were taken (the `load avg` column is the 1-minute load average at the",
        "start of each point); latencies are inflated by CPU contention accordingly.",
        "",
        "Command: `SECONDS_FIXED=45 SECONDS_SWEEP=12 benchmarks/runtime/run_all.sh` (fixed points:",
        "45 s at 1,000 offered TPS; sweep points: 12 s each, stopping at the first rate whose p99",
        "exceeds 500 ms). Latency is measured by the client from send to reply, over all replies.",
        "",
        "## Reading the numbers",
        "",
        "* Targets (issue 3): p50 ≤ 7 ms and p99 ≤ 30 ms at 1,000 TPS; saturation ≥ 9,000 TPS",
        "  (memonly/hybridlog), ≥ 6,000 (lsm/appendlog). Not met here; see the closing notes of",
        "  the runtime work for the profile. At 1,000 TPS a request crosses Kafka twice and one",
        "  epoch (begin → execution with a remote call → one report barrier → commit); with the",
        "  box shared (load average 5–8 on 2 cores), every process wake-up waits for a core.",
        "* `CPU µs per txn` is the contention-independent cost: at 5–6K TPS the two workers",
        "  together spend ~85–110 µs of CPU per transaction and the Kafka broker ~40–60 µs.",
        "* Zipfian 0.99 (100K keys): about 15% of transactions touch the hottest key, and an",
        "  epoch commits at most one writer per key. Without help the hot key drains one",
        "  transaction per epoch; when the box is loaded, epochs get longer, the hot queue grows,",
        "  batches get bigger and slower, and the run collapses (`fallback off` rows; the",
        "  previous version of this file saw 650 committed TPS and p99 of 46 s). The **fallback",
        "  phase** (`fallback on`, the default): after an epoch's commit each worker re-runs its",
        "  conflicting transactions that stayed on that worker one at a time in tid order against",
        "  the committed state, so a local hot-key chain commits whole in one epoch.",
        "  Transactions spanning both workers still re-run in the next epoch (about half of the",
        "  hot-key ones here, since `transfer`'s second key is on the other worker half the",
        "  time). `conflicts per txn` counts re-runs deferred to a later epoch per committed",
        "  transaction (conflicts settled in the fallback phase are not counted); `lost` counts",
        "  replies that had not arrived 30 s after the load stopped.",
        "",
        "## Zipfian 0.99, 100K keys, 1,000 offered TPS",
        "",
        zipf(rows),
        "The uniform sweeps of this run saturate lower than the previous run's (e.g. memonly",
        "5,000 vs 6,000, lsm 3,000 vs 4,000) with the same code path for them (conflicts are",
        "rare): single 12 s points on a box at load 5-7 vary by a step either way.",
        "",
        "## Saturation",
        "",
        saturation(rows),
        "## All points",
        "",
        table(rows),
    ]
    for img in images:
        md += [f"![{img}]({img})", ""]
    (HERE / "RESULTS.md").write_text("\n".join(md))
    print(f"wrote {HERE / 'RESULTS.md'} and {images}")


if __name__ == "__main__":
    main()
