"""The pure parts of the CPU A/B harness (benchmarks/runtime/cpu_ab.py): the medians and
ratios a reader compares, the saturation rule that ends a curve, the run order that
interleaves the sides, and the messages bad arguments get. No cluster, nothing timed."""

from __future__ import annotations

import pytest

from benchmarks.runtime import cpu_ab
from benchmarks.runtime import cpu_ab_tables as tables


def _point(side: str, rate: float, us: float, p99: float = 20.0, tps: float | None = None,
           requests: float | None = 3.5, dist: str = "uniform") -> dict:
    return {"side": side, "dist": dist, "rate": rate, "committed_tps": rate if tps is None else tps,
            "p50_ms": 5.0, "p99_ms": p99, "cores": us * rate / 1e6, "cpu_us_per_txn": us,
            "broker_requests_per_txn": requests, "loadavg_before": 1.0, "others_cores": 0.1,
            "us_per_txn_by_process": {"coordinator": us / 10, "workers": us / 2}}


def test_the_medians_of_each_side_and_their_ratio_to_the_first_side() -> None:
    points = [_point("A", 200, us) for us in (7300, 5265, 6000)]
    points += [_point("B", 200, us, requests=r) for us, r in ((1400, 0.4), (1200, None), (1300, 0.5))]
    rows = {r["side"]: r for r in tables.medians(points)}
    assert rows["A"]["n"] == 3 and rows["A"]["cpu_us_per_txn"] == 6000
    assert rows["B"]["cpu_us_per_txn"] == 1300
    assert rows["B"]["broker_requests_per_txn"] == 0.45  # (the point without a count left out)
    assert rows["A"]["us_per_txn_by_process"]["workers"] == 3000
    (ratio,) = tables.ratios(list(rows.values()), "A")
    assert ratio["side"] == "B/A" and ratio["cpu_us_per_txn"] == round(1300 / 6000, 3)
    assert ratio["broker_requests_per_txn"] == round(0.45 / 3.5, 3)
    text = tables.table(list(rows.values()), ["A", "B"])
    assert "**B/A**" in text and "0.22×" in text and "6,000" in text


def test_a_side_without_a_number_gets_no_ratio_and_the_table_says_so() -> None:
    rows = tables.medians([_point("A", 1000, 1700, requests=None), _point("B", 1000, 700, requests=None)])
    (ratio,) = tables.ratios(rows, "A")
    assert ratio["broker_requests_per_txn"] is None
    assert "| – |" in tables.table(rows, ["A", "B"])


@pytest.mark.parametrize(("p99", "tps", "saturated"), [
    (31.5, 1000, False),
    (500.0, 900, False),  # the limits themselves still count as keeping up
    (501.0, 1000, True),  # the tail over 500 ms
    (40.0, 899, True),  # less than 90% of the offered rate committed
    (float("nan"), 0, True),  # no reply at all
])
def test_saturation_is_a_p99_over_500_ms_or_less_than_90_percent_committed(p99: float, tps: float,
                                                                             saturated: bool) -> None:
    why = tables.saturation({"rate": 1000, "p99_ms": p99, "committed_tps": tps})
    assert (why is not None) == saturated


def test_the_sides_alternate_within_each_point_from_one_pair_to_the_next() -> None:
    plan = tables.ab_schedule(["A", "B"], [(200, "uniform"), (1000, "uniform")], pairs=3)
    assert len(plan) == 12
    for rate in (200, 1000):
        firsts = [side for i, (pair, side, r, _) in enumerate(plan) if r == rate and i % 2 == 0]
        assert firsts in (["A", "B", "A"], ["B", "A", "B"])  # every pair's first side turns
    assert [s for _, s, _, _ in plan[:2]] == ["A", "B"]  # the sides of a pair back to back


@pytest.mark.parametrize(("call", "named"), [
    (lambda: cpu_ab.parse_rates("200,0"), "every rate must be > 0"),
    (lambda: cpu_ab.parse_rates("200,-1000"), "'-1000'"),
    (lambda: cpu_ab.parse_rates("fast"), "'fast'"),
    (lambda: cpu_ab.parse_refs(["main"]), "NAME=REF"),
    (lambda: cpu_ab.parse_refs(["A=main", "A=HEAD~1"]), "'A' is given twice"),
    (lambda: cpu_ab.parse_dists("zipf2"), "'zipf2'"),
    (lambda: cpu_ab.parse_env(["C:SFAAS_X=1"], ["A", "B"]), "no --ref is named 'C'"),
    (lambda: cpu_ab.resolve("no-such-ref-anywhere"), "'no-such-ref-anywhere' names no commit"),
])
def test_bad_arguments_are_refused_with_a_message_naming_them(call, named: str) -> None:  # noqa: ANN001
    with pytest.raises(cpu_ab.BadInput, match=named.replace("(", r"\(")):
        call()


def test_the_defaults_are_issue_47s_table() -> None:
    args = cpu_ab.parser().parse_args(["--ref", "A=HEAD", "--ref", "B=HEAD"])
    assert (args.store, args.keys, args.workers, args.snapshot_interval) == ("memonly", 10000, 2, 5.0)
    assert args.dist == "uniform,zipf" and args.seconds == 20.0
    cpu_ab.check_args(args)  # (valid: two refs)
    assert cpu_ab.parse_rates(cpu_ab.AB_RATES) == [200.0, 1000.0]
    assert cpu_ab.parse_rates(cpu_ab.CURVE_RATES)[:3] == [100.0, 200.0, 500.0]


def test_total_cpu_counts_every_process_and_keeps_minio_apart() -> None:
    raw = {"committed_tps": 200.0, "p50_ms": 5.7, "p99_ms": 31.5, "committed": 4000,
           "cpu_s": {"wall_s": 20.0, "roles": {"coordinator": 2.0, "worker": 9.0, "kafka": 6.0},
                     "background": 0.5, "client": 4.0, "apart": {"supervisor": 0.1, "minio": 3.0},
                     "others": 1.0, "steal": 0.0}}
    m = tables.point_metrics(raw)
    assert m["cores"] == pytest.approx(21.6 / 20)
    assert m["cpu_us_per_txn"] == pytest.approx(21.6e6 / 4000)
    assert m["us_per_txn_by_process"]["minio"] == pytest.approx(750)
    assert m["others_cores"] == pytest.approx(0.05)


def test_the_help_prints() -> None:
    """(A help text holding a bare ``%`` once made ``--help`` raise in argparse.)"""
    text = cpu_ab.parser().format_help()
    assert "--curve" in text and "90% committed" in text


def test_the_tracing_ab_runs_three_sides_of_this_checkout_against_tracing_off() -> None:
    from benchmarks.runtime import tracing_ab

    args = tracing_ab.parser().parse_args(["--pairs", "3", "--seconds", "15"])
    argv = tracing_ab.cpu_ab_args(args, "http://127.0.0.1:4318")
    ns = cpu_ab.parser().parse_args(argv)
    cpu_ab.check_args(ns)  # (what cpu_ab.py accepts)
    assert cpu_ab.parse_refs(ns.ref) == [("off", "worktree"), ("on1", "worktree"),
                                         ("on100", "worktree")]
    env = cpu_ab.parse_env(ns.env, ["off", "on1", "on100"])
    assert env["off"]["SFAAS_TRACING"] == "0" and env["on100"]["SFAAS_TRACING"] == "1"
    assert (env["on1"]["OTEL_TRACES_SAMPLER"], env["on1"]["OTEL_TRACES_SAMPLER_ARG"]) == \
        ("parentbased_traceidratio", "0.01")
    assert {e["OTEL_EXPORTER_OTLP_ENDPOINT"] for e in env.values()} == {"http://127.0.0.1:4318"}
    assert (ns.rates, ns.pairs, ns.seconds, ns.workers, ns.requests_seconds) == \
        ("1000", 3, 15.0, 2, 0.0)
