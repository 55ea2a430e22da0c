"""Where the Kafka broker's CPU per transaction goes: its requests per transaction, by kind.

Runs one YCSB-T point (2 workers, rounds every second and the epoch log on, as
``bench.py``) twice on the running broker:

1. plain: the broker's CPU (user and system) and context switches over the middle of the
   run, from ``/proc`` — per transaction and per request;
2. with the broker's request logger at DEBUG (set at runtime, set back to INFO after):
   every request it completed in the same part of the run, counted by API and by what it
   carries (``in``: the ingress topic, ``out``: replies, ``epochs``: the epoch log).

    python benchmarks/runtime/broker_requests.py                       # memonly, 10K keys, 1,000 TPS
    python benchmarks/runtime/broker_requests.py --store lsm --seconds 16

Kafka and MinIO must be running (``sfaas services up``). The request log is large (about
3 MB a second at 1,000 TPS) and the broker keeps 80 MB of it, so runs stay short.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime.bench import cleanup, one_point  # noqa: E402
from launcher import cluster, services  # noqa: E402
from launcher.procs import ServiceSettings  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

SKIP_HEAD = 4.0  # seconds of the run left out at its start (the window's start) ...
SKIP_TAIL = 1.5  # ... and at its end


def _broker() -> psutil.Process:
    pid = services.status().get("kafka", {}).get("pid")
    if not pid:
        raise SystemExit("Kafka is not running: start it with `sfaas services up`")
    return psutil.Process(int(pid))


def set_request_log(level: str) -> None:
    """The broker's ``kafka.request.logger`` level, changed at runtime (not persisted)."""
    ss = ServiceSettings.from_env()
    res = subprocess.run(
        ["java", "-cp", f"{ss.kafka_libs}/*", "kafka.admin.ConfigCommand", "--bootstrap-server",
         f"127.0.0.1:{ss.kafka_port}", "--entity-type", "broker-loggers", "--entity-name", "1", "--alter",
         "--add-config", f"kafka.request.logger={level}"],
        capture_output=True, text=True, timeout=120,
    )
    if res.returncode != 0:
        raise SystemExit(f"setting the broker's request logger to {level} failed:\n{res.stderr[-2000:]}")


def _sample(broker: psutil.Process) -> tuple[float, float, int]:
    """The broker's (user s, system s, context switches) so far."""
    t = broker.cpu_times()
    switches = 0  # summed over its threads (psutil counts only the main thread's)
    for status in Path(f"/proc/{broker.pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # a thread that ended
            continue
        switches += sum(int(ln.split()[1]) for ln in lines if "ctxt_switches:" in ln)
    return t.user, t.system, switches


def _point(args: argparse.Namespace, window: dict) -> dict:
    """One bench point; ``window`` gets the wall-clock bounds and broker samples of its middle."""
    s = Settings.load({"namespace": f"breq{uuid.uuid4().hex[:8]}", "store": args.store,
                       "snapshot_interval": args.snapshot_interval})
    os.environ["SFAAS_STORE"] = args.store
    broker = _broker()
    cluster.up(s, "examples.ycsbt:app", 2, timeout=120)
    try:
        def watch() -> None:
            # one_point warms up for 2 s before its measured run starts
            time.sleep(2.0 + SKIP_HEAD)
            window["start"], window["a"] = time.time(), _sample(broker)
            time.sleep(args.seconds - SKIP_HEAD - SKIP_TAIL)
            window["end"], window["b"] = time.time(), _sample(broker)

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        point = asyncio.run(one_point(s, args.rate, args.seconds, args.keys, "uniform"))
        th.join()
    finally:
        cluster.down(s)
        cleanup(s)
    return point


def _role(topic: str, prefix: str = "breq") -> str:
    return topic.rsplit(".", 1)[-1] if topic.startswith(prefix) else "other"


#: the client's port in a request line's ``"connection":"BROKER:PORT-CLIENT:PORT-…"``
_CONNECTION = re.compile(r'"connection":"[^"-]*-[^"-]*:(\d+)-')


@dataclass
class RequestCount:
    """Requests the broker completed in a window, from its request log."""

    #: by ``"API roles"`` (roles: the last part of the topic names, ``other`` outside the prefix)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    #: requests of other connections than the ports asked for (someone else's load: noise)
    foreign: int = 0
    #: the log's oldest line is younger than the window's start: lines of it were rolled away
    truncated: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _stamp(t: float) -> str:
    """``t`` (epoch seconds) as the broker's log writes its time (local time)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"


def count_requests(start: float, end: float, prefix: str = "breq", ports: Collection[int] | None = None) -> RequestCount:
    """Requests the broker completed between ``start`` and ``end`` (epoch seconds), by API
    and topic roles (topics named ``{prefix}…``); ``ports``: only the requests of the
    connections from these client ports (the others are counted as ``foreign``)."""
    logs = ServiceSettings.from_env().service_dir("kafka") / "logs"
    t0, t1 = _stamp(start), _stamp(end)
    out = RequestCount()
    oldest = None
    for path in sorted(logs.glob("server.log*")):
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("[") and (oldest is None or line[1:24] < oldest):
                    oldest = line[1:24]
                if "Completed request" not in line or not (t0 <= line[1:24] <= t1):
                    continue
                m = _CONNECTION.search(line)
                if ports is not None and (m is None or int(m[1]) not in ports):
                    out.foreign += 1
                    continue
                out.counts[_kind(json.loads(line[line.index("{"):line.rindex("}") + 1]), prefix)] += 1
    out.truncated = oldest is None or oldest > t0
    return out


def _kind(d: dict[str, Any], prefix: str) -> str:
    """``"API roles"`` of one logged request: its topics from the request, or from the
    response where the log leaves the request out (Kafka 4 logs a fetch's as ``""``)."""
    api = d["requestHeader"]["requestApiKeyName"]
    req, resp = d.get("request"), d.get("response")
    topics: list[Any] = []
    if isinstance(req, dict):
        topics = req.get("topicData") or req.get("topics") or []
    if not topics and isinstance(resp, dict):
        topics = resp.get("responses") or []
    names = {str(t.get("name") or t.get("topic") or "") for t in topics if isinstance(t, dict)}
    roles = sorted({_role(n, prefix) for n in names if n})
    return f"{api} {'+'.join(roles)}".strip()


class PortWatcher:
    """The client ports of the connections that the processes ``pids`` hold to the broker,
    sampled every ``every`` seconds in a thread between ``start()`` and ``stop()`` (a
    request log line names its connection by them)."""

    def __init__(self, pids: Collection[int], broker_port: int, every: float = 0.5) -> None:
        self.pids, self.broker_port, self.every = list(pids), broker_port, every
        self.ports: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for pid in self.pids:
            try:
                proc = psutil.Process(pid)
                pids = [proc.pid] + [c.pid for c in proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in pids:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    for c in psutil.Process(p).net_connections(kind="tcp"):
                        if c.raddr and c.raddr.port == self.broker_port:
                            self.ports.add(c.laddr.port)

    def _run(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(self.every)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join()
        self.sample()
        return self.ports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="memonly")
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=14.0, help="measured run per pass (≤ 20: the log rolls)")
    ap.add_argument("--snapshot-interval", type=float, default=1.0)
    args = ap.parse_args()
    if not 2 * (SKIP_HEAD + SKIP_TAIL) < args.seconds <= 20:
        ap.error(f"--seconds must be in ({2 * (SKIP_HEAD + SKIP_TAIL)}, 20], got {args.seconds}")

    plain: dict = {}
    p1 = _point(args, plain)
    secs = plain["end"] - plain["start"]
    txns = p1["committed_tps"] * secs
    user, system, ctx = (b - a for a, b in zip(plain["a"], plain["b"], strict=True))

    logged: dict = {}
    set_request_log("DEBUG")
    try:
        p2 = _point(args, logged)
    finally:
        set_request_log("INFO")
    counts = count_requests(logged["start"], logged["end"]).counts
    txns2 = p2["committed_tps"] * (logged["end"] - logged["start"])
    per_txn = sum(counts.values()) / txns2

    print(f"\n{args.store}, {args.keys:,} keys, {args.rate:,.0f} TPS, rounds every {args.snapshot_interval} s; "
          f"{secs:.1f} s of each run's middle")
    print(f"broker CPU per transaction: {1e6 * (user + system) / txns:.0f} µs "
          f"(user {1e6 * user / txns:.0f}, system {1e6 * system / txns:.0f}); "
          f"context switches per transaction: {ctx / txns:.1f}; p50/p99 {p1['p50_ms']}/{p1['p99_ms']} ms")
    print(f"requests per transaction: {per_txn:.2f} (second run, logging on); "
          f"so ≈ {1e6 * (user + system) / txns / per_txn:.0f} µs of broker CPU and "
          f"{ctx / txns / per_txn:.1f} context switches per request\n")
    print("| request | carries | per transaction |\n|---|---|---|")
    for key, n in counts.most_common():
        api, _, roles = key.partition(" ")
        print(f"| {api} | {roles or '–'} | {n / txns2:.2f} |")


if __name__ == "__main__":
    main()
