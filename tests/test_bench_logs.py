"""The runtime benchmark keeps the logs of its newest stopped clusters only
(benchmarks/runtime/bench.py ``prune_logs``); before, every point's cluster directory
stayed forever (hundreds of them after a day of benchmarks)."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.runtime.bench import prune_logs


def _cluster(root: Path, name: str, age: int, running: bool = False) -> Path:
    d = root / "cluster" / name
    d.mkdir(parents=True)
    (d / "coordinator.log").write_text("log\n")
    if running:
        (d / "cluster.json").write_text("{}")
    os.utime(d, (1_000_000 - age, 1_000_000 - age))
    return d


def test_only_the_newest_stopped_benchmark_clusters_keep_their_logs(tmp_path: Path) -> None:
    stopped = [_cluster(tmp_path, f"bench{i:04x}", age=i) for i in range(8)]  # bench0000 newest
    running = _cluster(tmp_path, "benchffff", age=100, running=True)  # oldest, but running
    mine = _cluster(tmp_path, "shop", age=200)  # a user's namespace, not a benchmark's
    deleted = prune_logs(tmp_path, keep=3)
    assert sorted(deleted) == sorted(stopped[3:])
    assert [d.exists() for d in stopped] == [True] * 3 + [False] * 5
    assert running.exists() and mine.exists()
    assert prune_logs(tmp_path, keep=3) == []  # nothing more to delete
