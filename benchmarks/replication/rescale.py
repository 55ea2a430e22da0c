"""Rescaling 2 → 3 → 2 workers under load, partitions moved by shipping their stores.

YCSB-T at 1,000 TPS on 2 workers (``examples.ycsbt``, 1M keys preloaded, snapshot rounds
every second); ``--up-at`` seconds in ``sfaas scale --workers 3``, ``--down-at`` seconds in
``sfaas scale --workers 2``. Each moving partition's stores are followed by the receiving
worker from the shipped run files, then taken over at an epoch boundary after a snapshot
round. Reported per rescale: the longest pause between replies while it ran, how long the
epochs paused for the switch, the partitions moved, and the bytes shipped against the
bytes of the moved stores' files (≈ 1: only the moved state travels) and downloaded.

    python -m benchmarks.replication.rescale              # 3 repeats
    python -m benchmarks.replication.rescale --repeats 1 --keys 100000 --no-readme   # quick
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.replication import cluster_args, finish, run_points


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| rescale | repeats | longest reply gap s (median; each) | epochs paused s | whole rescale s "
             "| partitions moved | MB shipped / MB of moved stores (ratio) | MB downloaded | p99 ms of the run |",
             "|---|---|---|---|---|---|---|---|---|"]
    steps = [(i, r) for r in rows for i, r in enumerate(r.get("rescales", []))]
    for i in sorted({i for i, _ in steps}):
        rs = [r for j, r in steps if j == i]
        prev = 2 if i == 0 else rs[0]["workers"]
        label = f"{2 if i == 0 else 3} → {rs[0]['workers']}" if prev else str(rs[0]["workers"])

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(x[k] for x in rs)

        gaps = ", ".join(f"{x['longest_gap_s']:.2f}" for x in rs)
        ratio = [x["bytes_shipped"] / x["bytes_moved_state"] for x in rs if x["bytes_moved_state"]]
        lines.append(
            f"| {label} | {len(rs)} | **{med('longest_gap_s'):.2f}** ({gaps}) | {med('epochs_paused_s'):.2f} "
            f"| {med('rescale_s'):.2f} | {int(med('partitions_moved'))} "
            f"| {med('bytes_shipped') / 1e6:.1f} / {med('bytes_moved_state') / 1e6:.1f} "
            f"({statistics.median(ratio) if ratio else float('nan'):.2f}) | {med('bytes_downloaded') / 1e6:.1f} "
            f"| {statistics.median(r['p99_ms'] for r in rows):.0f} |")
    lost = sum(r.get("lost", 0) for r in rows)
    lines.append("")
    lines.append(f"Requests sent {sum(r['sent'] for r in rows):,}, answered "
                 f"{sum(r['committed'] + r['aborted'] for r in rows):,}, lost {lost} (every reply is matched "
                 "to its request by id; duplicates and losses under rescaling are checked by "
                 "`tests/runtime/test_rescale.py`).")
    return "\n".join(lines)


def main() -> None:
    ap = cluster_args("rescale", __doc__, 40.0)
    ap.add_argument("--up-at", dest="up_at", type=float, default=10.0)
    ap.add_argument("--down-at", dest="down_at", type=float, default=25.0)
    a = ap.parse_args()
    rows = run_points(a, "rescale", [(f"2 → 3 workers at {a.up_at} s, → 2 at {a.down_at} s",
                                      ["--rescale", f"{a.up_at}:3,{a.down_at}:2"])])
    finish(a, "rescale", "Replication: rescaling 2 → 3 → 2 workers under load", report, rows)


if __name__ == "__main__":
    main()
