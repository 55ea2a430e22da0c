"""The pure parts of the CPU A/B harness (``cpu_ab.py``): a point's headline numbers, the
saturation rule, medians of repeats and ratios against the first side, the tables, the
progress line, the plot and the report — no cluster, no subprocess."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: a point is past saturation when its p99 is above this ...
SATURATION_P99_MS = 500.0
#: ... or it committed less than this share of the offered rate
SATURATION_COMMITTED = 0.9
#: the headline metrics: key, column title, format
METRICS = (("committed_tps", "TPS", "{:,.0f}"), ("p50_ms", "p50 ms", "{:.1f}"), ("p99_ms", "p99 ms", "{:.1f}"),
           ("cores", "cores busy", "{:.2f}"), ("cpu_us_per_txn", "CPU µs/txn", "{:,.0f}"),
           ("broker_requests_per_txn", "broker req/txn", "{:.2f}"))
#: CPU µs per committed transaction by process (``minio``: not in the total)
PARTS = ("coordinator", "workers", "kafka", "client", "rest", "minio")


def point_metrics(p: dict[str, Any]) -> dict[str, Any]:
    """A ``bench.one_point`` result's headline numbers: total CPU (coordinator, workers and
    their children, supervisor, broker, client) in cores and µs per committed transaction."""
    c = p["cpu_s"]
    roles, apart = c["roles"], c.get("apart", {})
    parts = {"coordinator": roles.get("coordinator", 0.0),
             "workers": roles.get("worker", 0.0) + roles.get("standby", 0.0),
             "kafka": roles.get("kafka", 0.0), "client": c["client"],
             "rest": c["background"] + apart.get("supervisor", 0.0)}
    total = sum(parts.values())
    parts["minio"] = apart.get("minio", 0.0)
    wall, committed = c["wall_s"], p["committed"]
    per = (lambda s: round(s * 1e6 / committed, 1)) if committed else (lambda s: None)
    return {"committed_tps": p["committed_tps"], "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"],
            "cores": round(total / wall, 3), "cpu_us_per_txn": per(total),
            "us_per_txn_by_process": {k: per(v) for k, v in parts.items()},
            "cores_by_process": {k: round(v / wall, 3) for k, v in parts.items()},
            "others_cores": round(c["others"] / wall, 3), "steal_cores": round(c["steal"] / wall, 3)}


def saturation(row: dict[str, Any]) -> str | None:
    """Why a point (or the median of a rate's points) is past saturation — p99 above
    500 ms, or less than 90% of the offered rate committed — or None."""
    p99, tps, rate = row.get("p99_ms"), row.get("committed_tps"), row["rate"]
    if p99 is None or p99 != p99 or p99 > SATURATION_P99_MS:  # (nan: no reply at all)
        return f"p99 {p99} ms > {SATURATION_P99_MS:.0f} ms"
    if tps is None or tps < SATURATION_COMMITTED * rate:
        return f"committed {tps} TPS < {SATURATION_COMMITTED:.0%} of {rate:,.0f}"
    return None


def _median(values: list[Any]) -> float | None:
    xs = [v for v in values if v is not None and v == v]
    return statistics.median(xs) if xs else None


def medians(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (side, dist, rate): the number of points and the median of each metric
    (of the points that have it), and the worst of the machine's noise."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault((p["side"], p["dist"], p["rate"]), []).append(p)
    rows = []
    for (side, dist, rate), ps in groups.items():
        row: dict[str, Any] = {"side": side, "dist": dist, "rate": rate, "n": len(ps)}
        for key, _, _ in METRICS:
            row[key] = _median([p.get(key) for p in ps])
        row["us_per_txn_by_process"] = {k: _median([p.get("us_per_txn_by_process", {}).get(k) for p in ps])
                                        for k in PARTS}
        row["loadavg_max"] = max(p.get("loadavg_before", 0.0) for p in ps)
        row["others_cores_max"] = max(p.get("others_cores", 0.0) for p in ps)
        rows.append(row)
    return rows


def ratios(rows: Sequence[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    """Per (dist, rate) and side other than ``base``: each metric's median over ``base``'s."""
    by = {(r["side"], r["dist"], r["rate"]): r for r in rows}
    out = []
    for r in rows:
        b = by.get((base, r["dist"], r["rate"]))
        if r["side"] == base or b is None:
            continue
        out.append({"side": f"{r['side']}/{base}", "dist": r["dist"], "rate": r["rate"],
                    **{k: (round(r[k] / b[k], 3) if r[k] is not None and b[k] else None) for k, _, _ in METRICS}})
    return out


def _cell(value: Any, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def table(rows: Sequence[dict[str, Any]], sides: Sequence[str], curve: bool = False) -> str:
    """The medians, each (dist, rate) followed by its ratios to the first side; a curve's
    rows past saturation are marked."""
    order = {s: i for i, s in enumerate(sides)}
    rows = sorted(rows, key=lambda r: (r["dist"], r["rate"], order.get(r["side"], len(order))))
    ratio = {(r["dist"], r["rate"], r["side"]): r for r in ratios(rows, sides[0])} if len(sides) > 1 else {}
    head = ["dist", "offered", "side", "n", *(t for _, t, _ in METRICS), "load before", "others' cores"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mark = f" (saturated: {why})" if curve and (why := saturation(r)) else ""
        cells = [r["dist"], f"{r['rate']:,.0f}", r["side"] + mark, str(r["n"]),
                 *(_cell(r[k], f) for k, _, f in METRICS), f"{r['loadavg_max']:.1f}", f"{r['others_cores_max']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
        q = ratio.get((r["dist"], r["rate"], f"{r['side']}/{sides[0]}"))
        if q and not curve:
            lines.append("| " + " | ".join(["", "", f"**{q['side']}**", "",
                                            *(_cell(q[k], "{:.2f}×") for k, _, _ in METRICS), "", ""]) + " |")
    return "\n".join(lines)


def parts_table(rows: Sequence[dict[str, Any]], sides: Sequence[str]) -> str:
    """CPU µs per committed transaction by process (medians)."""
    order = {s: i for i, s in enumerate(sides)}
    lines = ["| dist | offered | side | " + " | ".join(PARTS) + " (apart) |", "|" + "---|" * (3 + len(PARTS))]
    for r in sorted(rows, key=lambda r: (r["dist"], r["rate"], order.get(r["side"], len(order)))):
        parts = r["us_per_txn_by_process"]
        lines.append(f"| {r['dist']} | {r['rate']:,.0f} | {r['side']} | "
                     + " | ".join(_cell(parts.get(k), "{:,.0f}") for k in PARTS) + " |")
    return "\n".join(lines)


def ab_schedule(sides: Sequence[str], points: Sequence[tuple[float, str]], pairs: int) -> list[tuple[int, str, float, str]]:
    """(pair, side, rate, dist) in run order: every pair runs every point once per side,
    the sides back to back, their order turning from one pair (and point) to the next."""
    out = []
    for i in range(pairs):
        for j, (rate, dist) in enumerate(points):
            k = (i + j) % len(sides)
            out += [(i, side, rate, dist) for side in [*sides[k:], *sides[:k]]]
    return out


# ---------------------------------------------------------------- one point (in the ref's worktree)


def progress(p: dict[str, Any], label: str) -> str:
    """One line per point: what it measured and the machine's state around it."""
    req = p.get("broker_requests_per_txn")
    return (f"{label} {p['rate']:,.0f} TPS {p['dist']} pair {p['pair'] + 1}: {p['committed_tps']:,.0f} TPS, "
            f"p50/p99 {p['p50_ms']:.1f}/{p['p99_ms']:.1f} ms, {p['cores']:.2f} cores, "
            f"{_cell(p['cpu_us_per_txn'], '{:,.0f}')} µs/txn, {_cell(req, '{:.2f}')} broker req/txn | "
            f"load before {p['loadavg_before']:.1f}, others {p['others_cores']:.2f} cores, "
            f"steal {p['steal_cores']:.2f}, loop {p.get('loop_ms', 0):.0f} ms")


def plot(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """CPU µs per committed transaction and cores busy against the offered load, one line
    per side (a line style per distribution)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = ["-", "--", ":"]
    dists = sorted({r["dist"] for r in rows})
    for side in dict.fromkeys(r["side"] for r in rows):
        for d in dists:
            rs = sorted((r for r in rows if r["side"] == side and r["dist"] == d), key=lambda r: r["rate"])
            label = f"{side} {d}" if len(dists) > 1 else side
            style = styles[dists.index(d) % len(styles)]
            for ax, key in ((ax1, "cpu_us_per_txn"), (ax2, "cores")):
                line = ax.plot([r["rate"] for r in rs], [r[key] for r in rs], style, marker="o", label=label)
                past = [r for r in rs if saturation(r)]  # (crossed out: past saturation)
                ax.plot([r["rate"] for r in past], [r[key] for r in past], "x", color=line[0].get_color(),
                        markersize=12)
    for ax, ylabel in ((ax1, "total CPU µs per committed transaction"), (ax2, "cores busy (total)")):
        ax.set_xscale("log")
        ax.set_xlabel("offered TPS")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    ax2.set_ylim(bottom=0)
    fig.suptitle(f"{title} (x: past saturation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(points: list[dict[str, Any]], sides: list[str], curve: bool) -> str:
    rows = medians(points)
    text = table(rows, sides, curve) + "\n\nCPU µs per committed transaction by process (medians; minio not in the total):\n\n"
    text += parts_table(rows, sides)
    if curve:
        for side in sides:
            for dist in sorted({r["dist"] for r in rows}):
                ok = [r["rate"] for r in rows if r["side"] == side and r["dist"] == dist and not saturation(r)]
                past = [r["rate"] for r in rows if r["side"] == side and r["dist"] == dist and saturation(r)]
                end = f"first past it: {min(past):,.0f}" if past else "not reached"
                text += f"\n{side} {dist}: saturation ≥ {max(ok, default=0):,.0f} TPS ({end})"
    return text
