"""The overload benchmark's verdicts (benchmarks/runtime/overload.py), without a cluster:
each request answered exactly once, the RSS flatness against the value after warm-up, and
the report that says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.runtime.overload import Ledger, flatness
from benchmarks.runtime.overload_report import report


def test_every_request_answered_once_leaves_nothing_missing() -> None:
    ledger = Ledger("run-")
    for seq in reversed(range(1000)):  # replies come in any order
        assert ledger.answer(f"run-{seq}")
    assert (ledger.answered, ledger.missing(1000), ledger.duplicates, ledger.foreign) == (1000, 0, 0, 0)


def test_duplicates_and_missing_requests_are_counted_apart() -> None:
    ledger = Ledger("run-")
    for seq in (0, 1, 1, 1, 3, 70_000):
        ledger.answer(f"run-{seq}")
    assert ledger.replies == 6
    assert ledger.duplicates == 2  # request 1 answered three times
    assert ledger.answered == 4
    # sent 5: requests 2 and 4 have no reply; request 70,000 was never sent
    assert ledger.missing(5) == 2
    assert ledger.first_missing(5) == [2, 4]
    assert ledger.unsent_answered(5) == 1
    # sent more than the ledger ever grew to: those are missing too
    assert ledger.missing(200_000) == 200_000 - 4
    assert ledger.first_missing(200_000, n=3) == [2, 4, 5]


@pytest.mark.parametrize("rid", ["other-5", "run-", "run-x1", "run--1", "run-٣", "5"])
def test_a_reply_to_no_request_of_this_run_is_foreign(rid: str) -> None:
    ledger = Ledger("run-")
    assert not ledger.answer(rid)
    assert (ledger.foreign, ledger.answered, ledger.missing(1)) == (1, 0, 1)


def test_rss_is_judged_against_its_value_after_warm_up() -> None:
    mb = 1_000_000
    # the warm-up's growth (0–9 s) does not count; 10 s on it drifts -5% … +8%
    samples = [(t, 50 * mb) for t in range(10)] + [(10, 100 * mb), (11, 95 * mb), (12, 108 * mb), (13, 104 * mb)]
    v = flatness(samples, since=10, tolerance_pct=10)
    assert v is not None
    assert (v["base"], v["min"], v["max"], v["end"]) == (100 * mb, 95 * mb, 108 * mb, 104 * mb)
    assert v["deviation_pct"] == 8.0 and v["flat"]
    assert not flatness(samples, since=10, tolerance_pct=7.9)["flat"]  # type: ignore[index]


def test_a_shrinking_process_is_not_flat_either_and_no_samples_give_no_verdict() -> None:
    v = flatness([(10, 100), (20, 120), (30, 70)], since=10, tolerance_pct=10)
    assert v is not None and v["deviation_pct"] == -30.0 and not v["flat"]
    assert flatness([(1, 100), (5, 100)], since=10, tolerance_pct=10) is None


def test_the_report_says_which_process_grew_and_what_was_lost() -> None:
    """The report's verdicts follow the summary: a worker whose RSS is not flat is named
    with its deviation, and missing or duplicated replies are said plainly."""
    raw = Path(__file__).resolve().parents[1] / "benchmarks/journal/2026-11-23-overload/overload.jsonl"
    summary = json.loads(raw.read_text().splitlines()[-1])
    good = report(summary)
    assert "flat" in good and "**not flat**" not in good and "Nothing was lost or duplicated." in good
    bad = json.loads(json.dumps(summary))
    bad["rss"]["worker-1"].update(deviation_pct=42.5, flat=False)
    bad.update(missing=7, duplicates=2)
    text = report(bad)
    assert "| worker 1 |" in text and "**not flat**" in text and "worker-1 +42.5%" in text
    assert "**lost 7**" in text and "**duplicates 2**" in text and "7 missing, 2 duplicated" in text
