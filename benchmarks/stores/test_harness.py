"""Tests of the benchmark harness itself (workload generators, failure handling, report).

Run with ``python -m pytest benchmarks/stores/test_harness.py`` (skipped under
``--benchmark-only``). They need no engine but ``memonly`` and take a few seconds.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from . import report
from .cli import Sizes, build_tasks, run_child
from .workloads import KEY_BYTES, Workload, ZipfGenerator, fnv1a64, index_sequence, make_keys, zeta


def test_keys_are_distinct_16_bytes_and_not_sorted_by_index() -> None:
    keys = make_keys(50_000)
    assert len(set(keys)) == 50_000
    assert {len(k) for k in keys} == {KEY_BYTES}
    assert keys != sorted(keys)


def test_fnv1a64_matches_the_reference_for_known_inputs() -> None:
    def ref(x: int) -> int:
        h = 0xCBF29CE484222325
        for b in x.to_bytes(8, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return h

    xs = np.array([0, 1, 255, 2**40 + 7, 2**63 + 5], dtype=np.uint64)
    assert [int(v) for v in fnv1a64(xs)] == [ref(int(x)) for x in xs]


def test_zipf_ranks_follow_the_theoretical_frequencies() -> None:
    n, size = 1000, 400_000
    z = ZipfGenerator(n, 0.99, scrambled=False)
    ranks = z.ranks(size, np.random.default_rng(3))
    assert ranks.min() >= 0 and ranks.max() < n
    counts = np.bincount(ranks, minlength=n)
    # Gray et al.'s method is exact for the two hottest ranks and approximate after them
    for r in (0, 1):
        expected = z.probability(r) * size
        assert abs(counts[r] - expected) < 0.03 * expected, (r, counts[r], expected)
    for k in (10, 100, 500):
        share = counts[:k].sum() / size
        assert abs(share - sum(z.probability(r) for r in range(k))) < 0.03, (k, share)
    # the top 1% of ranks take a large share under θ=0.99, unlike uniform
    assert counts[: n // 100].sum() / size > 0.3


def test_scrambled_zipf_is_a_permutation_of_ranks() -> None:
    z = ZipfGenerator(5000, 0.99)
    assert z.perm is not None
    assert sorted(z.perm.tolist()) == list(range(5000))
    assert z.perm[:10].tolist() != list(range(10))  # hot items are spread, not the prefix
    idx = z.sample(100_000, np.random.default_rng(1))
    top = np.bincount(idx, minlength=5000).argmax()
    assert top == z.perm[0]


def test_zeta_and_bad_arguments() -> None:
    assert zeta(1, 0.99) == pytest.approx(1.0)
    assert zeta(2, 0.5) == pytest.approx(1 + 2**-0.5)
    with pytest.raises(ValueError, match="theta"):
        ZipfGenerator(10, 1.5)
    with pytest.raises(ValueError, match="n >= 2"):
        ZipfGenerator(1)
    with pytest.raises(ValueError, match="'pareto'"):
        index_sequence("pareto", 10, 10, 0)


def test_workload_sequences_cover_the_requested_ops() -> None:
    w = Workload.build("zipf", 2000, 10_000, seed=5)
    assert len(w.put_keys) == len(w.put_values) == len(w.get_keys) == 10_000
    assert sorted(k for k, _ in w.load_pairs()) == sorted(w.keys)
    assert set(w.get_keys) <= set(w.keys)
    assert w.data_bytes == 2000 * 116


def _tiny(tmp_path: object) -> Sizes:
    return Sizes(500, 2000, 500, 1000, 2, 200, 1000, 0.01, 2, 500, 1000, 1, 120.0)


def test_a_failing_engine_is_reported_not_fatal(tmp_path: object) -> None:
    res = run_child({"kind": "kv", "engine": "no-such-engine", "dist": "uniform", "n_keys": 10, "n_ops": 10,
                     "lat_ops": 10, "workdir": str(tmp_path)}, timeout_s=60)
    assert "error" in res and "no-such-engine" in res["error"]


def test_a_hung_task_is_killed(tmp_path: object) -> None:
    # 2M keys cannot be generated in 0.5 s: the child is killed and the error says why
    res = run_child({"kind": "build", "engine": "memonly", "n_keys": 2_000_000, "path": str(tmp_path)}, timeout_s=0.5)
    assert res["error"].startswith("timed out")


def test_memonly_end_to_end_through_the_report(tmp_path: object) -> None:
    sizes = _tiny(tmp_path)
    workdir = str(tmp_path)
    remote = {"kind": "path", "root": os.path.join(workdir, "remote")}
    tasks = build_tasks(["memonly"], sizes, ["kv", "reopen", "snapshots"], workdir, remote)
    raw = []
    for t in tasks:
        res = run_child(t, sizes.timeout_s)
        assert "error" not in res, res
        raw.append({"task": t, **res})
    meta = {"engines": ["memonly"], "sizes": sizes.__dict__, "command": "x", "mode": "quick", "remote": "path",
            "started_utc": "now", "python": "3", "machine": "m", "durability": {"memonly": "none"}}
    summary = report.summarize(raw, meta)
    row = summary["kv"]["memonly/uniform"]
    assert row["put_ops_per_s"] > 0 and row["get_ops_per_s"] > 0 and row["put_ops"] == 2000
    assert summary["reopen"]["memonly"]["reopen_ms"] > 0
    snap = summary["snapshots"]["memonly"]
    # memonly uploads its whole state on every snapshot: far above the 5% target
    assert snap["pct_median"] > 50
    verdicts = {t["target"]: t["verdict"] for t in summary["targets"]}
    assert verdicts["memonly: snapshot after updating 1% uploads ≤ 5% of the state (baseline: uploads everything by design)"] == "MISS"
    assert verdicts["lsm: reopen ≤ 150 ms at 1M keys"] == "–"  # lsm not selected: not a PASS
    out = tmp_path / "out"  # type: ignore[operator]
    out.mkdir()
    plots = report.plot_all(summary, str(out))
    assert {os.path.basename(p) for p in plots} == {"throughput.png", "latency.png", "reopen_memory.png", "snapshots.png"}
    assert all(os.path.getsize(p) > 10_000 for p in plots)
    md = report.markdown(summary, meta, plots, str(out))
    assert "| memonly |" in md and "Targets" in md


def test_targets_pass_and_miss_from_ratios() -> None:
    kv = {}
    for d in ("uniform", "zipf"):
        kv[f"rocksdict/{d}"] = {"put_ratio": 1.0, "get_ratio": 1.0, "errors": []}
        kv[f"lsm/{d}"] = {"put_ratio": 1.2, "get_ratio": 0.4, "errors": []}
    kv["hybridlog/zipf"] = {"errors": ["ModuleNotFoundError: statestores.hybridlog"]}
    summary = {"kv": kv, "reopen": {"lsm": {"n_keys": 1_000_000, "reopen_ms": 120.0, "rss_growth_pct_of_data": 30.0,
                                            "rss_growth_mb": 33.0, "data_mb": 110.6, "errors": []}}, "snapshots": {}}
    rows = {t["target"]: t for t in report.targets(summary, {"engines": ["lsm", "hybridlog", "rocksdict"]})}
    assert rows["lsm: put ≥ 1.0× rocksdict (uniform)"]["verdict"] == "PASS"
    assert rows["lsm: get ≥ 0.5× rocksdict (zipf)"]["verdict"] == "MISS"
    assert rows["lsm: reopen ≤ 150 ms at 1M keys"]["verdict"] == "PASS"
    assert rows["lsm: reopened process holds ≤ 25% of the data size"]["verdict"] == "MISS"
    assert rows["hybridlog: put ≥ 2.0× rocksdict (zipf)"]["verdict"] == "ERROR"
    assert "statestores.hybridlog" in rows["hybridlog: put ≥ 2.0× rocksdict (zipf)"]["measured"]


def test_readme_section_is_replaced_between_markers_only(tmp_path: object) -> None:
    path = str(tmp_path / "README.md")  # type: ignore[operator]
    with open(path, "w") as f:
        f.write(f"# Bench\n\nintro\n\n{report.BEGIN}\nold table\n{report.END}\n\n## After\ntext\n")
    report.rewrite_readme(path, "new table")
    report.rewrite_readme(path, "newer table")
    text = open(path).read()
    assert "old table" not in text and "new table\n" not in text and text.count("newer table") == 1
    assert text.startswith("# Bench\n\nintro\n\n") and text.endswith("## After\ntext\n")
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1


def _fake_snapshot_result(engine: str, freeze_ms: list[float], read_bytes: list[int | None], big_keys: int) -> dict:
    state = big_keys * 116
    upd = [
        {"snapshot_id": i + 2, "async_return_ms": f, "snapshot_s": 0.1, "bytes_uploaded": state // 100, "files_uploaded": 1,
         "bytes_total": state, "files_total": 3, "bytes_read": b, "updated_keys": big_keys // 100, "state_bytes": state,
         "uploaded_pct_of_state": 1.0}
        for i, (f, b) in enumerate(zip(freeze_ms, read_bytes, strict=True))
    ]
    base = {"snapshot_id": 1, "async_return_ms": 1.0, "snapshot_s": 1.0, "bytes_uploaded": state, "files_uploaded": 3,
            "bytes_total": state, "files_total": 3, "bytes_read": 2 * state, "state_bytes": state}
    grow = [{**base, "state_keys": big_keys}]
    return {"task": {"kind": "snapshots", "engine": engine}, "engine": engine, "grow": grow, "update": upd,
            "update_base": base, "big_keys": big_keys, "upd_frac": 0.01, "loadavg_start": [1.5, 1.0, 0.5],
            "loadavg_end": [2.25, 1.0, 0.5]}


def test_snapshot_freeze_and_bytes_read_columns_and_targets_render() -> None:
    n = 1_000_000
    state = n * 116
    raw = [
        # lsm: freeze p50 2 ms, max 10 ms; reads 2% of the state per round -> both PASS
        _fake_snapshot_result("lsm", [1.0, 2.0, 10.0], [state // 50] * 3, n),
        # appendlog: p50 fine but one round over 20 ms -> freeze MISS; reads 10% -> MISS
        _fake_snapshot_result("appendlog", [3.0, 4.0, 25.0], [state // 10] * 3, n),
        # hybridlog: an older result without bytes_read -> not measured, not a PASS
        _fake_snapshot_result("hybridlog", [1.0, 1.0, 1.0], [None] * 3, n),
    ]
    engines = ["lsm", "appendlog", "hybridlog"]
    sizes = Sizes(10, 10, 10, 10, 1, 10, n, 0.01, 3, 10, 10, 1, 1.0)
    meta = {"engines": engines, "sizes": sizes.__dict__, "command": "x", "mode": "full", "remote": "path",
            "started_utc": "now", "python": "3", "machine": "m", "durability": {e: "-" for e in engines},
            "loadavg_start": [0.5, 0.25, 0.125], "loadavg_end": [3.0, 2.0, 1.0]}
    summary = report.summarize(raw, meta)
    assert summary["snapshots"]["lsm"]["read_pct_median"] == pytest.approx(2.0, rel=1e-3)
    assert summary["snapshots"]["appendlog"]["async_max_ms"] == 25.0
    md = report.markdown(summary, meta, [], ".")
    header = next(ln for ln in md.splitlines() if ln.startswith("| engine | (a) cumulative"))
    assert "(b) freeze p50 / max ms" in header and "(b) bytes read per 1% update, % of state" in header
    cols = [c.strip() for c in header.strip("|").split("|")]
    lsm_row = next(ln for ln in md.splitlines() if ln.startswith("| lsm | ") and "MB" in ln)
    cells = [c.strip() for c in lsm_row.strip("|").split("|")]
    assert len(cells) == len(cols)
    assert cells[cols.index("(b) freeze p50 / max ms")] == "2.0 / 10.0"
    assert cells[cols.index("(b) bytes read per 1% update, % of state")] == "2.00% (max 2.00%)"
    hy_row = next(ln for ln in md.splitlines() if ln.startswith("| hybridlog | ") and "MB" in ln)
    assert [c.strip() for c in hy_row.strip("|").split("|")][cols.index("(b) bytes read per 1% update, % of state")] == "–"
    assert "lsm 1.50 → 2.25" in md and "at the start of the run: 0.50 / 0.25 / 0.12" in md
    v = {t["target"]: t["verdict"] for t in summary["targets"]}
    assert v["lsm: snapshot_async freeze p50 ≤ 5 ms and max ≤ 20 ms at 1M keys"] == "PASS"
    assert v["lsm: snapshot after updating 1% reads ≤ 5% of the state"] == "PASS"
    assert v["appendlog: snapshot_async freeze p50 ≤ 5 ms and max ≤ 20 ms at 1M keys"] == "MISS"
    assert v["appendlog: snapshot after updating 1% reads ≤ 5% of the state"] == "MISS"
    assert v["hybridlog: snapshot_async freeze p50 ≤ 5 ms and max ≤ 20 ms at 1M keys"] == "PASS"
    assert v["hybridlog: snapshot after updating 1% reads ≤ 5% of the state"] == "–"
    assert "| lsm: snapshot_async freeze p50 ≤ 5 ms and max ≤ 20 ms at 1M keys | p50 2.0 ms, max 10.0 ms" in md
