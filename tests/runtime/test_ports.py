"""The process's ports (``sfaas.runtime.ports``): the real ones by default, another set for
the tasks of a context made for it, and never leaking from one context to another."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from sfaas.runtime import ports
from sfaas.runtime.ports import REAL, AioKafka, MinioObjects, SystemClock, TcpNetwork


def test_the_real_ports_are_aiokafka_minio_tcp_and_the_system_clock() -> None:
    assert isinstance(REAL.kafka, AioKafka) and isinstance(REAL.objects, MinioObjects)
    assert isinstance(REAL.network, TcpNetwork) and isinstance(REAL.clock, SystemClock)
    assert ports.current() is REAL
    with pytest.raises(dataclasses.FrozenInstanceError):
        REAL.kafka = AioKafka()  # type: ignore[misc]
    before = time.monotonic()
    assert before <= REAL.clock.monotonic() <= time.monotonic()


def test_a_context_gives_its_tasks_other_ports_and_no_one_else() -> None:
    class Clock:
        def monotonic(self) -> float:
            return 7.0

        def time(self) -> float:
            return 8.0

    other = dataclasses.replace(REAL, clock=Clock())
    seen: dict[str, float] = {}

    async def process(name: str) -> None:
        await asyncio.sleep(0)
        child = asyncio.get_running_loop().create_task(asyncio.sleep(0, ports.current()))
        seen[name] = ports.current().clock.monotonic()
        assert await child is ports.current()  # (tasks it creates inherit its ports)

    async def main() -> None:
        await asyncio.gather(
            asyncio.get_running_loop().create_task(process("sim"), context=ports.context(other)),
            process("real"))
        assert ports.current() is REAL

    asyncio.run(main())
    assert seen["sim"] == 7.0 and seen["real"] != 7.0
    assert ports.current() is REAL


def test_the_product_imports_no_simulator() -> None:
    import subprocess
    import sys

    code = ("import sys, sfaas, sfaas.runtime.ports, worker.service, coordinator.service; "
            "print(sorted(m for m in sys.modules if m.startswith('sfaas.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
