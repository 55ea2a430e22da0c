"""The pytest plugin the package registers: ``sfaas_runner`` for the user's own tests."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_CONFTEST = '''
import pytest
from sfaas import Abort, App, Context

app = App("bank")
accounts = app.operator("accounts", store="memonly")

@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    ctx.put(ctx.get(default=0) + amount)
    return ctx.get()

@accounts.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    if ctx.get(default=0) < amount:
        raise Abort("insufficient funds")
    ctx.put(ctx.get() - amount)
    await ctx.call("accounts", to, "deposit", amount)
    return ctx.get()

@pytest.fixture
def sfaas_app():
    return app
'''

_TESTS = '''
import pytest
from sfaas import TransactionAborted

def test_sync(sfaas_runner):
    assert sfaas_runner.call("accounts", "alice", "deposit", 100) == 100
    with pytest.raises(TransactionAborted, match="insufficient"):
        sfaas_runner.call("accounts", "bob", "transfer", "alice", 5)

def test_each_test_gets_a_fresh_runner(sfaas_runner):
    assert sfaas_runner.state("accounts", "alice") is None

async def test_async(sfaas_runner):
    assert await sfaas_runner.call("accounts", "carol", "deposit", 7) == 7
'''


def test_the_runner_fixture_runs_the_users_app(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_shop=_TESTS)
    result = pytester.runpytest_subprocess("-p", "asyncio", "-o", "asyncio_mode=auto",
                                           "--rootdir", str(pytester.path))
    result.assert_outcomes(passed=3)


def test_without_an_app_the_fixture_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(sfaas_runner):\n    pass\n")
    result = pytester.runpytest_subprocess("--rootdir", str(pytester.path))
    result.stdout.fnmatch_lines(["*define a fixture named sfaas_app*"])
    assert result.ret != 0
