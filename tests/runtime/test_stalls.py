"""A service's event loop that stands still is reported with the code that held it, or as
a whole-process stall when the loop was only waiting (``launcher.stalls``): the nemesis saw
a coordinator silent for 1.8 s mid-recovery and no log said why."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.stalls import StallWatch


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # (a blocking call on the loop: what the report must name)


async def _watched(body: object, threshold: float = 0.3) -> StallWatch:
    watch = StallWatch(asyncio.get_running_loop(), threshold)
    watch.start()
    try:
        await body  # type: ignore[misc]
        await asyncio.sleep(0.3)  # (a tick after the stall: its end is logged)
    finally:
        watch.stop()
    return watch


@pytest.mark.timeout(30)
def test_a_held_loop_is_reported_with_the_code_holding_it(
        caplog: pytest.LogCaptureFixture) -> None:
    async def stall() -> None:
        await asyncio.sleep(0.3)
        _hold_the_loop(1.0)

    with caplog.at_level(logging.WARNING, "sfaas.stalls"):
        watch = asyncio.run(_watched(stall()))
    text = caplog.text
    assert watch.stacks == 1, text
    assert "held by" in text and "_hold_the_loop" in text and "time.sleep" in text, text
    assert "it waited, on a blocking call" in text, text  # (a sleep uses no CPU)
    ended = [r.getMessage() for r in caplog.records if "stood still for" in r.getMessage()]
    assert len(ended) == 1 and 0.9 <= float(ended[0].split()[-2]) <= 3.0, ended


@pytest.mark.timeout(30)
def test_a_busy_but_turning_loop_is_no_stall(caplog: pytest.LogCaptureFixture) -> None:
    async def busy() -> None:
        for _ in range(20):  # 2 s of 0.1 s turns: each under the threshold
            _hold_the_loop(0.1)
            await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, "sfaas.stalls"):
        watch = asyncio.run(_watched(busy(), threshold=1.0))
    assert watch.stacks == 0 and "held by" not in caplog.text, caplog.text


_FROZEN = """
import asyncio, logging, sys
from launcher.stalls import StallWatch
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")

async def main():
    watch = StallWatch(asyncio.get_running_loop(), 0.3)
    watch.start()
    print("ready", flush=True)
    await asyncio.sleep(4)
    watch.stop()

asyncio.run(main())
"""


@pytest.mark.timeout(30)
def test_a_frozen_process_is_reported_as_one_not_as_its_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _FROZEN], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(1.2)
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=20)
    assert "the whole process stood still" in out and "held by" not in out, out
    assert "the process did not run for 1." in out, out


@pytest.mark.timeout(30)
def test_c_code_that_keeps_the_gil_is_told_apart_from_a_frozen_process(
        caplog: pytest.LogCaptureFixture) -> None:
    n = 1
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.05:  # (size one C call to about a second of this CPU)
        n *= 2
        t0 = time.monotonic()
        sum(range(n))
    n = int(n / max(time.monotonic() - t0, 1e-3))

    async def stall() -> None:
        await asyncio.sleep(0.3)
        sum(range(n))  # one C call: neither the loop nor the watching thread runs

    with caplog.at_level(logging.WARNING, "sfaas.stalls"):
        watch = asyncio.run(_watched(stall()))
    assert watch.frozen == 1 and "held by code that kept the GIL" in caplog.text, caplog.text


def _spin(seconds: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass


@pytest.mark.timeout(30)
def test_a_loop_held_by_computing_is_not_said_to_wait(caplog: pytest.LogCaptureFixture) -> None:
    async def stall() -> None:
        await asyncio.sleep(0.3)
        _spin(1.0)  # Python code: the watching thread still gets the GIL

    with caplog.at_level(logging.WARNING, "sfaas.stalls"):
        watch = asyncio.run(_watched(stall()))
    assert watch.stacks == 1 and "_spin" in caplog.text, caplog.text
    assert "it waited" not in caplog.text, caplog.text
