"""A shop that talks to the outside world: ``stock``, ``wallets`` and ``orders``.

``orders.place`` asks a payment provider for the card part of the order (a journaled
effect, ``ctx.run``), takes the stock and the store credit from the customer's wallet, and
holds the order for ``RESERVATION_S`` seconds: ``orders.pay`` (what the provider's webhook
calls once the customer paid) cancels the expiry timer; otherwise ``orders.expire`` (a
durable timer, ``ctx.send_after``) cancels the order, returns the stock and the credit, and
voids the payment. The confirmation email goes out only if the order committed
(``ctx.after_commit``).

The rule the ordering in ``place`` follows: **before ``ctx.run`` a function may check its
arguments and ``Abort``; after it, it must not** — the effect has happened, and a
transaction that continues after an effect re-reads the state of a later epoch (another
order may have taken the last unit meanwhile). So ``place`` calls the provider first, then
decides, and a refusal commits with a compensating post-commit action (voiding the
payment) instead of aborting.

The provider and the mail server are in-memory fakes at module level (a post-commit action
must be a module-level function: it is stored by name). Both use :func:`sfaas.effect_key`
as the idempotency key a real API would take: the same on every try, different for every
order.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from sfaas import Abort, App, Context, EffectFailed, effect_key

app = App("shop")
_store = os.environ.get("SFAAS_STORE", "hybridlog")
stock = app.operator("stock", store=_store)
wallets = app.operator("wallets", store=_store)
orders = app.operator("orders", store=_store)

#: the catalog, in cents (a constant: every run of a transaction prices alike)
PRICES = {"mug": 12_00, "tee": 25_00, "poster": 8_00}
#: how long an order holds its stock while it waits for the card payment
RESERVATION_S = 15 * 60


# -- the outside world (fakes) -----------------------------------------------------------
class CardDeclined(Exception):
    """The provider refused the payment (not a built-in class: it reaches the function as
    ``sfaas.EffectFailed`` with ``error_type == "CardDeclined"``)."""


class Provider:
    """A payment provider with idempotency keys: a repeated key gets the first answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # effects run in threads
        self._ids = itertools.count(1)
        #: idempotency key → the payment it created
        self.payments: dict[str, dict[str, Any]] = {}
        #: every request's idempotency key, repeats included
        self.requests: list[str] = []
        #: customers whose card is declined
        self.declined: set[str] = set()

    def create_payment(self, key: str, order: str, customer: str,
                       amount: int) -> dict[str, Any]:
        with self._lock:
            self.requests.append(key)
            if key in self.payments:
                return dict(self.payments[key])
            if customer in self.declined:
                raise CardDeclined(f"card of {customer} declined")
            payment = {"id": f"pay_{next(self._ids)}", "order": order, "amount": amount,
                       "status": "pending"}
            self.payments[key] = payment
            return dict(payment)

    def void(self, payment_id: str) -> None:
        with self._lock:
            for p in self.payments.values():
                if p["id"] == payment_id:
                    p["status"] = "voided"

    def reset(self) -> None:
        with self._lock:
            self.payments.clear()
            self.requests.clear()
            self.declined.clear()


class Outbox:
    """A mail server: every message sent, with the Message-ID it was sent with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[dict[str, str]] = []

    def send(self, message_id: str, to: str, subject: str) -> None:
        with self._lock:
            self.sent.append({"id": message_id, "to": to, "subject": subject})

    def reset(self) -> None:
        with self._lock:
            self.sent.clear()


PROVIDER = Provider()
OUTBOX = Outbox()


def create_payment(order: str, customer: str, amount: int) -> dict[str, Any]:
    """The effect ``place`` journals: one payment per order, whatever the re-runs."""
    return PROVIDER.create_payment(effect_key(), order, customer, amount)


def void_payment(payment_id: str) -> None:
    """A post-commit action: release a payment the order will not use."""
    PROVIDER.void(payment_id)


def send_email(to: str, subject: str) -> None:
    """A post-commit action: the effect key is the Message-ID, so a resend is recognisable."""
    OUTBOX.send(effect_key(), to, subject)


# -- stock ---------------------------------------------------------------------------------
@stock.function
async def restock(ctx: Context, units: int) -> int:
    """Add ``units`` of this item; returns the units in stock."""
    if not isinstance(units, int) or units <= 0:
        raise Abort(f"restock units must be a positive int, got {units!r}")
    left = int(ctx.get(default=0)) + units
    ctx.put(left)
    return left


@stock.function
async def available(ctx: Context) -> int:
    """Units of this item in stock."""
    return int(ctx.get(default=0))


@stock.function
async def take(ctx: Context, units: int) -> bool:
    """Take ``units`` if there are that many (True), else take nothing (False)."""
    left = int(ctx.get(default=0))
    if left < units:
        return False
    ctx.put(left - units)
    return True


@stock.function
async def put_back(ctx: Context, units: int) -> int:
    """Return ``units`` of an order that did not go through."""
    left = int(ctx.get(default=0)) + units
    ctx.put(left)
    return left


# -- wallets (store credit, in cents) ------------------------------------------------------
@wallets.function
async def top_up(ctx: Context, amount: int) -> int:
    """Add ``amount`` of store credit; returns the balance."""
    if not isinstance(amount, int) or amount <= 0:
        raise Abort(f"top-up amount must be a positive int, got {amount!r}")
    balance = int(ctx.get(default=0)) + amount
    ctx.put(balance)
    return balance


@wallets.function
async def balance(ctx: Context) -> int:
    """The store credit left."""
    return int(ctx.get(default=0))


@wallets.function
async def charge(ctx: Context, amount: int) -> bool:
    """Take ``amount`` of credit if the wallet holds it (True), else nothing (False)."""
    left = int(ctx.get(default=0))
    if left < amount:
        return False
    ctx.put(left - amount)
    return True


@wallets.function
async def refund(ctx: Context, amount: int) -> int:
    """Give ``amount`` of credit back; returns the balance."""
    left = int(ctx.get(default=0)) + amount
    ctx.put(left)
    return left


# -- orders --------------------------------------------------------------------------------
@orders.function
async def place(ctx: Context, customer: str, sku: str, units: int,
                credit: int = 0) -> dict[str, Any]:
    """Order ``units`` of ``sku`` for ``customer``, paying ``credit`` cents from the
    wallet and the rest by card. Returns the order, or ``{"status": "refused", ...}``."""
    # 1. Only the arguments are checked before the effect: Abort is safe here.
    if sku not in PRICES:
        raise Abort(f"no such item: {sku!r}")
    if not isinstance(units, int) or units <= 0:
        raise Abort(f"units must be a positive int, got {units!r}")
    total = PRICES[sku] * units
    if not isinstance(credit, int) or not 0 <= credit < total:
        raise Abort(f"credit must be an int in [0, {total}), got {credit!r}")

    # 2. The provider, once per order: the first run stops here (nothing held), the
    #    payment is created outside the epoch, and the transaction runs again from the top
    #    with the journaled answer.
    try:
        payment = await ctx.run(create_payment, ctx.key, customer, total - credit)
    except EffectFailed as exc:  # the card was declined: nothing was taken yet
        raise Abort(f"payment refused: {exc.reason}") from None

    # 3. From here on a payment exists: refuse by committing, and void it after commit.
    reason = None
    if ctx.get() is not None:
        reason = f"order {ctx.key} exists"
    elif not await ctx.call("stock", sku, "take", units):
        reason = f"{sku} is sold out"
    elif credit and not await ctx.call("wallets", customer, "charge", credit):
        await ctx.call("stock", sku, "put_back", units)
        reason = f"{customer} has less than {credit} of store credit"
    if reason is not None:
        ctx.after_commit(void_payment, payment["id"])
        return {"status": "refused", "reason": reason, "payment": payment["id"]}

    order = {"customer": customer, "sku": sku, "units": units, "credit": credit,
             "payment": payment["id"], "status": "awaiting payment",
             "expiry": ctx.send_after(RESERVATION_S, "orders", ctx.key, "expire")}
    ctx.put(order)
    ctx.after_commit(send_email, customer, f"Order {ctx.key} confirmed")
    return order


@orders.function
async def pay(ctx: Context, payment_id: str) -> dict[str, Any]:
    """The provider's webhook: the card payment ``payment_id`` went through."""
    order = ctx.get()
    if order is None or order["payment"] != payment_id:
        raise Abort(f"no order {ctx.key} with payment {payment_id}")
    if order["status"] == "awaiting payment":
        ctx.cancel_timer(order["expiry"])
        order = {**order, "status": "paid"}
        ctx.put(order)
    return dict(order)  # (webhooks repeat: a second call changes nothing)


@orders.function
async def expire(ctx: Context) -> str:
    """The reservation's timer: an order still unpaid is cancelled."""
    order = ctx.get()
    if order is None or order["status"] != "awaiting payment":
        return "nothing to do"
    await ctx.call("stock", order["sku"], "put_back", order["units"])
    if order["credit"]:
        await ctx.call("wallets", order["customer"], "refund", order["credit"])
    ctx.put({**order, "status": "expired"})
    ctx.after_commit(void_payment, order["payment"])
    ctx.after_commit(send_email, order["customer"], f"Order {ctx.key} expired")
    return "expired"


@orders.function
async def get(ctx: Context) -> dict[str, Any] | None:
    """The order, or None."""
    return ctx.get()  # type: ignore[no-any-return]
