"""Medians per side and point of ab.sh's output: python summary.py DIR"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def med(ds: list[dict], k: str) -> float:
    return statistics.median(d[k] for d in ds)


def each(ds: list[dict], k: str) -> str:
    return "/".join(f"{d[k]:g}" for d in ds)


rows = defaultdict(list)
for f in sorted(Path(sys.argv[1]).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        d = json.loads(line)
        rows[(d["dist"], d["offered_tps"], f.stem)].append(d)
print("| point | side | runs | committed/s | p50 ms | p99 ms | re-runs/txn | worker µs/txn |")
print("|---|---|---|---|---|---|---|---|")
for (dist, rate, side), ds in sorted(rows.items()):
    cpu = statistics.median(d["cpu_us_per_txn"].get("worker", 0) for d in ds)
    print(f"| {dist} {rate:g} | {side} | {len(ds)} | {med(ds, 'committed_tps'):,.0f} "
          f"| {med(ds, 'p50_ms'):g} ({each(ds, 'p50_ms')}) | {med(ds, 'p99_ms'):g} ({each(ds, 'p99_ms')}) "
          f"| {med(ds, 'conflict_reruns_per_txn'):.3f} | {cpu:.0f} |")
