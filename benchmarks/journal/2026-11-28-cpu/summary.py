"""Medians per side of ab.sh's points: p50, p99, CPU µs per committed transaction
(workers, the client = the load generator's % of a core × wall / committed, coordinator, Kafka).

    python summary.py DIR     (DIR: ab.sh's OUT)
"""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
print("| side | runs | p50 ms | p99 ms | workers µs | client µs | workers+client µs | coordinator µs | Kafka µs |")
print("|---|---|---|---|---|---|---|---|---|")
base = None
for f in sorted(out.glob("*.jsonl"), key=lambda p: ["old", "new", "uv", "gather"].index(p.stem)
                if p.stem in ("old", "new", "uv", "gather") else 9):
    pts = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    def med(fn, pts=pts):
        return statistics.median(fn(p) for p in pts)
    client = med(lambda p: p["cpu_percent"]["loadgen"] / 100 * p["wall_s"] / p["committed"] * 1e6)
    workers = med(lambda p: p["cpu_us_per_txn"]["worker"])
    both = med(lambda p: p["cpu_us_per_txn"]["worker"]
               + p["cpu_percent"]["loadgen"] / 100 * p["wall_s"] / p["committed"] * 1e6)
    if base is None:
        base = both
    print(f"| {f.stem} | {len(pts)} | {med(lambda p: p['p50_ms']):.2f} | {med(lambda p: p['p99_ms']):.1f} | "
          f"{workers:.0f} | {client:.0f} | {both:.0f} ({both / base:.2f}×) | "
          f"{med(lambda p: p['cpu_us_per_txn']['coordinator']):.0f} | {med(lambda p: p['cpu_us_per_txn']['kafka']):.0f} |")
