"""Reply gaps of the HA compose cluster, one fault at a time (issue 33's targets).

    python -m benchmarks.cluster.failover [--rate 200] [--repeats 2] [--window 20] [--faults ...]

Starts docker-compose.ha.yml (3 brokers at RF 3 / min ISR 2, MinIO on 4 nodes, a
coordinator, 3 workers with a standby each; images from ``./run images``) on free host ports,
runs deposits of the bank example at ``--rate`` requests/s from the host, and injects one
fault at a time, ``--repeats`` times each, with quiet time between:

- ``broker``       a Kafka broker stopped (``docker stop -t 0``), started again 10 s later
- ``minio``        a MinIO node stopped, started again 10 s later
- ``pause``        a primary worker paused (``docker pause``) for 6 s (3× the heartbeat timeout)
- ``cut-control``  a primary worker cut from the coordinator and its peers for 6 s
- ``cut-data``     a primary worker cut from Kafka and MinIO for 6 s
- ``cut-broker``   a Kafka broker cut from the other brokers and every client for 6 s
- ``kill``         a primary worker's process SIGKILLed

For each, the workers the coordinator lost meanwhile and why, the largest gap between consecutive replies from 1 s before the fault to
``--window`` s after it (the targets: ≤ 2 s for a broker or a MinIO node, ≤ 3 s for a paused or
partitioned worker), and the longest any request sent in that window waited for its reply:
a fault that stalls only some partitions (a worker cut from Kafka, whose partitions' requests
wait in Kafka while the others' replies go on) shows there, not in the gap. With each gap,
the cores the host was busy over it and the four busiest containers (``cpuacct`` of cgroup
v1, sampled every 0.2 s): on this 2-core machine a gap can be a recovery waiting for a core.
Prints a table and writes it as JSON to ``--out`` (``--logs FILE``: the services' logs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher import containers  # noqa: E402
from launcher.compose_project import ROOT, Compose, compose, wait_ready  # noqa: E402
from launcher.procs import ServiceSettings  # noqa: E402
from sfaas.client import Client  # noqa: E402

FAULTS = ["broker", "minio", "pause", "cut-control", "cut-data", "cut-broker", "kill"]


def primaries(c: Compose) -> dict[int, str]:
    """slot → the service now serving it (from the coordinator's log)."""
    out: dict[int, str] = {}
    for line in c.run("logs", "--no-color", "coordinator").splitlines():
        m = re.search(r"worker (\S+) \(pid \d+\) (?:registered as|replaces lost worker) (\d+)", line)
        if m:
            out[int(m.group(2))] = m.group(1)
    return out


class CpuSampler:
    """Every 0.2 s: the host's busy CPU time (``/proc/stat``) and each container's
    (cgroup v1 ``cpuacct.usage``), so a gap can be told apart from a starved machine."""

    def __init__(self, c: Compose) -> None:
        self.ids = {svc: c.container(svc) for svc in c.run("ps", "--services").split()}
        self.samples: list[tuple[float, float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")
        self._thread.start()

    @staticmethod
    def _host_busy() -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            per: dict[str, float] = {}
            for svc, cid in self.ids.items():
                try:
                    with open(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage") as f:
                        per[svc] = int(f.read()) / 1e9
                except OSError:
                    pass
            self.samples.append((time.monotonic(), self._host_busy(), per))

    def between(self, t0: float, t1: float) -> dict[str, object]:
        """Cores busy on the host, and the 4 busiest containers' cores, from ``t0`` to ``t1``."""
        inside = [x for x in self.samples if t0 - 0.2 <= x[0] <= t1 + 0.2]
        if len(inside) < 2:
            return {}
        (a, ha, pa), (b, hb, pb) = inside[0], inside[-1]
        wall = b - a
        top = sorted(((svc, (pb[svc] - pa[svc]) / wall) for svc in pb if svc in pa),
                     key=lambda x: -x[1])[:4]
        return {"host_cores_busy": round((hb - ha) / wall, 2), "cores": os.cpu_count(),
                "top": [(svc, round(v, 2)) for svc, v in top]}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def lost_workers(c: Compose) -> list[str]:
    """Why the coordinator lost each worker so far (its log's "lost worker" lines)."""
    return [m.group(1) for line in c.run("logs", "--no-color", "coordinator").splitlines()
            if (m := re.search(r"lost worker \d+ \((.*)", line))]


async def inject(c: Compose, fault: str, rnd: random.Random) -> str:
    def docker(*args: str) -> str:
        return c.docker(*args)

    if fault in ("broker", "minio"):
        svc = rnd.choice(["kafka-1", "kafka-2", "kafka-3"] if fault == "broker"
                         else [f"minio-{i}" for i in range(1, 5)])
        cid = c.container(svc)
        await asyncio.to_thread(docker, "stop", "-t", "0", cid)
        await asyncio.sleep(10)
        await asyncio.to_thread(docker, "start", cid)
        return svc
    if fault == "cut-broker":
        svc = rnd.choice(["kafka-1", "kafka-2", "kafka-3"])
        again = await asyncio.to_thread(c.cut, svc, "data")
        await asyncio.sleep(6)
        await asyncio.to_thread(docker, *again)
        return svc
    svc = rnd.choice(sorted(primaries(c).values()))
    cid = c.container(svc)
    if fault == "kill":
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", cid).strip())
        os.kill(pid, signal.SIGKILL)
    elif fault == "pause":
        await asyncio.to_thread(docker, "pause", cid)
        await asyncio.sleep(6)
        await asyncio.to_thread(docker, "unpause", cid)
    else:
        again = await asyncio.to_thread(c.cut, svc, "control" if fault == "cut-control"
                                        else "data")
        await asyncio.sleep(6)
        await asyncio.to_thread(docker, *again)
    return svc


async def run(c: Compose, a: argparse.Namespace) -> list[dict[str, object]]:
    rnd = random.Random(a.seed)
    arrivals: list[float] = []
    waits: list[tuple[float, float]] = []  # (sent, seconds until its reply)
    rows: list[dict[str, object]] = []
    async with Client("bank", settings=c.client_settings(), timeout=120,
                      max_in_flight=100_000) as cl:
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            t0 = time.monotonic()
            while not stop.is_set():
                i += 1
                sent = time.monotonic()
                f = await cl.submit("accounts", f"a{i % 1000}", "deposit", 1)

                def done(_f: object, sent: float = sent) -> None:
                    now = time.monotonic()
                    arrivals.append(now)
                    waits.append((sent, now - sent))
                f.add_done_callback(done)
                await asyncio.sleep(max(0.0, t0 + i / a.rate - time.monotonic()))

        cpu = CpuSampler(c)
        loader = asyncio.create_task(load())
        await asyncio.sleep(10)  # warm
        for fault in [f for f in a.faults for _ in range(a.repeats)]:
            t = time.monotonic()
            lost_before = len(lost_workers(c))
            what = await inject(c, fault, rnd)
            await asyncio.sleep(max(0.0, t + a.window - time.monotonic()))
            seen = sorted(x for x in arrivals if t - 1 <= x <= t + a.window)
            pairs = list(zip(seen, seen[1:], strict=False))
            gap_at = max(pairs, key=lambda xy: xy[1] - xy[0], default=(t, t + a.window))
            gap = gap_at[1] - gap_at[0]
            busy = cpu.between(*gap_at)
            wait = max((w for sent, w in waits if t - 1 <= sent <= t + a.window), default=0.0)
            lost = lost_workers(c)[lost_before:]
            rows.append({"fault": fault, "target": what, "gap_s": round(gap, 2),
                         "longest_wait_s": round(wait, 2), "replies": len(seen),
                         "workers_lost": lost, "cpu_in_gap": busy})
            print(f"{fault:12} {what:18} largest reply gap {gap:6.2f} s, longest wait "
                  f"{wait:6.2f} s ({len(seen)} replies in the window); workers lost: "
                  f"{lost or 'none'}; CPU in the gap: {busy}", flush=True)
            await asyncio.sleep(a.quiet)
        stop.set()
        await loader
        cpu.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0, help="requests/s (default 200)")
    p.add_argument("--repeats", type=int, default=2, help="times each fault runs (default 2)")
    p.add_argument("--window", type=float, default=20.0, help="seconds measured after a fault")
    p.add_argument("--quiet", type=float, default=8.0, help="seconds between faults")
    p.add_argument("--faults", nargs="*", default=FAULTS, choices=FAULTS)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "failover.json")
    p.add_argument("--logs", type=Path, default=None,
                   help="write every service's log at the end to this file")
    a = p.parse_args()
    cache = ServiceSettings.from_env().cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    daemon = containers.ensure_docker(cache)  # (one this run started is stopped at its end)
    try:
        containers.build_images(cache)
        with compose([ROOT / "docker-compose.ha.yml"], kafka_brokers=3) as c:
            print(f"HA cluster ready in {wait_ready(c, workers=3, standbys=1):.1f} s", flush=True)
            try:
                rows = asyncio.run(run(c, a))
            finally:
                if a.logs is not None:
                    a.logs.write_text(c.logs(10_000_000, tail=100_000))
    finally:
        if daemon is not None:
            containers.stop_docker(daemon)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "rate": a.rate,
                                 "rows": rows}, indent=1))
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
