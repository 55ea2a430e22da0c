"""Failover of a lost machine, with and without a standby, in one run.

YCSB-T at 1,000 TPS on 2 workers (``examples.ycsbt``, 1M keys preloaded, snapshot rounds
every second); ``--kill-at`` seconds in, one worker's store directories are deleted and
the worker is SIGKILLed — a lost machine. With ``--standbys 1`` the coordinator promotes
that worker's standby, which restores the round from the files it followed; without, the
restarted worker must download the partitions' whole state from MinIO. Reported: the
longest pause between replies, the recovery's phases, the replay's speed (logged epochs
replayed per second over epochs per second live before the kill: issue 48's target is
≥ 5×), and the files downloaded.

    python -m benchmarks.replication.failover              # 3 repeats × (standby, none)
    python -m benchmarks.replication.failover --repeats 1 --keys 100000 --no-readme   # quick
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.replication import cluster_args, finish, run_points


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| standby | repeats | longest reply gap s (median; each) | recovery s | restore s | replay: epochs, s "
             "| replay speed × live (median; each) | files downloaded / restored; stores adopted | p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for sb in (1, 0):
        rs = [r for r in rows if r["standbys"] == sb and "recovery" in r]
        if not rs:
            continue
        rec = [r["recovery"] for r in rs]
        def med(k: str, rec: list[dict[str, Any]] = rec) -> float:
            return statistics.median(x.get(k, float("nan")) for x in rec)

        gaps = ", ".join(str(x["longest_gap_s"]) for x in rec)
        files = ", ".join(f"{x.get('files_downloaded', '?')}/{x.get('files_restored', '?')}; "
                          f"{x.get('stores_adopted', '?')}" for x in rec)
        # replay speed (issue 48): logged epochs per second in the replay over epochs per second live
        speeds = ", ".join(f"{x['replay_speedup']:.2f} ({x['replay_epochs_per_s']:.0f}/{x['live_epochs_per_s']:.0f} "
                           "epochs/s)" if "replay_speedup" in x else "?" for x in rec)
        lines.append(f"| {'yes' if sb else 'no'} | {len(rs)} | **{med('longest_gap_s'):.2f}** ({gaps}) | {med('recovery_s'):.2f} "
                     f"| {med('restore_s'):.2f} | {med('epochs_replayed'):.0f}, {med('replay_s'):.2f} "
                     f"| **{med('replay_speedup'):.2f}** ({speeds}) | {files} | {statistics.median(r['p99_ms'] for r in rs):.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = cluster_args("failover", __doc__, 30.0)
    ap.add_argument("--kill-at", dest="kill_at", type=float, default=12.0)
    a = ap.parse_args()
    lose = ["--kill-at", str(a.kill_at), "--lose-machine"]
    rows = run_points(a, "failover", [(f"standbys={sb}, lose a machine at {a.kill_at} s", [*lose, "--standbys", str(sb)])
                                      for sb in (1, 0)])
    finish(a, "failover", "Replication: failover of a lost machine", report, rows)


if __name__ == "__main__":
    main()
