"""The HTTP gateway's cost: the same calls through ``sfaas gateway`` and through the Kafka
client, interleaved, against one cluster.

    python -m benchmarks.runtime.gateway [--seconds 20] [--rate 1000] [--out FILE]

One 2-worker cluster (memonly, 8 partitions, rounds every 5 s) of the world app; one
``sfaas gateway`` process in front of it (started with the CLI, like a user's). An open
loop offers ``kv.put`` at ``--rate`` requests/s in total, alternating request by request
between the Kafka :class:`~sfaas.client.Client` (in this process) and HTTP through the
gateway (keep-alive connections, this process), after a 3 s warm-up; prints each path's
p50/p99 and the gateway's extra latency (the target: p50 within 2 ms of the client's).
Needs Kafka and MinIO (``sfaas services up``; started here when down).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.runtime.world_app import on_cluster  # noqa: E402
from launcher.loadgen import percentile  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WARMUP_S = 3.0
#: Most HTTP connections the load opens (a request waits for a free one beyond).
MAX_CONNECTIONS = 256


class HttpPool:
    """Keep-alive HTTP/1.1 connections to one server, each used by one request at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.room = asyncio.Semaphore(MAX_CONNECTIONS)

    async def post(self, path: str, body: bytes | None) -> tuple[int, bytes]:
        """POST ``body`` to ``path`` (None: GET ``path``); ``(status, response body)``."""
        request = (b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode()
                   if body is None else
                   b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                   b"\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        async with self.room:
            while True:
                fresh = not self.idle
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port) \
                    if fresh else self.idle.pop()
                try:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    break
                except (asyncio.IncompleteReadError, ConnectionError):
                    writer.close()  # the server closed an idle connection: take another
                    if fresh:
                        raise
            lines = head.split(b"\r\n")
            size = next(int(v) for k, _, v in (ln.partition(b": ") for ln in lines[1:])
                        if k.lower() == b"content-length")
            data = await reader.readexactly(size)
            self.idle.append((reader, writer))
            return int(lines[0].split()[1]), data

    def close(self) -> None:
        for _, w in self.idle:
            w.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _gateway(s: Settings, port: int, log: Path, profile: str | None = None):  # type: ignore[no-untyped-def]
    # --profile: cProfile on CPU time (not wall time: waits for the CPU are not the code's)
    prof = ("import cProfile, sys, time; from launcher import main; "
            "p = cProfile.Profile(time.process_time); sys.argv[0] = 'sfaas'\n"
            f"try: p.runcall(main, sys.argv[1:])\nfinally: p.dump_stats({profile!r})")
    cmd = [sys.executable, *(["-c", prof] if profile else ["-m", "sfaas"]), "gateway", "--app", "benchmarks.runtime.world_app:app",
           "--listen", f"127.0.0.1:{port}", "--kafka", s.kafka, "--namespace", s.namespace]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "SFAAS_GATEWAY_TOKEN": ""})
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)  # (SIGINT: cProfile writes its file on the way out)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            ok = (await r.read()).startswith(b"HTTP/1.1 200")
            w.close()
            if ok:
                return
        await asyncio.sleep(0.1)
    raise SystemExit("the gateway did not answer /healthz in 60 s")


async def _open_loop(rate: float, seconds: float,
                     paths: list[Callable[[int], Awaitable[bool]]]) -> list[list[float]]:
    """Offer ``rate`` requests/s for ``seconds``, request ``i`` on ``paths[i % len]``; the
    latencies (ms) of each path's successful requests."""
    lat: list[list[float]] = [[] for _ in paths]
    failed = [0] * len(paths)
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        k = i % len(paths)
        t0 = time.perf_counter()
        if await paths[k](i):
            lat[k].append((time.perf_counter() - t0) * 1000)
        else:
            failed[k] += 1

    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(one(i))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    if any(failed):
        print(f"failed requests per path: {failed}", file=sys.stderr)
    return lat


async def _run(s: Settings, a: argparse.Namespace) -> dict[str, object]:
    port = _free_port()
    log = Path(tempfile.gettempdir()) / f"sfaas-gateway-bench-{port}.log"
    with _gateway(s, port, log, a.profile) as proc:
        await _wait_ready(port, proc, log)
        pool = HttpPool(port)
        async with Client("worldbench", settings=s, timeout=60, max_in_flight=20_000) as client:
            async def kafka(i: int) -> bool:
                return await client.call("kv", f"k{i % 10_000}", "put", i) == i

            async def http(i: int) -> bool:
                status, body = await pool.post(f"/v1/worldbench/kv/k{i % 10_000}/put",
                                               b'{"args":[%d]}' % i)
                return status == 200 and json.loads(body) == {"result": i}

            async def healthz(i: int) -> bool:
                return (await pool.post("/healthz", None))[0] == 200

            paths = [kafka, http, healthz] if a.healthz else [kafka, http]
            await _open_loop(a.rate, WARMUP_S, paths)
            cpu0 = _cpu_seconds(proc.pid)
            kl, hl, *rest = (sorted(x) for x in await _open_loop(a.rate, a.seconds, paths))
            cpu = _cpu_seconds(proc.pid) - cpu0
            inside = _inside_p50(port)
        pool.close()
    k50, k99, h50, h99 = (percentile(kl, 0.5), percentile(kl, 0.99), percentile(hl, 0.5),
                          percentile(hl, 0.99))
    return {"benchmark": "gateway", "rate": a.rate, "seconds": a.seconds,
            "kafka_requests": len(kl), "http_requests": len(hl),
            "kafka_p50_ms": round(k50, 2), "kafka_p99_ms": round(k99, 2),
            "gateway_p50_ms": round(h50, 2), "gateway_p99_ms": round(h99, 2),
            "p50_difference_ms": round(h50 - k50, 2), "p99_difference_ms": round(h99 - k99, 2),
            "gateway_cpu_us_per_request": round(cpu / max(1, len(hl)) * 1e6),
            "gateway_inside_p50_ms": inside,
            **({"healthz_p50_ms": round(percentile(rest[0], 0.5), 2),
                "healthz_p99_ms": round(percentile(rest[0], 0.99), 2)} if rest else {})}


def _inside_p50(port: int) -> float:
    """The p50 (ms) of the calls' time inside the gateway (arrival to response), from its
    /metrics histogram (interpolated within a bucket, warm-up included: a rough figure)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from sfaas.runtime.metrics import quantile

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    cumulative: list[tuple[float, float]] = []
    for fam in text_string_to_metric_families(text):
        if fam.name == "sfaas_gateway_request_seconds":
            cumulative = [(float(s.labels["le"]), s.value) for s in fam.samples
                          if s.name.endswith("_bucket")
                          and s.labels["route"] == "/v1/{app}/{operator}/{key}/{function}"]
    bounds = [b for b, _ in cumulative if b != float("inf")]
    counts = [int(n - (cumulative[i - 1][1] if i else 0)) for i, (_, n) in enumerate(cumulative)]
    p50 = quantile(bounds, counts, 0.5)
    return round(p50 * 1000, 2) if p50 is not None else float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests/s, both paths together")
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--out", help="append the JSON point to this file")
    ap.add_argument("--profile", help="run the gateway under cProfile, writing this file")
    ap.add_argument("--healthz", action="store_true",
                    help="a third path in turn: GET /healthz (the HTTP hop alone, no Kafka)")
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.rate <= 0:
        ap.error("--seconds and --rate must be positive")
    import uvloop

    # both paths' client side on uvloop, like the gateway's own loop: the comparison is then
    # about the hop through the gateway, not this driver's loop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    point, probe = on_cluster("gw", a.kafka, lambda s: _run(s, a))
    point.update({**probe, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    print(f"Kafka client  p50 {point['kafka_p50_ms']} ms  p99 {point['kafka_p99_ms']} ms\n"
          f"gateway       p50 {point['gateway_p50_ms']} ms  p99 {point['gateway_p99_ms']} ms\n"
          f"difference    p50 {point['p50_difference_ms']} ms  "
          f"p99 {point['p99_difference_ms']} ms  (target: p50 within 2 ms)")
    print(json.dumps(point), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(point) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
