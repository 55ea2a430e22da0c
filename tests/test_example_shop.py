"""examples/shop.py does what a shop owner and a customer would notice: one payment per
order however often its transaction runs, one confirmation per order that went through,
reservations that expire (stock and credit back) unless paid in time."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest

from examples import shop
from sfaas import App, TransactionAborted
from sfaas.testing import LocalRunner

HOLD = shop.RESERVATION_S


@pytest.fixture
def sfaas_app() -> App:
    return shop.app


@pytest.fixture
def sfaas_runner_options() -> dict[str, Any]:
    return {"store": "memonly", "workers": 2, "partitions": 4}


@pytest.fixture(autouse=True)
def fresh_world() -> Iterator[None]:
    shop.PROVIDER.reset()
    shop.OUTBOX.reset()
    yield
    shop.PROVIDER.reset()
    shop.OUTBOX.reset()


def _payment(order: str) -> dict[str, Any]:
    [p] = [p for p in shop.PROVIDER.payments.values() if p["order"] == order]
    return p


def _subjects() -> list[str]:
    return sorted(m["subject"] for m in shop.OUTBOX.sent)


async def test_a_hot_item_pays_once_per_order_and_confirms_each_placed_order_once(
        sfaas_runner: LocalRunner) -> None:
    n, units, credit = 40, 10, 2_00
    r = sfaas_runner
    await r.acall("stock", "mug", "restock", units)
    customers = [f"c{i}" for i in range(8)]  # several orders share a wallet
    for c in customers:
        await r.acall("wallets", c, "top_up", 100_00)
    results = await r.agather(*[("orders", f"o{i}", "place", customers[i % 8], "mug", 1, credit)
                                for i in range(n)])
    await r.adrain()

    placed = {f"o{i}" for i, x in enumerate(results) if x["status"] == "awaiting payment"}
    refused = {f"o{i}" for i, x in enumerate(results) if x["status"] == "refused"}
    assert len(placed) == units and len(placed) + len(refused) == n
    assert all(x["reason"] == "mug is sold out" for x in results if x["status"] == "refused")
    # the provider: every order asked exactly once (its transaction ran more often), with an
    # idempotency key of its own; the payments of refused orders were voided
    assert len(shop.PROVIDER.requests) == n == len(set(shop.PROVIDER.requests))
    per_order = collections.Counter(p["order"] for p in shop.PROVIDER.payments.values())
    assert per_order == {f"o{i}": 1 for i in range(n)}
    assert all(_payment(o)["status"] == "pending" for o in placed)
    assert all(_payment(o)["status"] == "voided" for o in refused)
    assert all(_payment(o)["amount"] == shop.PRICES["mug"] - credit for o in placed)
    assert r.stats.suspended >= n  # (each order's first run stopped at the payment)
    # the mail: one confirmation per placed order, none for a refused one
    assert _subjects() == sorted(f"Order {o} confirmed" for o in placed)
    assert len({m["id"] for m in shop.OUTBOX.sent}) == units
    # the state: the units are gone, the credit was taken only for placed orders
    assert await r.astate("stock", "mug") == 0
    balances = [await r.acall("wallets", c, "balance") for c in customers]
    assert sum(balances) == 8 * 100_00 - units * credit
    assert r.actions.pending == 0  # the outbox is empty once every action ran


def test_an_unpaid_order_expires_and_returns_the_stock_and_the_credit(
        sfaas_runner: LocalRunner) -> None:
    r = sfaas_runner
    r.call("stock", "tee", "restock", 3)
    r.call("wallets", "ada", "top_up", 10_00)
    order = r.call("orders", "o1", "place", "ada", "tee", 2, 5_00)
    assert order["status"] == "awaiting payment"
    assert r.state("stock", "tee") == 1 and r.call("wallets", "ada", "balance") == 5_00

    r.advance(HOLD - 1)  # never before it is due
    assert r.call("orders", "o1", "get")["status"] == "awaiting payment"
    assert r.stats.timers == 0
    r.advance(2)
    r.drain()
    assert r.call("orders", "o1", "get")["status"] == "expired"
    assert r.state("stock", "tee") == 3 and r.call("wallets", "ada", "balance") == 10_00
    assert _payment("o1")["status"] == "voided"
    assert _subjects() == ["Order o1 confirmed", "Order o1 expired"]
    assert r.stats.timers == 1
    r.advance(10 * HOLD)  # exactly once
    r.drain()
    assert r.stats.timers == 1 and len(shop.OUTBOX.sent) == 2
    # a payment arriving after the expiry changes nothing
    assert r.call("orders", "o1", "pay", order["payment"])["status"] == "expired"


def test_paying_in_time_cancels_the_expiry(sfaas_runner: LocalRunner) -> None:
    r = sfaas_runner
    r.call("stock", "poster", "restock", 5)
    order = r.call("orders", "o2", "place", "bob", "poster", 4)
    r.advance(HOLD / 2)
    assert r.call("orders", "o2", "pay", order["payment"])["status"] == "paid"
    assert r.call("orders", "o2", "pay", order["payment"])["status"] == "paid"  # a repeat
    r.advance(10 * HOLD)
    r.drain()
    assert r.call("orders", "o2", "get")["status"] == "paid"
    assert r.state("stock", "poster") == 1
    assert r.stats.timers == 0 and sum(len(t) for t in r.timers) == 0
    assert _payment("o2")["status"] == "pending"
    assert _subjects() == ["Order o2 confirmed"]


def test_a_declined_card_takes_nothing(sfaas_runner: LocalRunner) -> None:
    r = sfaas_runner
    r.call("stock", "mug", "restock", 1)
    shop.PROVIDER.declined.add("eve")
    with pytest.raises(TransactionAborted, match="payment refused: CardDeclined"):
        r.call("orders", "o3", "place", "eve", "mug", 1)
    r.drain()
    assert r.state("stock", "mug") == 1 and r.call("orders", "o3", "get") is None
    assert shop.OUTBOX.sent == [] and shop.PROVIDER.payments == {}


def test_too_little_credit_refuses_the_order_and_voids_its_payment(
        sfaas_runner: LocalRunner) -> None:
    r = sfaas_runner
    r.call("stock", "tee", "restock", 1)
    r.call("wallets", "cy", "top_up", 1_00)
    result = r.call("orders", "o4", "place", "cy", "tee", 1, 3_00)
    r.drain()
    assert result["status"] == "refused" and "store credit" in result["reason"]
    assert r.state("stock", "tee") == 1 and r.call("wallets", "cy", "balance") == 1_00
    assert _payment("o4")["status"] == "voided" and shop.OUTBOX.sent == []
    with pytest.raises(TransactionAborted, match="no such item"):  # before any payment
        r.call("orders", "o5", "place", "cy", "socks", 1)
    assert len(shop.PROVIDER.requests) == 1
