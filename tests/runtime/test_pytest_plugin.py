"""The pytest plugin the package registers: ``sfaas_runner`` for the user's own tests, plain
and ``async``, with pytest-asyncio or without it."""

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
    assert sfaas_runner.gather(("accounts", "a", "deposit", 1), ("accounts", "b", "deposit", 2)) == [1, 2]
    with pytest.raises(TransactionAborted, match="insufficient"):
        sfaas_runner.call("accounts", "bob", "transfer", "alice", 5)

def test_each_test_gets_a_fresh_runner(sfaas_runner):
    assert sfaas_runner.state("accounts", "alice") is None

async def test_async(sfaas_runner):
    assert await sfaas_runner.acall("accounts", "carol", "deposit", 7) == 7
    assert await sfaas_runner.agather(("accounts", "a", "deposit", 1),
                                      ("accounts", "carol", "transfer", "b", 2)) == [1, 5]
    assert await sfaas_runner.aget("accounts", "b") == 2
    assert await sfaas_runner.aitems("accounts") == {"a": 1, "b": 2, "carol": 5}
    await sfaas_runner.aadvance(10)
    await sfaas_runner.adrain()
    with pytest.raises(TransactionAborted, match="insufficient"):
        await sfaas_runner.acall("accounts", "bob", "transfer", "alice", 5)

@pytest.fixture
def funded(sfaas_runner):
    sfaas_runner.call("accounts", "dan", "deposit", 50)  # a sync fixture, the blocking form
    return sfaas_runner

async def test_async_through_a_sync_fixture(funded):
    assert await funded.acall("accounts", "dan", "transfer", "eve", 20) == 30
    assert funded.items("accounts") == {"dan": 30, "eve": 20}  # (blocking, inside a loop)

@pytest.mark.parametrize("n", [1, 2])
async def test_async_parametrized(sfaas_runner, n):
    assert await sfaas_runner.acall("accounts", "x", "deposit", n) == n

async def test_async_failing(sfaas_runner):
    assert await sfaas_runner.acall("accounts", "z", "deposit", 1) == 2
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plugins", [
    ("-p", "no:asyncio"),
    ("-p", "asyncio", "-o", "asyncio_mode=auto"),
    ("-p", "asyncio", "-o", "asyncio_mode=strict"),
], ids=["no-pytest-asyncio", "pytest-asyncio-auto", "pytest-asyncio-strict"])
def test_plain_and_async_tests_run_with_or_without_pytest_asyncio(
        pytester: pytest.Pytester, plugins: tuple[str, ...]) -> None:
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_shop=_TESTS)
    result = pytester.runpytest_subprocess(*plugins, "-p", "no:cacheprovider",
                                           "--rootdir", str(pytester.path))
    # every async test ran (none skipped), and a failing one fails with the user's assertion
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*test_async_failing*", "*assert 1 == 2*"])
    result.stdout.no_fnmatch_line("*not natively supported*")


def test_without_an_app_the_fixture_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(sfaas_runner):\n    pass\n")
    result = pytester.runpytest_subprocess("--rootdir", str(pytester.path))
    result.stdout.fnmatch_lines(["*define a fixture named sfaas_app*"])
    assert result.ret != 0
