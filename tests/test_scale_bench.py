"""The cost curves' tooling (benchmarks/scale): the capacity model and the keys table."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scale import cluster, plot


def _point(rate: float, **cpu_us: int) -> dict:
    return {"offered_tps": rate, "committed_tps": rate, "p99_ms": 100.0,
            "cpu_us_per_txn": cpu_us, "cpu_percent": {"loadgen": 40.0}}


def test_the_model_takes_the_cpu_at_the_rate_held_and_the_coordinators_core_caps_it() -> None:
    m = cluster._model(2, _point(10_000, worker=80, kafka=20, coordinator=5, background=0), cores=2)
    # (the client: 40% of a core over 10,000 transactions a second = 40 µs each)
    assert m["cpu_us_per_txn"] == {"worker": 80, "kafka": 20, "coordinator": 5, "background": 0, "client": 40}
    assert m["this_machine_tps"] == round(2 / 145e-6)
    assert m["n_machines_tps"] == round(2 * 2 / 100e-6)
    slow_coordinator = cluster._model(4, _point(10_000, worker=10, kafka=0, coordinator=50), cores=2)
    assert slow_coordinator["n_machines_tps"] == slow_coordinator["coordinator_bound_tps"] == 20_000


def test_saturation_is_the_highest_rate_held_within_500_ms() -> None:
    pts = [_point(1000), {**_point(2000), "p99_ms": 400.0}, {**_point(3000), "p99_ms": 900.0},
           {**_point(4000), "committed_tps": 2000.0}]
    assert cluster.saturation(pts) == 2000.0


def test_the_keys_table_says_when_a_recovery_never_ended(tmp_path: Path) -> None:
    rows = [
        {"curve": "keys", "keys": 10_000_000, "point": "1000 TPS", "p50_ms": 5.0, "p99_ms": 30.0,
         "cpu_us_per_txn": {"worker": 800, "kafka": 350}, "first_round": {"mb": 219.3, "waited_s": 4.0}},
        {"curve": "keys", "keys": 10_000_000, "point": "worker killed",
         "recovery": {"longest_gap_s": 0.0}},
    ]
    table = plot.cluster_table(rows)
    assert "| 10,000,000 | 219.3 MB in 4.0 s | 5.0 / 30.0 |" in table
    assert "**never recovered**" in table
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert plot.plot_cluster(plot.load(f), tmp_path) == tmp_path / "cluster.png"
    assert (tmp_path / "cluster.png").stat().st_size > 0


def test_a_preload_leaves_each_store_merged_into_one_run(tmp_path: Path, monkeypatch) -> None:
    """The cost curves measure a big state in its steady state: a preload written in a minute
    must not leave its merges (the whole state, rewritten) to run in the measured window."""
    import statestores
    from benchmarks.runtime import bench
    from sfaas.runtime import state
    from sfaas.runtime.settings import Settings

    real = state.open_partition_stores

    def small_memtables(*args, **kwargs):  # (many flushes: many runs to merge)
        return real(*args, **{**kwargs, "store_options": {"memtable_bytes": 16 << 10}})

    monkeypatch.setattr(state, "open_partition_stores", small_memtables)
    root = tmp_path / "ycsbt"
    bench._write_initial(Settings(store="lsm", partitions=2), 150_000, str(root))
    keys = 0
    for p in (0, 1):
        with statestores.open("lsm", str(root / "ycsb" / f"p{p}"), memtable_bytes=16 << 10) as s:
            assert sum(s.stats()["runs_per_level"]) == 1, s.stats()["files_per_level"]
            keys += sum(1 for _ in s.items())
    assert keys == 150_000
