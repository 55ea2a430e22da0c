"""Typed call handles: ``@operator.function`` returns a :class:`~sfaas.FunctionRef` that
runs like the function it wraps and addresses calls (``ctx.call(deposit, key, 5)``,
``ctx.send``, ``ctx.send_after``, ``Client.call``, ``SyncClient.call``) beside the string
form; mypy checks the handle, the key and the arguments; ``call_target`` turns either form
into names and arguments."""

from __future__ import annotations

import asyncio
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sfaas import Abort, App, BadArguments, Context, FunctionRef, UnknownFunction
from sfaas.app import call_target
from sfaas.testing import LocalRunner

ROOT = Path(__file__).resolve().parents[2]

app = App("bank")
accounts = app.operator("accounts", store="memonly")
log = app.operator("log", store="memonly")


@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    """Add ``amount`` to this account."""
    ctx.put(ctx.get(default=0) + amount)
    return int(ctx.get())


@accounts.function
async def transfer(ctx: Context, to: str, amount: int = 1) -> int:
    balance = ctx.get(default=0)
    if balance < amount:
        raise Abort("insufficient funds")
    ctx.put(balance - amount)
    return await ctx.call(deposit, to, amount)


@accounts.function
async def transfer_by_keywords(ctx: Context, source: str, to: str, amount: int) -> int:
    return await ctx.call(transfer, source, to=to, amount=amount)


@accounts.function
async def fan_out(ctx: Context, amount: int) -> None:
    ctx.send(deposit, "x", amount)                   # by handle
    ctx.send("accounts", "y", "deposit", amount)     # by name, as before
    ctx.send_after(60.0, deposit, "z", amount=amount)


@log.function(name="append")
async def log_append(ctx: Context, line: str, *, level: int = 0) -> int:
    ctx.put([*ctx.get(default=[]), line])
    return len(ctx.get())


@log.function
async def with_level(ctx: Context) -> int:
    return await ctx.call(log_append, "k", "x", level=2)  # keyword-only: cannot travel


other = App("shop")
carts = other.operator("accounts", store="memonly")


@carts.function(name="deposit")
async def shop_deposit(ctx: Context, amount: int) -> int:
    return amount


@accounts.function
async def call_other_app(ctx: Context) -> int:
    return await ctx.call(shop_deposit, "bob", 1)


@pytest.fixture
def runner() -> Any:
    with LocalRunner(app, workers=2, partitions=4) as r:
        yield r


# -- what a user writes ---------------------------------------------------------------------
def test_a_handle_calls_and_sends_like_the_string_form_in_a_transaction(runner: Any) -> None:
    runner.call("accounts", "alice", "deposit", 10)
    assert runner.call("accounts", "alice", "transfer", "bob", 3) == 3
    assert runner.call("accounts", "alice", "transfer", "bob") == 4  # the default amount
    assert runner.get("accounts", "alice") == 6
    assert runner.call("accounts", "driver", "transfer_by_keywords", "alice", "carol", 2) == 2
    assert runner.get("accounts", "carol") == 2 and runner.get("accounts", "alice") == 4
    runner.call("accounts", "k", "fan_out", 7)
    assert runner.get("accounts", "x") == 7 and runner.get("accounts", "y") == 7
    assert runner.get("accounts", "z") is None
    runner.advance(61.0)  # (runs the timer)
    assert runner.get("accounts", "z") == 7


def test_a_keyword_only_parameter_cannot_travel_through_a_call(runner: Any) -> None:
    with pytest.raises(BadArguments, match=r"log\.append\(line, level\): keyword argument\(s\) "
                                           r"\['level'\] name no positional parameter"):
        runner.call("log", "k", "with_level")


def test_the_handle_of_another_apps_function_is_refused_naming_both(runner: Any) -> None:
    with pytest.raises(UnknownFunction, match="shop_deposit is the handle of accounts.deposit "
                                              "of app 'shop'; this is app 'bank'"):
        runner.call("accounts", "alice", "call_other_app")
    with pytest.raises(UnknownFunction, match="of app 'shop'; this is app 'bank'"):
        app.call_target(shop_deposit, "bob", 1)


def test_the_handle_runs_like_the_function_it_wraps() -> None:
    class Ctx:
        value = 5

        def get(self, default: Any = None) -> Any:
            return self.value

        def put(self, value: Any) -> None:
            self.value = value

    assert isinstance(deposit, FunctionRef)
    assert asyncio.run(deposit(Ctx(), 3)) == 8  # type: ignore[arg-type]
    assert (deposit.operator, deposit.name, deposit.app) == ("accounts", "deposit", app)
    assert (log_append.operator, log_append.name, log_append.__name__) == ("log", "append",
                                                                           "log_append")
    assert deposit.__doc__ == "Add ``amount`` to this account."
    assert str(inspect.signature(deposit)) == "(ctx: 'Context', amount: 'int') -> 'int'"
    assert repr(deposit) == "<FunctionRef accounts.deposit of app 'bank'>"
    assert app.resolve("accounts", "deposit").fn is deposit.fn
    # one coroutine function registered in a second operator through its handle
    ledger = App("ledger").operator("entries")
    again = ledger.function(deposit)
    assert (again.operator, again.name, again.fn) == ("entries", "deposit", deposit.fn)


# -- call_target's contract -----------------------------------------------------------------
def test_call_target_turns_either_form_into_names_and_positional_arguments() -> None:
    assert call_target("accounts", "alice", "deposit", 5) == ("accounts", "alice", "deposit", (5,))
    assert call_target("accounts", "alice", "deposit") == ("accounts", "alice", "deposit", ())
    assert call_target(deposit, "alice", 5) == ("accounts", "alice", "deposit", (5,))
    assert call_target(deposit, "alice", amount=5) == ("accounts", "alice", "deposit", (5,))
    assert call_target(transfer, "a", "b") == ("accounts", "a", "transfer", ("b",))
    assert call_target(transfer, "a", amount=2, to="b") == ("accounts", "a", "transfer", ("b", 2))
    assert call_target(log_append, "k", "x") == ("log", "k", "append", ("x",))
    # values are not its business: the key's type and the arity are checked later, as before
    assert call_target("accounts", 7, "deposit") == ("accounts", 7, "deposit", ())
    assert call_target(deposit, "a", 1, 2) == ("accounts", "a", "deposit", (1, 2))


@pytest.mark.parametrize("call, message", [
    (lambda: call_target(deposit), r"a call of accounts\.deposit needs a key: \(deposit, key"),
    (lambda: call_target("accounts", "alice"), r"by name needs \(operator, key, function, "
                                               r"\*args\), got 2 argument"),
    (lambda: call_target("accounts", "a", "deposit", amount=1), r"keyword argument\(s\) "
                                                                r"\['amount'\] in a call of "
                                                                r"accounts\.deposit by name"),
    (lambda: call_target(deposit.fn, "a", 1), r"call target tests\.runtime\.test_typed_calls\."
                                              r"deposit is a plain function, not a function "
                                              r"handle"),
    (lambda: call_target(5, "a", "deposit"), r"an operator name \(str\) or a function handle "
                                             r"\(what @operator\.function returned\), got 5"),
    (lambda: call_target(deposit, "a", 1, amount=2), r"accounts\.deposit\(amount\): multiple "
                                                     r"values for argument 'amount'"),
    (lambda: call_target(deposit, "a", 1, amont=2), r"accounts\.deposit\(amount\): got an "
                                                      r"unexpected keyword argument 'amont'"),
], ids=["no-key", "name-too-short", "name-with-keywords", "plain-function", "not-a-target",
        "twice", "unknown-keyword"])
def test_call_target_refuses_bad_shapes_with_a_type_error(call: Any, message: str) -> None:
    with pytest.raises(BadArguments, match=message) as exc:
        call()
    assert isinstance(exc.value, TypeError)


# -- the clients ----------------------------------------------------------------------------
def test_the_clients_send_a_handle_call_as_the_names_and_refuse_another_apps_handle() -> None:
    from sfaas.client import Client, SyncClient

    sent: list[tuple[Any, ...]] = []

    def fake(client: Client) -> Client:
        async def submit(operator: str, key: str, function: str, args: tuple[Any, ...],
                         idempotency_key: str | None = None) -> tuple[str, Any]:
            client._validate(operator, key, function, args)
            sent.append((operator, key, function, args, idempotency_key))
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(type("Reply", (), {"ok": True, "value": 42})())
            return "rid", fut

        client._submit = submit  # type: ignore[method-assign]
        return client

    async def go() -> None:
        for c in (fake(Client(app, "127.0.0.1:9", direct_reads=False)),
                  fake(Client("bank", "127.0.0.1:9", direct_reads=False))):
            assert await c.call(deposit, "alice", 5) == 42
            assert await c.call(transfer, "alice", "bob", idempotency_key="once") == 42
            assert await c.call("accounts", "alice", "deposit", 5) == 42
            with pytest.raises(UnknownFunction, match="of app 'shop'; this is app 'bank'"):
                await c.call(shop_deposit, "alice", 5)
        with pytest.raises(BadArguments, match=r"accounts\.deposit\(amount\) got 0 argument"):
            await fake(Client(app, "127.0.0.1:9", direct_reads=False)).call(
                deposit, "alice")  # type: ignore[call-overload]

    asyncio.run(go())
    assert sent == [("accounts", "alice", "deposit", (5,), None),
                    ("accounts", "alice", "transfer", ("bob",), "once"),
                    ("accounts", "alice", "deposit", (5,), None)] * 2
    sent.clear()
    with SyncClient(app, "127.0.0.1:9", direct_reads=False) as sc:
        fake(sc._client)
        assert sc.call(deposit, "alice", amount=5, idempotency_key="k") == 42  # type: ignore[call-overload]
        assert sc.call("accounts", "alice", "deposit", 5) == 42
        with pytest.raises(UnknownFunction, match="of app 'shop'"):
            sc.call(shop_deposit, "alice", 5)
    assert sent == [("accounts", "alice", "deposit", (5,), "k"),
                    ("accounts", "alice", "deposit", (5,), None)]


# -- what mypy sees -------------------------------------------------------------------------
_APP = '''
from sfaas import App, Client, Context, SyncClient
from sfaas.testing import LocalRunner

app = App("bank")
accounts = app.operator("accounts")


@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    return amount


@accounts.function(name="move")
async def transfer(ctx: Context, to: str, amount: int = 1) -> str:
    return to
'''

_GOOD = _APP + '''

@accounts.function
async def uses(ctx: Context) -> int:
    a: int = await ctx.call(deposit, "bob", 5)
    b: str = await ctx.call(transfer, "bob", "carol")
    c: str = await ctx.call(transfer, "bob", to="carol", amount=2)
    d = await ctx.call("accounts", "bob", "deposit", 5)        # the string form: Any
    ctx.send(deposit, "bob", 5)
    ctx.send("accounts", "bob", "deposit", 5)
    ctx.cancel_timer(ctx.send_after(1.0, deposit, "bob", 5))
    ctx.send_after(1.0, "accounts", "bob", "deposit", 5)
    direct: int = await deposit(ctx, 5)                        # still a plain call
    return a + len(b) + len(c) + int(d) + direct


async def client(c: Client, sc: SyncClient) -> int:
    a: int = await c.call(deposit, "alice", 5)
    b: int = await c.call(deposit, "alice", 5, idempotency_key="k")
    e: str = await c.call(transfer, "alice", "bob", idempotency_key=None)
    d = await c.call("accounts", "alice", "deposit", 5, idempotency_key="k")
    f: int = sc.call(deposit, "alice", 5)
    g: str = sc.call(transfer, "alice", "bob", 2, idempotency_key="k")
    return a + b + len(e) + int(d) + f + len(g)


async def runner(r: LocalRunner) -> int:
    a: int = r.call(deposit, "alice", 5)
    b: int = await r.acall(deposit, "alice", 5, idempotency_key="k")
    c: str = r.call(transfer, "alice", to="bob")
    d = r.call("accounts", "alice", "deposit", 5)
    return a + b + len(c) + int(d)
'''

#: each line marked ``# E`` must get a mypy error, and no other line
_BAD = _APP + '''

@accounts.function
async def misuses(ctx: Context) -> None:
    await ctx.call(deposit, "bob", "5")                  # E wrong argument type
    await ctx.call(deposit, "bob")                       # E too few arguments
    await ctx.call(deposit, "bob", 5, 6)                 # E too many arguments
    await ctx.call(deposit, 5, 5)                        # E the key is not a str
    wrong: str = await ctx.call(deposit, "bob", 5)       # E the result is an int
    await ctx.call(transfer, "bob", tu="carol")          # E no such parameter
    await ctx.call("deposit", "bob", 5)                  # E a name is not a handle
    ctx.send(deposit, "bob", "5")                        # E
    ctx.send_after(1.0, deposit, "bob", 5.5)             # E
    await deposit(ctx, "5")                              # E a direct call is checked too


async def client(c: Client, sc: SyncClient) -> None:
    await c.call(deposit, "alice", "5")                  # E
    await c.call(deposit, "alice", "5", idempotency_key="k")   # E
    await c.call(deposit, b"alice", 5, idempotency_key="k")    # E
    wrong: str = await c.call(deposit, "alice", 5, idempotency_key="k")  # E
    sc.call(deposit, 7, 5)                               # E
    sc.call(transfer, "alice")                           # E


async def runner(r: LocalRunner) -> None:
    r.call(deposit, "alice", "5")                        # E
    await r.acall(deposit, "alice", 5, 6)                # E
    wrong: str = r.call(deposit, "alice", 5)             # E
'''


def _mypy(tmp_path: Path, files: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """Run ``mypy --strict`` (the project's) over ``files``: each file's ``(line, message)``
    errors."""
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(tmp_path / ".mypy_cache"), *files],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(ROOT)})
    assert out.returncode in (0, 1), out.stdout + out.stderr
    errors: dict[str, list[tuple[int, str]]] = {name: [] for name in files}
    for line in out.stdout.splitlines():
        m = re.match(r"^(\w+\.py):(\d+): error: (.*)$", line)
        if m:
            errors[m[1]].append((int(m[2]), m[3]))
    return errors


@pytest.mark.timeout(300)
def test_mypy_catches_a_wrong_argument_arity_key_or_result_and_passes_the_right_uses(
        tmp_path: Path) -> None:
    errors = _mypy(tmp_path, {"good_calls.py": _GOOD, "bad_calls.py": _BAD})
    assert errors["good_calls.py"] == [], errors["good_calls.py"]
    lines = textwrap.dedent(_BAD).splitlines()
    marked = {n for n, text in enumerate(lines, 1) if "# E" in text}
    flagged = {n for n, _ in errors["bad_calls.py"]}
    assert flagged == marked, (
        f"lines with an error but no mark: {sorted(flagged - marked)}, marked lines without "
        f"an error: {[lines[n - 1].strip() for n in sorted(marked - flagged)]}\n"
        + "\n".join(f"{n}: {msg}" for n, msg in errors["bad_calls.py"]))
    text = "\n".join(msg for _, msg in errors["bad_calls.py"])
    assert 'Argument 2 to "__call__" of "FunctionRef" has incompatible type "str"; ' \
           'expected "int"' in text  # a direct call's message names the argument
    assert 'No overload variant of "call" of "Context" matches argument types ' \
           '"FunctionRef[[int], int]", "str", "str"' in text  # the handle's signature shows
