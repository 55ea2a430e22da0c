"""A stopped broker's hung name lookups do not hold up every other lookup of a process
(``launcher.commands.size_resolver_pool``).

uvloop runs every ``getaddrinfo`` on libuv's thread pool, 4 threads by default. Each Kafka
client reconnecting to a stopped broker holds one for the resolver's timeout; with four of
them the live brokers' lookups waited too — the reachability probes among them — and the
coordinator replaced healthy workers as cut from Kafka (nemesis seed 3, "no Kafka broker
answered for 5.3 s" while one broker of three was stopped).

The test runs a process in a mount namespace of its own whose ``/etc/resolv.conf`` names a
DNS server that never answers (a UDP socket nobody reads from): six lookups of a name that
is not in ``/etc/hosts`` hang there, and the process then looks up ``localhost``. The
control (the pool at libuv's default) shows the hang reaches the lookup; with the pool
sized, it does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import asyncio, os, socket, sys, threading, time
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("127.0.0.2", 53))  # (it reads nothing: every query times out)
    if sys.argv[1] == "sized":
        from launcher.commands import size_resolver_pool
        size_resolver_pool()
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        hung = [asyncio.ensure_future(loop.getaddrinfo("kafka-1.stopped", 9092))
                for _ in range(6)]
        await asyncio.sleep(0.1)
        t = time.monotonic()
        await loop.getaddrinfo("localhost", 9092)
        print(f"{time.monotonic() - t:.3f}")
        for h in hung:
            h.cancel()

    uvloop.run(main())
""")


def _lookup_seconds(tmp_path: Path, mode: str) -> float:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.2\noptions timeout:1 attempts:1\n")
    prog = tmp_path / "lookup.py"
    prog.write_text(PROGRAM)
    script = (f"mount --bind {conf} /etc/resolv.conf && "
              f"exec {sys.executable} {prog} {mode}")
    env = {k: v for k, v in os.environ.items() if k != "UV_THREADPOOL_SIZE"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


def test_hung_lookups_of_a_stopped_broker_leave_other_lookups_alone(tmp_path: Path) -> None:
    control = _lookup_seconds(tmp_path, "default")
    assert control >= 0.8, f"the control's lookup took {control:.3f} s: no hang reproduced"
    sized = _lookup_seconds(tmp_path, "sized")
    assert sized < 0.5, f"localhost's lookup waited {sized:.3f} s behind the hung ones"
