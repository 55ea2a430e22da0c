"""The cost curves' plots, from the points ``benchmarks.scale.state`` and
``benchmarks.scale.cluster`` wrote (JSON lines):

    python -m benchmarks.scale.plot --state S.jsonl --cluster C.jsonl [--cluster C2.jsonl] --out DIR

writes ``DIR/state.png`` (one store: preload, round upload against bytes changed, reads,
memory, restore — by key count; a value-size panel when the points have several value
sizes) and ``DIR/cluster.png`` (the cluster: p50 / p99 at 1,000 TPS, the reply gap of a
worker killed without and with a standby, a rescale's pause — by key count; by workers
with the capacity model when there are ``workers`` points). A file left out is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def load(path: Path) -> list[Row]:
    """The points of ``path``."""
    if not path.exists():
        raise SystemExit(f"{path}: no such file (expected JSON lines of benchmarks.scale)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not JSON ({exc})") from None
    return rows


def _latest(rows: Iterable[Row], key: Any) -> dict[Any, Row]:
    """The last row per ``key(row)`` (a rerun replaces an earlier point)."""
    out: dict[Any, Row] = {}
    for r in rows:
        out[key(r)] = r
    return out


def plot_state(rows: list[Row], out: Path) -> Path | None:
    """One store's curve by key count (value size 100 B), and by value size if measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_keys = sorted(_latest((r for r in rows if r["value_bytes"] == 100),
                             lambda r: (r["engine"], r["keys"])).values(), key=lambda r: r["keys"])
    by_value = sorted(_latest((r for r in rows if r["value_bytes"] != 100),
                              lambda r: (r["engine"], r["value_bytes"])).values(),
                      key=lambda r: r["value_bytes"])
    if not by_keys and not by_value:
        return None
    panels = 4 if by_keys else 0
    panels += 1 if by_value else 0
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    ax = list(axes[0])
    if by_keys:
        k = [r["keys"] for r in by_keys]
        ax[0].loglog(k, [r["preload_s"] for r in by_keys], "o-", label="preload")
        ax[0].loglog(k, [r["first_round_s"] for r in by_keys], "s-", label="first round")
        ax[0].loglog(k, [max(r["restore_s"], 1e-3) for r in by_keys], "^-", label="restore (empty dir)")
        ax[0].set(title="seconds", xlabel="keys")
        ax[0].legend(fontsize=7)
        ax[1].semilogx(k, [r["round_over_changed"] for r in by_keys], "o-")
        ax[1].axhline(2.0, color="r", ls="--", lw=1, label="target ≤ 2×")
        ax[1].set(title="round upload / bytes changed (1%)", xlabel="keys", ylim=(0, 2.5))
        ax[1].legend(fontsize=7)
        ax[2].loglog(k, [r["get_p50_us"] for r in by_keys], "o-", label="p50")
        ax[2].loglog(k, [r["get_p99_us"] for r in by_keys], "s-", label="p99")
        ax[2].set(title="point read (µs)", xlabel="keys")
        ax[2].legend(fontsize=7)
        ax[3].loglog(k, [r["rss_mb"] for r in by_keys], "o-", label="RSS")
        ax[3].loglog(k, [r["disk_mb"] for r in by_keys], "s-", label="disk")
        ax[3].set(title="MB", xlabel="keys")
        ax[3].legend(fontsize=7)
    if by_value:
        a = ax[-1]
        v = [r["value_bytes"] for r in by_value]
        a.loglog(v, [r["round_mb"] / max(r["changed_mb"], 1e-9) for r in by_value], "o-",
                 label="round / changed")
        a.loglog(v, [r["get_p99_us"] for r in by_value], "s-", label="read p99 (µs)")
        a.loglog(v, [r["preload_keys_per_s"] for r in by_value], "^-", label="preload keys/s")
        a.set(title="by value size", xlabel="value bytes")
        a.legend(fontsize=7)
    engines = sorted({r["engine"] for r in by_keys + by_value})
    fig.suptitle(f"one store ({', '.join(engines)}): cost by state size", fontsize=10)
    fig.tight_layout()
    path = out / "state.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cluster(rows: list[Row], out: Path) -> Path | None:
    """The cluster's curve by key count (and by workers, with the model)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [r for r in rows if r.get("curve") == "keys"]
    workers = [r for r in rows if r.get("curve") == "workers"]
    if not keys and not workers:
        return None
    panels = (3 if keys else 0) + (1 if workers else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    ax = list(axes[0])
    if keys:
        fixed = sorted(_latest((r for r in keys if r.get("point") == "1000 TPS"),
                               lambda r: r["keys"]).values(), key=lambda r: r["keys"])
        ax[0].semilogx([r["keys"] for r in fixed], [r["p50_ms"] for r in fixed], "o-", label="p50")
        ax[0].semilogx([r["keys"] for r in fixed], [r["p99_ms"] for r in fixed], "s-", label="p99")
        ax[0].set(title="1,000 TPS: latency (ms)", xlabel="keys")
        ax[0].legend(fontsize=7)
        for point, mark in (("worker killed", "o-"), ("worker killed, standby", "s-")):
            pts = sorted(_latest((r for r in keys if r.get("point") == point and "recovery" in r),
                                 lambda r: r["keys"]).values(), key=lambda r: r["keys"])
            ax[1].semilogx([r["keys"] for r in pts], [r["recovery"]["longest_gap_s"] for r in pts],
                           mark, label=point)
        ax[1].axhline(1.0, color="r", ls="--", lw=1, label="standby target ≤ 1 s")
        ax[1].set(title="reply gap after a kill (s)", xlabel="keys")
        ax[1].legend(fontsize=7)
        pts = sorted(_latest((r for r in keys if r.get("rescales")), lambda r: r["keys"]).values(),
                     key=lambda r: r["keys"])
        ax[2].semilogx([r["keys"] for r in pts], [r["rescales"][0]["longest_gap_s"] for r in pts], "o-",
                       label="longest reply gap (s)")
        ax[2].semilogx([r["keys"] for r in pts], [r["rescales"][0]["rescale_s"] for r in pts], "s-",
                       label="rescale (s)")
        ax[2].set(title="rescale 2 → 3 workers", xlabel="keys")
        ax[2].legend(fontsize=7)
    if workers:
        a = ax[-1]
        fixed = sorted(_latest((r for r in workers if r.get("point") == "1000 TPS"),
                               lambda r: r["workers"]).values(), key=lambda r: r["workers"])
        model = sorted(_latest((r for r in workers if r.get("point") == "model"),
                               lambda r: r["workers"]).values(), key=lambda r: r["workers"])
        sat = sorted(_latest((r for r in workers if r.get("point") == "saturation"),
                             lambda r: r["workers"]).values(), key=lambda r: r["workers"])
        if sat:
            a.plot([r["workers"] for r in sat], [r["saturation_tps"] for r in sat], "o-",
                   label="measured saturation (this machine)")
        if model:
            a.plot([r["workers"] for r in model], [r["n_machines_tps"] for r in model], "s--",
                   label="model: a machine per worker")
        a.set(title="TPS by workers", xlabel="workers")
        a.legend(fontsize=7)
        if fixed and not sat and not model:
            a.plot([r["workers"] for r in fixed], [r["p99_ms"] for r in fixed], "o-")
    fig.suptitle("the cluster (2 workers unless by workers; lsm; 1,000 TPS)", fontsize=10)
    fig.tight_layout()
    path = out / "cluster.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cluster_table(rows: list[Row]) -> str:
    """The keys curve as a markdown table (the last point of each kind per key count)."""
    keys = [r for r in rows if r.get("curve") == "keys" and "point" in r]
    last = _latest(keys, lambda r: (r["keys"], r["point"]))
    out = ["| keys | first round | 1,000 TPS p50 / p99 ms | CPU µs/txn: workers, Kafka, stores' background "
           "| worker killed: gap s (detect, restore, replay) | with a standby: gap s (downloads) "
           "| rescale 2 → 3: gap s, MB moved |",
           "|---|---|---|---|---|---|---|"]
    for k in sorted({r["keys"] for r in keys}):
        fixed = last.get((k, "1000 TPS"))
        kill = (last.get((k, "worker killed")) or {}).get("recovery", {})
        sb = (last.get((k, "worker killed, standby")) or {}).get("recovery", {})
        resc = ((last.get((k, "rescale 2 → 3")) or {}).get("rescales") or [{}])[0]
        first = (fixed or {}).get("first_round") or {}
        cpu = (fixed or {}).get("cpu_us_per_txn", {})

        def gap(r: Row) -> str:
            if not r.get("recovery_s"):
                return f"**never recovered** (gap {r.get('longest_gap_s', '–')})" if r else "–"
            return (f"{r['longest_gap_s']} ({r['detect_restart_s']}, {r['restore_s']}, {r['replay_s']})")

        standby = (f"{sb['longest_gap_s']} ({sb.get('files_downloaded', 0)})" if sb.get("recovery_s")
                   else gap(sb))
        moved = f"{resc['longest_gap_s']}, {resc['bytes_shipped'] / 1e6:.1f}" if resc else "–"
        latency = f"{fixed['p50_ms']} / {fixed['p99_ms']}" if fixed else "–"
        out.append(f"| {k:,} | {first.get('mb', '–')} MB in {first.get('waited_s', '–')} s | {latency} "
                   f"| {cpu.get('worker', '–')}, {cpu.get('kafka', '–')}, {cpu.get('background', '–')} "
                   f"| {gap(kill)} | {standby} | {moved} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", type=Path, action="append", default=[],
                    help="benchmarks.scale.state's points (repeatable; a later file's point replaces an earlier one's)")
    ap.add_argument("--cluster", type=Path, action="append", default=[],
                    help="benchmarks.scale.cluster's points (repeatable, likewise)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the PNGs")
    a = ap.parse_args(argv)
    if not a.state and not a.cluster:
        raise SystemExit("give --state and/or --cluster")
    a.out.mkdir(parents=True, exist_ok=True)
    state = [r for f in a.state for r in load(f)]
    clusters = [r for f in a.cluster for r in load(f)]
    for path in (plot_state(state, a.out), plot_cluster(clusters, a.out)):
        if path is not None:
            print(path)
    if clusters:
        print(cluster_table(clusters))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
