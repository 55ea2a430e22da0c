"""The state-store benchmark's plots (PNG files next to its README), drawn from
:func:`benchmarks.stores.report.summarize`'s summary."""

from __future__ import annotations

import os
from typing import Any

DISTS = ("uniform", "zipf")

__all__ = ["plot_all"]


_COLORS = {
    "lsm": "#1f77b4",
    "appendlog": "#2ca02c",
    "hybridlog": "#d62728",
    "memonly": "#9467bd",
    "rocksdict": "#7f7f7f",
    "plyvel": "#bcbd22",
    "lmdb": "#8c564b",
    "lmdb-nosync": "#e377c2",
}


def plot_all(summary: dict[str, Any], out: str) -> list[str]:
    """Write the PNGs that have data; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    paths = []
    for fn in (_plot_throughput, _plot_latency, _plot_reopen_memory, _plot_snapshots):
        p = fn(summary, out)
        if p:
            paths.append(p)
    return paths


def _engines_with(kv: dict[str, Any], key: str) -> list[str]:
    seen: list[str] = []
    for k, r in kv.items():
        e = k.split("/")[0]
        if key in r and e not in seen:
            seen.append(e)
    order = list(_COLORS)
    return sorted(seen, key=lambda e: order.index(e) if e in order else 99)


def _plot_throughput(summary: dict[str, Any], out: str) -> str | None:
    import matplotlib.pyplot as plt

    kv = summary["kv"]
    engines = _engines_with(kv, "put_ops_per_s")
    if not engines:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.38
    for ax, op in zip(axes, ("put", "get"), strict=True):
        for j, d in enumerate(DISTS):
            xs = [i + (j - 0.5) * width for i in range(len(engines))]
            ys = [kv.get(f"{e}/{d}", {}).get(f"{op}_ops_per_s", 0) / 1000 for e in engines]
            bars = ax.bar(xs, ys, width, label=d, color=["#4c72b0", "#dd8452"][j])
            for b, y in zip(bars, ys, strict=True):
                if y > 0:
                    ax.annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(engines)))
        ax.set_xticklabels(engines, rotation=25, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("k ops/s (log)")
        ax.set_title(f"{op} throughput (higher is better)")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_latency(summary: dict[str, Any], out: str) -> str | None:
    import matplotlib.pyplot as plt

    kv = summary["kv"]
    engines = _engines_with(kv, "put_p50_us")
    if not engines:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    width = 0.38
    for i, op in enumerate(("put", "get")):
        for j, d in enumerate(DISTS):
            ax = axes[i][j]
            xs = range(len(engines))
            p50 = [kv.get(f"{e}/{d}", {}).get(f"{op}_p50_us", 0) for e in engines]
            p99 = [kv.get(f"{e}/{d}", {}).get(f"{op}_p99_us", 0) for e in engines]
            ax.bar([x - width / 2 for x in xs], p50, width, label="p50", color="#4c72b0")
            ax.bar([x + width / 2 for x in xs], p99, width, label="p99", color="#c44e52")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(engines, rotation=25, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("µs per op (log)")
            ax.set_title(f"{op} latency, {d} (lower is better)")
            ax.grid(axis="y", which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "latency.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_reopen_memory(summary: dict[str, Any], out: str) -> str | None:
    import matplotlib.pyplot as plt

    reopen = {e: r for e, r in summary["reopen"].items() if "reopen_ms" in r}
    kv = summary["kv"]
    mem_engines = _engines_with(kv, "rss_delta_mb")
    if not reopen and not mem_engines:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    order = list(_COLORS)
    re_eng = sorted(reopen, key=lambda e: order.index(e) if e in order else 99)
    ax = axes[0]
    vals = [reopen[e]["reopen_ms"] for e in re_eng]
    bars = ax.bar(re_eng, vals, color=[_COLORS.get(e, "k") for e in re_eng])
    for b, y in zip(bars, vals, strict=True):
        ax.annotate(f"{y:.0f}" if y >= 10 else f"{y:.1f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=8)
    ax.axhline(150, color="#1f77b4", ls="--", lw=1, label="lsm target 150 ms")
    ax.axhline(500, color="#d62728", ls=":", lw=1, label="appendlog/hybridlog target 500 ms")
    ax.set_yscale("log")
    if vals:
        ax.set_ylim(top=max(max(vals), 500) * 30)  # room for the legend above the bars
    n = next(iter(reopen.values()))["n_keys"] if reopen else 0
    ax.set_title(f"reopen: open + first get at {n:,} keys (ms, log)")
    ax.tick_params(axis="x", rotation=25)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1]
    width = 0.38
    xs = range(len(re_eng))
    tot = [reopen[e]["rss_growth_pct_of_data"] for e in re_eng]
    anon = [100.0 * reopen[e].get("rss_anon_growth_mb", float("nan")) / reopen[e]["data_mb"] for e in re_eng]
    ax.bar([x - width / 2 for x in xs], tot, width, label="RSS", color="#4c72b0")
    ax.bar([x + width / 2 for x in xs], anon, width, label="anon (no file pages)", color="#8172b3")
    ax.axhline(25, color="k", ls="--", lw=1, label="lsm target 25%")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(re_eng, rotation=25, ha="right")
    ax.set_title("reopened process: memory growth, % of data size")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[2]
    width = 0.27
    xs = range(len(mem_engines))
    rss = [kv.get(f"{e}/uniform", {}).get("rss_delta_mb", 0) for e in mem_engines]
    anon_kv = [kv.get(f"{e}/uniform", {}).get("rss_anon_delta_mb", 0) for e in mem_engines]
    disk = [kv.get(f"{e}/uniform", {}).get("disk_mb", 0) for e in mem_engines]
    ax.bar([x - width for x in xs], rss, width, label="RSS Δ", color="#4c72b0")
    ax.bar(list(xs), anon_kv, width, label="anon Δ", color="#8172b3")
    ax.bar([x + width for x in xs], disk, width, label="disk after close", color="#55a868")
    data = next((r.get("data_mb") for r in kv.values() if "data_mb" in r), None)
    if data:
        ax.axhline(data, color="k", ls="--", lw=1, label=f"data {data:.1f} MB")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(mem_engines, rotation=25, ha="right")
    ax.set_title("put/get run (uniform): memory and disk, MB")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "reopen_memory.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_snapshots(summary: dict[str, Any], out: str) -> str | None:
    import matplotlib.pyplot as plt

    snaps = {e: r for e, r in summary["snapshots"].items() if not r.get("errors")}
    if not snaps:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for e, r in snaps.items():
        c = _COLORS.get(e, "k")
        gx = [g["state_bytes"] / 2**20 for g in r["grow"]]
        cum_t, cum_b, t, b = [], [], 0.0, 0.0
        for g in r["grow"]:
            t += g["snapshot_s"]
            b += g["bytes_uploaded"] / 2**20
            cum_t.append(t)
            cum_b.append(b)
        axes[0][0].plot(gx, cum_t, marker="o", ms=3, color=c, label=e)
        axes[0][1].plot(gx, cum_b, marker="o", ms=3, color=c, label=e)
        ux = list(range(1, len(r["update"]) + 1))
        cum_t, cum_b, t, b = [], [], 0.0, 0.0
        for u in r["update"]:
            t += u["snapshot_s"]
            b += u["bytes_uploaded"] / 2**20
            cum_t.append(t)
            cum_b.append(b)
        axes[1][0].plot(ux, cum_t, marker="o", ms=3, color=c, label=e)
        axes[1][1].plot(ux, cum_b, marker="o", ms=3, color=c, label=e)
    anyr = next(iter(snaps.values()))
    axes[0][0].set_title("(a) growing state: cumulative snapshot time")
    axes[0][0].set_xlabel("state size, MB of keys+values")
    axes[0][0].set_ylabel("s")
    axes[0][1].set_title("(a) growing state: cumulative bytes uploaded")
    axes[0][1].set_xlabel("state size, MB of keys+values")
    axes[0][1].set_ylabel("MB")
    axes[1][0].set_title(f"(b) update-only, {anyr['upd_frac']:.0%} of {anyr['big_keys']:,} keys per round: cumulative time")
    axes[1][0].set_xlabel("update round")
    axes[1][0].set_ylabel("s")
    axes[1][1].set_title("(b) update-only: cumulative bytes uploaded")
    axes[1][1].set_xlabel("update round")
    axes[1][1].set_ylabel("MB")
    for row in axes:
        for ax in row:
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "snapshots.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- files
