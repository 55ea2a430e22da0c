"""CPU per process over a measured window, for the runtime benchmarks (``bench.py``,
``cpu_ab.py``): the cluster's processes and the Kafka broker counted, the supervisor and
MinIO measured apart, the stores' background children and this process (the client and
its load generator) too, and the machine's other processes as noise."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from launcher import cluster, services
from sfaas.runtime.settings import Settings

__all__ = ["CpuMeter", "CpuWindow", "counted_processes", "cpu_shares"]


def counted_processes(settings: Settings) -> tuple[list[cluster.ProcessInfo], list[cluster.ProcessInfo]]:
    """The processes whose CPU a point counts — the cluster's live processes and the Kafka
    broker (it shares the same cores) — and those measured but kept apart: the cluster's
    supervisor and MinIO (pids None when sfaas did not start them)."""
    infos = [p for p in cluster.ps(settings) if p.alive]
    st = services.status()
    kafka_pid = st.get("kafka", {}).get("pid")
    if isinstance(kafka_pid, int):
        infos.append(cluster.ProcessInfo("kafka", kafka_pid, "", ""))
    apart = []
    sup = cluster.supervisor_pid(settings)
    if sup:
        apart.append(cluster.ProcessInfo("supervisor", sup, "", ""))
    minio_pid = st.get("minio", {}).get("pid")
    if isinstance(minio_pid, int):
        apart.append(cluster.ProcessInfo("minio", minio_pid, "", ""))
    return infos, apart


def _busy(t: Any) -> tuple[float, float]:
    """(busy, steal) seconds of the machine's ``psutil.cpu_times()`` (guest time is in user)."""
    return t.user + t.nice + t.system + t.irq + t.softirq, getattr(t, "steal", 0.0)


@dataclass
class CpuWindow:
    """CPU seconds (user + system) over one measured window."""

    wall: float
    #: per counted process, ``"{role}-{pid}"`` → seconds (a process gone by the end: left out)
    processes: dict[str, float]
    #: the same summed by role (``coordinator``, ``worker``, ``kafka``, …)
    roles: dict[str, float]
    #: the counted processes' children (the stores' merges, flushes and uploads)
    background: float
    #: this process: the client and its load generator
    client: float
    #: the processes kept apart, by role (``supervisor``, ``minio``)
    apart: dict[str, float]
    #: every process of the machine (``psutil.cpu_times()``), and the time the host took away
    machine: float
    steal: float

    @property
    def counted(self) -> float:
        """Seconds of every counted process: the roles, their children and the client."""
        return sum(self.roles.values()) + self.background + self.client

    @property
    def others(self) -> float:
        """Seconds of the machine's other processes (other users of the cores: noise)."""
        return max(0.0, self.machine - self.counted - sum(self.apart.values()))

    def as_dict(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall, 3), "roles": {k: round(v, 4) for k, v in self.roles.items()},
                "background": round(self.background, 4), "client": round(self.client, 4),
                "apart": {k: round(v, 4) for k, v in self.apart.items()}, "machine": round(self.machine, 4),
                "others": round(self.others, 4), "steal": round(self.steal, 4), "cpus": psutil.cpu_count()}


class CpuMeter:
    """Measures :class:`CpuWindow`: ``start()`` then ``stop()`` around the measured run."""

    def __init__(self, infos: Sequence[cluster.ProcessInfo], apart: Sequence[cluster.ProcessInfo] = ()) -> None:
        self._infos = [(i, psutil.Process(i.pid)) for i in infos]
        self._apart = [(i, psutil.Process(i.pid)) for i in apart]
        self._me = psutil.Process()

    @staticmethod
    def _times(procs: list[tuple[Any, psutil.Process]]) -> dict[int, float]:
        out = {}
        for _, p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                c = p.cpu_times()
                out[p.pid] = c.user + c.system
        return out

    def _children(self) -> list[tuple[None, psutil.Process]]:
        return [(None, c) for c in _background([p for _, p in self._infos]).values()]

    def start(self) -> None:
        self._bg0 = self._times(self._children())
        self._c0 = self._times(self._infos)
        self._a0 = self._times(self._apart)
        self._me0 = self._times([(None, self._me)])[self._me.pid]
        self._m0 = _busy(psutil.cpu_times())
        self._t0 = time.monotonic()

    def stop(self) -> CpuWindow:
        wall = time.monotonic() - self._t0
        c1 = self._times(self._infos)
        processes: dict[str, float] = {}
        roles: dict[str, float] = {}
        for info, p in self._infos:
            if p.pid in c1 and p.pid in self._c0:  # (the killed worker of --kill-at: not counted)
                used = c1[p.pid] - self._c0[p.pid]
                processes[f"{info.role}-{p.pid}"] = used
                roles[info.role] = roles.get(info.role, 0.0) + used
        bg1 = self._times(self._children())  # (a child started during the run: from 0)
        background = sum(v - self._bg0.get(pid, 0.0) for pid, v in bg1.items())
        a1 = self._times(self._apart)
        apart = {i.role: a1[p.pid] - self._a0[p.pid] for i, p in self._apart if p.pid in a1 and p.pid in self._a0}
        client = self._times([(None, self._me)])[self._me.pid] - self._me0
        m1 = _busy(psutil.cpu_times())
        return CpuWindow(wall, processes, roles, background, client, apart,
                         m1[0] - self._m0[0], m1[1] - self._m0[1])


def cpu_shares(used: CpuWindow, done: int) -> dict[str, dict[str, Any]]:
    """``cpu_percent`` (of a core, per process; the background and the load generator) and
    ``cpu_us_per_txn`` (summed over a role's processes) of a point."""
    wall = used.wall
    cpu = {name: round(s / wall * 100, 1) for name, s in used.processes.items()}
    cpu_us = {role: round(s * 1e6 / done) for role, s in used.roles.items()}
    cpu["background"] = round(used.background / wall * 100, 1)
    cpu_us["background"] = round(used.background * 1e6 / done)
    cpu["loadgen"] = round(used.client / wall * 100, 1)
    return {"cpu_percent": cpu, "cpu_us_per_txn": cpu_us}


def _background(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    """The background processes (``statestores._bgmain``) of the cluster's processes."""
    out = {}
    for p in procs:
        try:
            out.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    return out
