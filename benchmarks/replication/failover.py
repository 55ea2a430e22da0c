"""Failover of a lost machine, with and without a standby, in one run.

YCSB-T at 1,000 TPS on 2 workers (``examples.ycsbt``, 1M keys preloaded, snapshot rounds
every second); ``--kill-at`` seconds in, one worker's store directories are deleted and
the worker is SIGKILLed — a lost machine. With ``--standbys 1`` the coordinator promotes
that worker's standby, which restores the round from the files it followed; without, the
restarted worker must download the partitions' whole state from MinIO. Reported: the
longest pause between replies, the recovery's phases, and the files downloaded.

    python -m benchmarks.replication.failover              # 3 repeats × (standby, none)
    python -m benchmarks.replication.failover --repeats 1 --keys 100000 --no-readme   # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.readme import publish
from benchmarks.runtime import bench

ROOT = Path(__file__).resolve().parents[2]


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| standby | repeats | longest reply gap s (median; each) | recovery s | restore s | files downloaded / restored | p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for sb in (1, 0):
        rs = [r for r in rows if r["standbys"] == sb and "recovery" in r]
        if not rs:
            continue
        rec = [r["recovery"] for r in rs]
        def med(k: str, rec: list[dict[str, Any]] = rec) -> float:
            return statistics.median(x.get(k, float("nan")) for x in rec)

        gaps = ", ".join(str(x["longest_gap_s"]) for x in rec)
        files = ", ".join(f"{x.get('files_downloaded', '?')}/{x.get('files_restored', '?')}" for x in rec)
        lines.append(f"| {'yes' if sb else 'no'} | {len(rs)} | **{med('longest_gap_s'):.2f}** ({gaps}) | {med('recovery_s'):.2f} "
                     f"| {med('restore_s'):.2f} | {files} | {statistics.median(r['p99_ms'] for r in rs):.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--store", default="lsm")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--kill-at", dest="kill_at", type=float, default=12.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / time.strftime("%Y-%m-%d-failover"))
    ap.add_argument("--no-readme", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for rep in range(1, a.repeats + 1):
        for sb in (1, 0):
            print(f"[{time.monotonic() - t0:.0f} s] repeat {rep}: standbys={sb}, {a.keys:,} keys, lose a machine at "
                  f"{a.kill_at} s", file=sys.stderr, flush=True)
            args = bench.parser().parse_args([
                "--store", a.store, "--keys", str(a.keys), "--preload", "--rates", "1000", "--seconds", str(a.seconds),
                "--kill-at", str(a.kill_at), "--lose-machine", "--standbys", str(sb), "--label", f"r{rep}",
                "--out", str(a.out / "failover.jsonl"),
            ])
            rows += bench.run(args)
    text = report(rows)
    print(text)
    if a.no_readme:
        (a.out / "REPORT.md").write_text(text + "\n")
    else:
        publish("failover", "Replication: failover of a lost machine", text, a.out,
                "python -m benchmarks.replication.failover", "failover.jsonl")


if __name__ == "__main__":
    main()
