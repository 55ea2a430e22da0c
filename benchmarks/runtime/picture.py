"""The runtime's whole picture in one command: every engine at the fixed 1,000 TPS point
(10K and 100K keys uniform, 100K keys Zipf 0.99) and the sweep to saturation (10K keys
uniform), with snapshot rounds every second and the epoch log on, repeated; then the
report (medians of the repeats against the targets, CPU per process and per transaction,
the sweep and the latency-distribution plots).

    python benchmarks/runtime/picture.py                       # 3 repeats, all engines (~35 min)
    python benchmarks/runtime/picture.py --repeats 1 --engines memonly --seconds 5   # a smoke run
    python benchmarks/runtime/picture.py --report-only --out DIR   # re-render DIR's report

Needs Kafka and MinIO (``sfaas services up``). Points run in the order repeat → engine →
point, so a noisy minute of the shared machine spreads over engines instead of one engine's
repeats. Raw points go to ``DIR/runtime.jsonl``; the report to ``DIR/REPORT.md`` and,
between its markers, to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import hot_account  # noqa: E402
import report as runtime_report  # noqa: E402

from benchmarks.readme import publish  # noqa: E402

ENGINES = ("memonly", "hybridlog", "lsm", "appendlog")
#: (keys, distribution) of the fixed 1,000 TPS points
FIXED = ((10_000, "uniform"), (100_000, "uniform"), (100_000, "zipf"), (10_000, "zipf"), (10_000, "zipf0.999"))
SWEEP_RATES = "4000,7000,9500,11000,13000"
#: offered rates of the Zipf 0.99 sweep (10K keys; the contention issue's saturation target)
ZIPF_SWEEP_RATES = "2000,4000,6000,8000"

#: The issue's targets: (what, engines, check on the medians, threshold text)
FAST = ("memonly", "hybridlog")


def _bench_args(**kw: object) -> argparse.Namespace:
    args = bench.parser().parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def measure(out: Path, repeats: int, engines: list[str], seconds: float, sweep_seconds: float, rates: str) -> None:
    raw = out / "runtime.jsonl"
    total = repeats * (len(engines) * (len(FIXED) + 2) + 1)
    done = 0
    t0 = time.monotonic()
    for rep in range(1, repeats + 1):
        for engine in engines:
            for keys, dist in FIXED:
                done += 1
                print(f"[{done}/{total}, {time.monotonic() - t0:.0f} s] repeat {rep}: {engine} {keys} keys {dist} "
                      "at 1,000 TPS", file=sys.stderr, flush=True)
                bench.run(_bench_args(store=engine, keys=keys, dist=dist, rates="1000", seconds=seconds,
                                      snapshot_interval=1.0, label=f"r{rep}", out=str(raw)))
            done += 1
            print(f"[{done}/{total}, {time.monotonic() - t0:.0f} s] repeat {rep}: {engine} sweep {rates}",
                  file=sys.stderr, flush=True)
            bench.run(_bench_args(store=engine, keys=10_000, dist="uniform", rates=rates, sweep=True,
                                  seconds=sweep_seconds, snapshot_interval=1.0, label=f"r{rep}", out=str(raw)))
            done += 1
            print(f"[{done}/{total}, {time.monotonic() - t0:.0f} s] repeat {rep}: {engine} Zipf 0.99 sweep "
                  f"{ZIPF_SWEEP_RATES}", file=sys.stderr, flush=True)
            bench.run(_bench_args(store=engine, keys=10_000, dist="zipf", rates=ZIPF_SWEEP_RATES, sweep=True,
                                  seconds=sweep_seconds, snapshot_interval=1.0, label=f"r{rep}", out=str(raw)))
        done += 1
        print(f"[{done}/{total}, {time.monotonic() - t0:.0f} s] repeat {rep}: one hot account", file=sys.stderr,
              flush=True)
        hot_account.main(["--label", f"r{rep}", "--out", str(out / "hot_account.jsonl")])


def _machine(rows: list[dict]) -> str:
    """The machine's state over the run (``bench.machine_probe``; older points lack it)."""
    text = ""
    for field, what, unit in (("wakeup_us", "a thread-to-thread TCP round trip across two CPUs", "µs"),
                              ("loop_ms", "a fixed Python loop", "ms")):
        xs = [r[field] for r in rows if field in r]
        if xs:
            text += f"{what} {min(xs):.0f}–{max(xs):.0f} {unit} (median {_median(xs):.0f}); "
    return f"Before each point, {text[:-2]}. " if text else ""


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _fmt(xs: list[float], digits: int = 1) -> str:
    """'median (each run)'."""
    if not xs:
        return "–"
    each = ", ".join(f"{x:.{digits}f}" for x in xs)
    return f"**{_median(xs):.{digits}f}** ({each})"


def _sweep_points(sweeps: dict[tuple, list[dict]], engine: str) -> str:
    """``engine``'s sweeps as "offered → committed/p99" per point, repeats apart by ";"."""
    return "; ".join(
        " ".join(f"{p['offered_tps'] / 1000:g}K→{p['committed_tps'] / 1000:.1f}K/{p['p99_ms']:.0f}ms"
                 for p in sorted(ps, key=lambda p: p["offered_tps"]))
        for (s, _), ps in sorted(sweeps.items()) if s == engine)


def saturation(points: list[dict]) -> float:
    """The highest committed TPS of a sweep at a point whose p99 stayed ≤ 500 ms."""
    ok = [p["committed_tps"] for p in points if p["p99_ms"] <= 500]
    return max(ok, default=0.0)


def report(rows: list[dict], out: Path) -> str:
    fixed: dict[tuple, list[dict]] = defaultdict(list)
    sweeps: dict[tuple, list[dict]] = defaultdict(list)
    zipf_sweeps: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("phase") == "fixed" and r.get("offered_tps") == 1000:
            fixed[(r["store"], r["keys"], r["dist"])].append(r)
        elif r.get("phase") == "sweep" and r.get("dist", "uniform") == "uniform":
            sweeps[(r["store"], r.get("label", ""))].append(r)
        elif r.get("phase") == "sweep" and r.get("dist") == "zipf":
            zipf_sweeps[(r["store"], r.get("label", ""))].append(r)
    engines = [e for e in ENGINES if any(k[0] == e for k in fixed) or any(k[0] == e for k in sweeps)]
    sat = {e: [saturation(pts) for (s, _), pts in sorted(sweeps.items()) if s == e] for e in engines}
    zsat = {e: [saturation(pts) for (s, _), pts in sorted(zipf_sweeps.items()) if s == e] for e in engines}

    def col(e: str, keys: int, dist: str, field: str) -> list[float]:
        return [r[field] for r in fixed.get((e, keys, dist), [])]

    def cpu(e: str, role: str) -> list[float]:
        return [r["cpu_us_per_txn"].get(role, 0) for r in fixed.get((e, 10_000, "uniform"), [])]

    lines = [f"Runs: {len(rows)} points, {min((r['time'] for r in rows), default='')} – "
             f"{max((r['time'] for r in rows), default='')} UTC; load average before each point "
             f"{min((r.get('loadavg', 0) for r in rows), default=0)}–{max((r.get('loadavg', 0) for r in rows), default=0)}. "
             f"{_machine(rows)}Snapshot rounds every 1 s, epoch log on. Each cell: **median** (each repeat).", ""]
    lines += ["### Targets (medians of the repeats)", "",
              "| target | engine | measured | met? |", "|---|---|---|---|"]

    def target(what: str, e: str, xs: list[float], limit: float, above: bool = False, unit: str = "ms") -> None:
        if not xs:
            return
        m = _median(xs)
        ok = m >= limit if above else m <= limit
        lines.append(f"| {what} | {e} | {m:,.1f} {unit} | {'yes' if ok else '**no**'} |")

    for e in engines:
        for keys in (10_000, 100_000):
            target(f"1,000 TPS {keys // 1000}K uniform p50 ≤ 5 ms", e, col(e, keys, "uniform", "p50_ms"), 5)
            target(f"1,000 TPS {keys // 1000}K uniform p99 ≤ {15 if e in FAST else 25} ms", e,
                   col(e, keys, "uniform", "p99_ms"), 15 if e in FAST else 25)
        target(f"saturation 10K uniform ≥ {9500 if e in FAST else 7000:,} TPS", e, sat[e],
               9500 if e in FAST else 7000, above=True, unit="TPS")
        target("Zipf 0.99 100K, 1,000 TPS: p99 ≤ 50 ms", e, col(e, 100_000, "zipf", "p99_ms"), 50)
        target("broker CPU ≤ 150 µs per txn at 1,000 TPS (10K uniform)", e, cpu(e, "kafka"), 150, unit="µs")
        # the contention issue's
        target("Zipf 0.99 10K, 1,000 TPS: p99 ≤ 150 ms", e, col(e, 10_000, "zipf", "p99_ms"), 150)
        reruns = [r.get("conflict_reruns_per_txn") for r in fixed.get((e, 10_000, "zipf"), [])]
        reruns = [x for x in reruns if x is not None]
        target("Zipf 0.99 10K, 1,000 TPS: re-runs per txn ≤ 0.5", e, reruns, 0.5, unit="")
        target("Zipf 0.999 10K, 1,000 TPS: p99 ≤ 1,000 ms", e, col(e, 10_000, "zipf0.999", "p99_ms"), 1000)
        target("saturation 10K Zipf 0.99 ≥ 4,000 TPS", e, zsat[e], 4000, above=True, unit="TPS")
    lines += ["", "### 1,000 TPS: latency (ms)", "",
              "| engine | keys | dist | p50 | p95 | p99 | committed TPS | re-runs per txn |",
              "|---|---|---|---|---|---|---|---|"]
    for e in engines:
        for keys, dist in FIXED:
            if (e, keys, dist) in fixed:
                rr = [x for r in fixed[(e, keys, dist)] if (x := r.get("conflict_reruns_per_txn")) is not None]
                lines.append(f"| {e} | {keys:,} | {dist} | {_fmt(col(e, keys, dist, 'p50_ms'))} "
                             f"| {_fmt(col(e, keys, dist, 'p95_ms'))} | {_fmt(col(e, keys, dist, 'p99_ms'))} "
                             f"| {_fmt(col(e, keys, dist, 'committed_tps'), 0)} | {_fmt(rr, 3) if rr else '–'} |")
    lines += ["", "### CPU at 1,000 TPS (10K uniform): µs per committed transaction, summed over a role's processes", "",
              "| engine | coordinator | workers | Kafka broker | load generator (% of a core) |", "|---|---|---|---|---|"]
    for e in engines:
        gen = [r["cpu_percent"].get("loadgen", 0) for r in fixed.get((e, 10_000, "uniform"), [])]
        lines.append(f"| {e} | {_fmt(cpu(e, 'coordinator'), 0)} | {_fmt(cpu(e, 'worker'), 0)} "
                     f"| {_fmt(cpu(e, 'kafka'), 0)} | {_fmt(gen, 0)} |")
    lines += ["", "### Saturation (10K uniform): highest committed TPS with p99 ≤ 500 ms", "",
              "| engine | saturation TPS | sweep points (offered → committed, p99) |", "|---|---|---|"]
    for e in engines:
        lines.append(f"| {e} | {_fmt(sat[e], 0)} | {_sweep_points(sweeps, e)} |")
    zrows = [f"| {e} | {_fmt(zsat[e], 0)} | {_sweep_points(zipf_sweeps, e)} |" for e in engines if zsat[e]]
    if zrows:
        lines += ["", "### Saturation (10K Zipf 0.99): highest committed TPS with p99 ≤ 500 ms", "",
                  "| engine | saturation TPS | sweep points (offered → committed, p99) |", "|---|---|---|", *zrows]
    hot = [json.loads(x) for x in (out / "hot_account.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "hot_account.jsonl").exists() else []
    if hot:
        per_s = [h["committed_per_s"] for h in hot]
        ok = _median(per_s) >= 1500 and all(h["exact"] for h in hot)
        lines += ["", "### One hot account (memonly): 3,000 concurrent transfers out of it into 200 others", "",
                  f"Committed per second: {_fmt(per_s, 0)}; exact in {sum(h['exact'] for h in hot)} of {len(hot)} "
                  f"runs. Target ≥ 1,500 committed/s, exact: {'yes' if ok else '**no**'}."]
    lines += ["", "![sweep](" + _plot_sweep(sweeps, engines, out) + ")",
              "![latency distribution](" + _plot_cdf(fixed, engines, out) + ")", ""]
    return "\n".join(lines)


def _plot_sweep(sweeps: dict[tuple, list[dict]], engines: list[str], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, e in enumerate(engines):
        for j, ((s, _), pts) in enumerate(sorted(sweeps.items())):
            if s != e:
                continue
            pts = sorted(pts, key=lambda p: p["offered_tps"])
            kw = {"color": f"C{i}", "alpha": 0.8, "label": e if j == 0 or s != e else None}
            a1.plot([p["offered_tps"] for p in pts], [p["committed_tps"] for p in pts], "o-", **kw)
            a2.plot([p["offered_tps"] for p in pts], [p["p99_ms"] for p in pts], "o-", **kw)
    handles = {}
    for line in a1.get_lines():
        if line.get_label() and not line.get_label().startswith("_"):
            handles.setdefault(line.get_label(), line)
    a1.legend(handles.values(), handles.keys(), fontsize=8)
    runtime_report.sweep_axes(a1, a2)
    fig.suptitle("YCSB-T 10K keys uniform, 2 workers, rounds every 1 s + epoch log (every repeat)")
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=100)
    plt.close(fig)
    return "sweep.png"


def _plot_cdf(fixed: dict[tuple, list[dict]], engines: list[str], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIXED), figsize=(4.4 * len(FIXED), 4), sharey=True)
    for ax, (keys, dist) in zip(axes, FIXED, strict=True):
        for i, e in enumerate(engines):
            runs = [r["quantiles_ms"] for r in fixed.get((e, keys, dist), []) if r.get("quantiles_ms")]
            if not runs:
                continue
            qs = sorted(runs[0], key=float)
            med = [_median([run[q] for run in runs if q in run]) for q in qs]
            ax.plot(med, [100 * float(q) for q in qs], "o-", ms=3, color=f"C{i}", label=e)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log)")
        ax.set_title(f"{keys // 1000}K keys {dist}, 1,000 TPS")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("percentile")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
            break
    fig.suptitle("Latency distribution (median over the repeats of each percentile)")
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=100)
    plt.close(fig)
    return "latency_cdf.png"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    # 30 s: each point holds one of the coordinator's garbage collections (GC_PERIOD), as
    # every 30 s of a long run does; a 15 s point would hold none and flatter p99
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each 1,000 TPS point")
    ap.add_argument("--sweep-seconds", dest="sweep_seconds", type=float, default=10.0)
    ap.add_argument("--rates", default=SWEEP_RATES, help="offered rates of the sweep (it stops at p99 > 500 ms)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / time.strftime("%Y-%m-%d-runtime")))
    ap.add_argument("--report-only", dest="report_only", action="store_true")
    ap.add_argument("--no-readme", dest="no_readme", action="store_true", help="write DIR/REPORT.md only")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        measure(out, args.repeats, args.engines, args.seconds, args.sweep_seconds, args.rates)
    rows = [json.loads(x) for x in (out / "runtime.jsonl").read_text().splitlines() if x.strip()]
    text = report(rows, out)
    if args.no_readme:
        (out / "REPORT.md").write_text(text + "\n")
    else:
        publish("runtime-picture", "Runtime: the whole picture (latency issue)", text, out,
                "python benchmarks/runtime/picture.py" + "".join(f" {a}" for a in sys.argv[1:] if a != "--report-only"),
                "runtime.jsonl", images=("sweep.png", "latency_cdf.png"))
    print(text)


if __name__ == "__main__":
    main()
