"""LocalRunner's one testing model: every verb blocks and returns its value, its ``a*`` twin
is a coroutine for any event loop, both on one runner; the caller's exception comes first."""

from __future__ import annotations

import asyncio
import gc
import random
import shutil
import threading
import traceback
from collections.abc import AsyncIterator, Iterator

import pytest

from examples import bank
from sfaas import Abort, App, BadKey, Context, TransactionAborted, UnknownOperator
from sfaas.testing import LocalRunner
from sfaas.testing.loop_thread import LoopThread

pytestmark = pytest.mark.timeout(60)

ACCOUNTS = [f"acct{i}" for i in range(12)]


@pytest.fixture
def bank_runner() -> Iterator[LocalRunner]:
    """A runner made, funded and closed by a sync fixture."""
    with LocalRunner(bank.app, store="memonly", workers=2, partitions=4) as r:
        r.gather(*[("accounts", a, "deposit", 100) for a in ACCOUNTS])
        yield r


@pytest.fixture
async def async_made_runner() -> AsyncIterator[LocalRunner]:
    """A runner made, funded and closed by an async fixture (on pytest-asyncio's loop)."""
    async with LocalRunner(bank.app, store="memonly") as r:
        await r.agather(*[("accounts", a, "deposit", 100) for a in ACCOUNTS])
        yield r


def _runner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sfaas-runner"]


def test_blocking_verbs_return_values_in_plain_code(bank_runner: LocalRunner) -> None:
    r = bank_runner
    got = r.gather(("accounts", "acct0", "transfer", "acct1", 30),
                   ("accounts", "acct2", "withdraw", 500),
                   return_exceptions=True)
    assert isinstance(got, list) and got[0] == 70
    assert isinstance(got[1], TransactionAborted) and "insufficient funds" in str(got[1])
    assert r.gather() == []
    assert r.get("accounts", "acct1") == 130 and r.state("accounts", "acct1") == 130
    assert r.scan("accounts", "acct1", limit=3) == [("acct1", 130), ("acct10", 100),
                                                    ("acct11", 100)]
    assert sum(r.items("accounts").values()) == 100 * len(ACCOUNTS)
    assert r.advance(1) is None and r.drain() is None


async def test_a_sync_fixtures_runner_serves_an_async_test(bank_runner: LocalRunner) -> None:
    r = bank_runner
    assert await r.acall("accounts", "acct0", "transfer", "acct1", 10) == 90
    assert await r.agather(("accounts", "acct2", "deposit", 5),
                           ("accounts", "acct3", "withdraw", 1)) == [105, 99]
    assert await r.aget("accounts", "acct1") == 110
    assert await r.astate("accounts", "nobody", "none") == "none"
    assert (await r.ascan("accounts", "acct0")) == [("acct0", 90)]
    assert sum((await r.aitems("accounts")).values()) == 100 * len(ACCOUNTS) + 4
    before = r.now()
    await r.aadvance(60)
    await r.adrain()
    assert r.now() - before >= 60
    # a blocking verb inside a running loop works too (it stops this loop meanwhile)
    assert r.call("accounts", "acct0", "balance") == 90


def test_an_async_fixtures_runner_serves_a_plain_test(async_made_runner: LocalRunner) -> None:
    r = async_made_runner
    assert r.call("accounts", "acct0", "transfer", "acct1", 1) == 99
    assert r.items("accounts")["acct1"] == 101


def test_one_runner_serves_several_event_loops_in_turn() -> None:
    with LocalRunner(bank.app, store="memonly") as r:
        r.call("accounts", "a", "deposit", 10)
        for _ in range(3):  # each asyncio.run is a new loop; the runner keeps its own
            assert asyncio.run(r.acall("accounts", "a", "deposit", 1)) in (11, 12, 13)
            r.call("accounts", "b", "deposit", 1)
        assert r.items("accounts") == {"a": 13, "b": 3}


def _faulty_app() -> App:
    app = App("faulty")
    cards = app.operator("cards", store="memonly")

    def check(number: str) -> None:
        raise ValueError(f"card number {number} invalid")

    @cards.function
    async def pay(ctx: Context, number: str) -> None:
        ctx.put(1)
        check(number)

    @cards.function
    async def refuse(ctx: Context) -> None:
        raise Abort("refused on purpose")

    return app


def _first_exception_line(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return next(line for line in lines if line and not line.startswith((" ", "Traceback")))


@pytest.mark.parametrize("form", ["blocking", "async"])
def test_the_users_exception_comes_first_in_the_traceback(form: str) -> None:
    with LocalRunner(_faulty_app()) as r:
        for function, args, says in [("pay", ("12ab",), "ValueError: card number 12ab invalid"),
                                     ("refuse", (), "refused on purpose")]:
            with pytest.raises(TransactionAborted) as info:
                if form == "blocking":
                    r.call("cards", "c", function, *args)
                else:
                    asyncio.run(r.acall("cards", "c", function, *args))
            exc = info.value
            assert exc.__context__ is None and exc.__cause__ is None, repr(exc.__context__)
            text = "".join(traceback.format_exception(exc))
            assert "During handling" not in text and "RuntimeError" not in text, text
            assert "loop_thread.py" not in text and "concurrent" not in text, text  # (short)
            first = _first_exception_line(exc)
            assert first.startswith("sfaas.errors.TransactionAborted") and says in first, text
        # the function's own traceback is still attached, and printed as a note
        assert exc.traceback is None  # (an Abort is no bug)
        with pytest.raises(TransactionAborted) as info:
            r.call("cards", "c", "pay", "9x")
        assert info.value.traceback is not None and "in check" in info.value.traceback
        assert any("in check" in n for n in info.value.__notes__)


def test_a_bad_input_raises_on_the_callers_thread_and_names_it() -> None:
    with LocalRunner(bank.app, store="memonly") as r:
        with pytest.raises(TypeError, match=r"gather takes requests as tuples \(operator, key, "
                                            r"function, \*args\) or \(handle, key, \*args\); "
                                            r"request 1 is 'accounts' \(str\)"):
            r.gather(("accounts", "a", "deposit", 1), "accounts")
        with pytest.raises(TypeError, match=r"request 0 is \[\(.*\(list\) — pass each request "
                                            r"as its own argument: gather\(\*requests\)"):
            r.gather([("accounts", "a", "deposit", 1)])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"request 0 is \('accounts', 'a'\) \(tuple\)"):
            asyncio.run(r.agather(("accounts", "a")))
        with pytest.raises(UnknownOperator, match="nope"):
            r.gather(("accounts", "a", "deposit", 1), ("nope", "a", "deposit", 1))
        assert r.items("accounts") == {}  # nothing ran
        got = r.gather(("accounts", "a", "deposit", 1), ("accounts", 5, "deposit", 1),
                       return_exceptions=True)
        assert got[0] == 1 and isinstance(got[1], BadKey)
        with pytest.raises(ValueError, match="advance needs seconds >= 0, got -1"):
            r.advance(-1)
        with pytest.raises(BadKey):
            asyncio.run(r.aget("accounts", ""))


@pytest.mark.parametrize("how", ["with", "async with", "never used"])
def test_close_leaves_no_thread_and_refuses_later_calls(how: str) -> None:
    assert not _runner_threads()
    if how == "with":
        with LocalRunner(bank.app, store="memonly") as r:
            r.call("accounts", "a", "deposit", 1)
            assert len(_runner_threads()) == 1
    elif how == "async with":
        async def use() -> LocalRunner:
            async with LocalRunner(bank.app, store="memonly") as runner:
                await runner.acall("accounts", "a", "deposit", 1)
                assert len(_runner_threads()) == 1
            return runner
        r = asyncio.run(use())
    else:
        r = LocalRunner(bank.app, store="memonly")
        r.close()
    assert not _runner_threads()
    r.close()  # again: nothing
    with pytest.raises(RuntimeError, match="LocalRunner is closed"):
        r.call("accounts", "a", "deposit", 1)
    with pytest.raises(RuntimeError, match="LocalRunner is closed"):
        asyncio.run(r.aitems("accounts"))


def test_a_runner_dropped_unclosed_does_not_keep_its_thread() -> None:
    r = LocalRunner(bank.app, store="memonly")
    r.call("accounts", "a", "deposit", 1)
    directory = r.directory
    assert len(_runner_threads()) == 1
    del r
    gc.collect()
    assert not _runner_threads()
    shutil.rmtree(directory, ignore_errors=True)


def test_a_blocking_call_on_the_runners_own_thread_refuses_instead_of_hanging() -> None:
    t = LoopThread("sfaas-test-loop")

    async def nested() -> str:
        with pytest.raises(RuntimeError, match="would wait for itself"):
            t.run(asyncio.sleep(0))
        return str(await t.arun(asyncio.sleep(0, "the async form works there")))

    try:
        assert t.run(nested()) == "the async form works there"
    finally:
        t.stop()
    assert t.thread is None and not [x for x in threading.enumerate() if x.name == t.name]


def test_threads_and_event_loops_share_one_runner_and_reads_see_whole_epochs(
        bank_runner: LocalRunner) -> None:
    """Plain threads call, a coroutine gathers and a reader reads, all at once: money is
    conserved in every read (none sees half an epoch) and at the end."""
    r, total = bank_runner, 100 * len(ACCOUNTS)
    errors: list[BaseException] = []
    sums: list[int] = []
    done = threading.Event()

    def caller(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(25):
            a, b = rnd.sample(ACCOUNTS, 2)
            try:
                r.call("accounts", a, "transfer", b, rnd.randint(1, 40))
            except TransactionAborted:
                pass
            except BaseException as e:  # (reported by the main thread)
                errors.append(e)

    def reader() -> None:
        while not done.is_set():
            sums.append(sum(r.items("accounts").values()))

    async def gatherer() -> list[object]:
        rnd = random.Random(99)
        return await r.agather(*[("accounts", rnd.choice(ACCOUNTS), "transfer",
                                  rnd.choice(ACCOUNTS), rnd.randint(1, 40)) for _ in range(150)],
                               return_exceptions=True)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    try:
        results = asyncio.run(gatherer())
    finally:
        for t in threads[:-1]:
            t.join(30)
        done.set()
        threads[-1].join(30)
    assert not errors, errors
    assert all(isinstance(x, (int, TransactionAborted)) for x in results), results
    assert sums and set(sums) == {total}, sorted(set(sums))
    balances = r.items("accounts")
    assert sum(balances.values()) == total and min(balances.values()) >= 0
