"""Where a run's slow transactions are: clusters in time, and latency by distance from the
snapshot rounds' markers.

    python benchmarks/runtime/bench.py --store lsm --seconds 30 --timeline /tmp/t.json
    python benchmarks/runtime/tails.py /tmp/t.json [more.json ...] [--slow-ms 40]

``bench.py --timeline`` writes each reply's arrival (wall clock) and latency, and the
cluster's directory (its logs stay after the point). For each timeline this prints p50/p99,
the share of transactions slower than 25 and 50 ms, the clusters of slow transactions
(sent less than 0.5 s apart; when they began, how many, the slowest), and — from the
coordinator's log, when it is still there — latency of the transactions sent in the first
400 ms after a round's marker against the rest, and when each round was published.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import re
from pathlib import Path

_ROUND = re.compile(r"(\S+ \S+),(\d+) .*snapshot round (\d+) complete.*published ([\d.]+) s after")


def _q(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def markers(coordinator_log: Path) -> tuple[list[float], list[float]]:
    """``(marker times, publish delays)`` of the complete rounds in a coordinator's log."""
    marks, delays = [], []
    for line in coordinator_log.read_text().splitlines():
        m = _ROUND.match(line)
        if m:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            marks.append(t - float(m.group(4)))
            delays.append(float(m.group(4)))
    return marks, delays


def clusters(sent_lat: list[tuple[float, float]], slow_ms: float, gap: float = 0.5) -> list[list[float]]:
    """``[start, end, count, worst]`` of runs of slow transactions sent < ``gap`` s apart."""
    out: list[list[float]] = []
    for s, lat in sorted(x for x in sent_lat if x[1] > slow_ms):
        if out and s - out[-1][1] < gap:
            out[-1][1], out[-1][2], out[-1][3] = s, out[-1][2] + 1, max(out[-1][3], lat)
        else:
            out.append([s, s, 1, lat])
    return out


def report(path: Path, slow_ms: float) -> list[str]:
    doc = json.loads(path.read_text())
    arr, lat = doc["arrivals"], doc["latencies_ms"]
    t0 = min(arr)
    sent = [(a - x / 1000, x) for a, x in zip(arr, lat, strict=True)]
    xs = sorted(lat)
    n = len(xs)
    lines = [f"{path.name}: {n} replies, p50 {_q(xs, .5):.1f} p99 {_q(xs, .99):.1f} ms, "
             f">25 ms {sum(x > 25 for x in xs) / n:.2%}, >50 ms {sum(x > 50 for x in xs) / n:.2%}"]
    big = [c for c in clusters(sent, slow_ms) if c[2] >= 5]
    lines.append(f"  clusters of >{slow_ms:g} ms (≥ 5): " + (" ".join(
        f"[{c[0] - t0:.1f}s n={c[2]} max={c[3]:.0f}]" for c in big) or "none"))
    log = Path(doc.get("cluster_dir", "")) / "coordinator.log"
    if doc.get("cluster_dir") and log.exists():
        marks, delays = markers(log)
        near, far = [], []
        for s, x in sent:
            i = bisect.bisect_right(marks, s) - 1
            if i >= 0:
                (near if s - marks[i] < 0.4 else far).append(x)
        near.sort()
        far.sort()
        delays.sort()
        lines.append(f"  {len(marks)} rounds, published p50 {_q(delays, .5):.2f} s after the marker; "
                     f"sent <400 ms after a marker: p50 {_q(near, .5):.1f} p99 {_q(near, .99):.1f} ms, "
                     f"later: p50 {_q(far, .5):.1f} p99 {_q(far, .99):.1f} ms")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timelines", nargs="+", type=Path)
    ap.add_argument("--slow-ms", type=float, default=40.0)
    args = ap.parse_args()
    for p in args.timelines:
        print("\n".join(report(p, args.slow_ms)))


if __name__ == "__main__":
    main()
