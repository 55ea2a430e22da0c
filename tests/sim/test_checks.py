"""The bank workload's balance checks (``sfaas.sim.checks``): a transfer run twice keeps
the sum and fails the exact check; one lost after its reply said it committed too."""

from __future__ import annotations

from sfaas.runtime import wire
from sfaas.sim.checks import balances_violations

TRANSFERS = {"r3": ("a", "b", 30), "r4": ("b", "c", 500), "r5": ("c", "a", 5)}
REPLIES = {"r3": wire.Reply("r3", True, 70),
           "r4": wire.Reply("r4", False, None, "Abort", "insufficient funds"),
           "r5": wire.Reply("r5", True, 95)}


def test_balances_that_agree_with_every_reply_pass() -> None:
    assert balances_violations(100, {"a": 75, "b": 130, "c": 95}, TRANSFERS, REPLIES) == []


def test_a_transfer_run_twice_keeps_the_sum_and_fails_the_exact_check() -> None:
    [v] = balances_violations(100, {"a": 45, "b": 160, "c": 95}, TRANSFERS, REPLIES)
    assert "disagree with the committed transfers' replies" in v and "'a': (45, 75)" in v


def test_an_aborted_transfer_that_moved_money_fails_too() -> None:
    [v] = balances_violations(100, {"a": 75, "b": -370, "c": 595}, TRANSFERS, REPLIES)
    assert "'b': (-370, 130)" in v


def test_a_leak_fails_the_sum_as_well() -> None:
    out = balances_violations(100, {"a": 75, "b": 131, "c": 95}, TRANSFERS, REPLIES)
    assert out[0] == "balances sum to 301, not 300" and "'b': (131, 130)" in out[1]
