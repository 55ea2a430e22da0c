"""A seeded nemesis against the highly available compose cluster (docker-compose.ha.yml: 3
Kafka brokers at replication 3 / min ISR 2, MinIO erasure-coded over 4 nodes, a coordinator,
3 workers with a standby each), under the chaos test's load (``tests.runtime.test_recovery``:
skewed transfers with overdraft aborts, counters whose bumps return the pre-value, clocks).

Faults, one after another at random moments, each lasting a few seconds:

- ``kill``      SIGKILL of a worker container's process (primary or standby) from the host,
                a crash: its restart policy restarts it (``docker kill`` would count as
                stopped by hand, and stay stopped)
- ``pause``     ``docker pause`` of a worker for 3× the heartbeat timeout, then unpause
- ``cut-data``  a worker cut from Kafka and MinIO only (``docker network disconnect`` of
                the ``data`` network), still talking to the coordinator and its peers
- ``cut-ctl``   a worker cut from the coordinator and its peers only (``control``)
- ``cut-coord`` the coordinator cut from every worker (``control``)
- ``cut-broker`` a Kafka broker cut from the other brokers and every client (``data``)
- ``broker``    a Kafka broker stopped, then started again
- ``minio``     a MinIO node stopped, then started again

Each fault must be seen to take effect (``tests.cluster.faults``: the pid gone, docker's
``Paused``/``Running`` state, the network gone from the container) or the run fails naming
it, as it does when a scheduled kind never took effect; the report gives per kind how many
fired and took effect.

Afterwards the chaos test's invariants: every request answered exactly once, each request id
once in the egress topic, money conserved and never negative, counters exact, the
committed history serializable and equal to what the clients saw.

``SFAAS_NEMESIS_SEED`` reproduces a schedule (the seed and the schedule are printed);
``SFAAS_NEMESIS_SECONDS`` sizes the run (90 s by default); ``SFAAS_NEMESIS_SCHEDULE`` replaces
the drawn schedule by one written out (``"5:cut-data worker-1 5.0; 20:kill worker-0 0"``,
to narrow a failed seed down) and ``SFAAS_NEMESIS_LOGS=1`` prints the containers' logs
after a passing run too.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import ROOT, Compose, compose, override, wait_ready
from tests.cluster.faults import FaultLog, Probe, process_halted
from tests.runtime.test_recovery import PARTITIONS, _scenario

SEED = int(os.environ.get("SFAAS_NEMESIS_SEED") or random.SystemRandom().randrange(1 << 32))
SECONDS = float(os.environ.get("SFAAS_NEMESIS_SECONDS") or 90)
HEARTBEAT_TIMEOUT = 1.0  # (the HA profile's)
WORKERS = [f"worker-{i}{s}" for i in range(3) for s in ("", "-standby")]
BROKERS = ["kafka-1", "kafka-2", "kafka-3"]
MINIOS = [f"minio-{i}" for i in range(1, 5)]
FAULTS = ["kill", "pause", "cut-data", "cut-ctl", "cut-coord", "cut-broker", "broker", "minio"]


def schedule(seed: int, seconds: float) -> list[tuple[float, str]]:
    """Faults one after another, each 4–9 s after the previous one, as ``(t, "fault target
    seconds")``: all drawn from the seed alone (the load draws from its own generator), so a
    seed replays its schedule exactly."""
    rnd = random.Random(seed)
    out, t = [], rnd.uniform(3, 6)
    while t < seconds - 4:
        fault = rnd.choice(FAULTS)
        target = {"cut-coord": "coordinator", "cut-broker": rnd.choice(BROKERS),
                  "broker": rnd.choice(BROKERS), "minio": rnd.choice(MINIOS)}.get(
                      fault, rnd.choice(WORKERS))
        lasts = 3 * HEARTBEAT_TIMEOUT if fault == "pause" else round(rnd.uniform(3, 6), 1)
        out.append((round(t, 2), f"{fault} {target} {lasts}"))
        t += rnd.uniform(4, 9)
    return out


class Nemesis:
    """Injects the faults into compose project ``c``, each confirmed to take effect."""

    #: how long a fault's effect may take to show (docker's state, a pid gone)
    confirm_timeout = 10.0
    #: how long a fault docker refuses to start is retried before the run fails
    start_retry = 15.0

    def __init__(self, c: Compose) -> None:
        self.c = c
        self.ids = {s: c.container(s) for s in [*WORKERS, *BROKERS, *MINIOS, "coordinator"]}

    def _docker(self, *args: str) -> None:
        self.c.docker(*args)

    def _state(self, cid: str, template: str) -> str:
        return self.c.docker("inspect", "-f", template, cid).strip()

    async def _start(self, log: FaultLog, kind: str, what: str, start: Callable[[], list[str]],
                     probe: Probe) -> list[str] | None:
        """Inject a fault: ``start()`` (its docker commands; it returns the ones that heal
        it), retried for a while when docker refuses (the container is restarting: e.g.
        "unable to freeze"), then its effect confirmed by ``probe`` in ``log``. None when
        it never started or never took effect: ``log`` then fails the run, naming it."""
        deadline, err = time.monotonic() + self.start_retry, ""
        while time.monotonic() < deadline:
            try:
                heal = await asyncio.to_thread(start)
            except AssertionError as e:
                err = str(e)
                await asyncio.sleep(0.5)
                continue
            return heal if await log.confirm(kind, what, probe, self.confirm_timeout) else None
        log.not_injected(kind, what, err)
        return None

    async def _heal(self, seconds: float, end: list[str], what: str) -> str:
        await asyncio.sleep(seconds)
        for attempt in range(30):
            try:
                await asyncio.to_thread(self._docker, *end)
                break
            except AssertionError:
                if attempt == 29:
                    raise
                await asyncio.sleep(1)
        return what

    async def _outage(self, log: FaultLog, fault: str, target: str, seconds: float) -> str:
        """A fault that lasts ``seconds``: a pause, a cut or a stop, then its healing."""
        cid = self.ids[target]
        start: Callable[[], list[str]]
        if fault == "pause":
            what = f"{target} paused for {seconds:.1f} s"

            def start() -> list[str]:
                self._docker("pause", cid)
                return ["unpause", cid]

            def probe() -> str | None:
                return "paused" if self._state(cid, "{{.State.Paused}}") == "true" else None
        elif fault.startswith("cut-"):
            net = "data" if fault in ("cut-data", "cut-broker") else "control"
            what = f"{target} cut from {net} for {seconds:.1f} s"

            def start() -> list[str]:  # (healed with its address and names: Compose.cut)
                return self.c.cut(target, net)

            def probe() -> str | None:
                nets = self._state(cid, "{{json .NetworkSettings.Networks}}")
                return f"off {net}" if f'"{self.c.network(net)}"' not in nets else None
        else:  # a broker or a MinIO node stopped, then started again
            what = f"{target} stopped for {seconds:.1f} s"

            def start() -> list[str]:
                self._docker("stop", "-t", "0", cid)
                return ["start", cid]

            def probe() -> str | None:
                return "stopped" if self._state(cid, "{{.State.Running}}") == "false" else None
        heal = await self._start(log, fault, what, start, probe)
        if heal is None:
            return f"{what}: did not take effect"
        return await self._heal(seconds, heal, what)

    async def fire(self, what: str, outages: list[asyncio.Task[str]], log: FaultLog) -> str | None:
        fault, target, lasts = what.split()
        if fault != "kill":
            outages.append(asyncio.create_task(self._outage(log, fault, target, float(lasts))))
            return what
        pid = int(self._state(self.ids[target], "{{.State.Pid}}"))
        if pid <= 0:
            return None  # (not running right now: try again in a moment)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # (it exited since: fenced, restarting)
            return None
        await log.confirm(fault, f"{target} killed (pid {pid})", process_halted(pid),
                          self.confirm_timeout)
        return f"killed {target} (pid {pid})"


def _ledger(tmp: Path) -> Path:
    """The override running the chaos test's ledger app (mounted) in every sfaas service."""
    apps = str(ROOT / "tests" / "runtime" / "apps")
    env = {"SFAAS_APP": "testapps.ledger:app", "SFAAS_STORE": "lsm",
           "SFAAS_PARTITIONS": str(PARTITIONS), "SFAAS_SNAPSHOT_INTERVAL": "1",
           "SFAAS_SNAPSHOT_RETAIN": "2", "SFAAS_CHECK_DETERMINISM": "1",
           "SFAAS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT)}
    services: dict[str, dict[str, Any]] = {
        s: {"environment": env, "volumes": [f"{apps}:/app/testapps:ro"]}
        for s in ["coordinator", "gateway", *WORKERS]}
    return override(tmp, services)


@pytest.mark.timeout(1500)
def test_the_ha_cluster_keeps_every_invariant_under_the_nemesis(images: None, tmp_path: Path) -> None:
    rnd = random.Random(SEED)  # the load's
    faults = schedule(SEED, SECONDS)
    if written := os.environ.get("SFAAS_NEMESIS_SCHEDULE"):
        faults = [(float(t), what.strip()) for t, what in
                  (step.split(":", 1) for step in written.split(";") if step.strip())]
    report: dict[str, object] = {"seed": SEED}
    print(f"nemesis seed {SEED} (rerun: SFAAS_NEMESIS_SEED={SEED}), schedule {faults}")
    with compose([ROOT / "docker-compose.ha.yml", _ledger(tmp_path)], kafka_brokers=3) as c:
        report["ready_s"] = round(wait_ready(c, workers=3, standbys=1), 1)
        nemesis = Nemesis(c)
        cs = c.client_settings()
        t0 = time.monotonic()
        try:
            asyncio.run(_scenario(cs, cs, rnd, report, tmp_path / "replay",
                                  faults=list(faults), fire=nemesis.fire, seconds=SECONDS,
                                  workers=3))
        except BaseException:
            print(f"nemesis seed {SEED} failed after {time.monotonic() - t0:.0f} s "
                  f"(rerun: SFAAS_NEMESIS_SEED={SEED}); report {report}\n{c.logs(60000, tail=1500)}")
            raise
        print(f"nemesis report: {report}")
        if os.environ.get("SFAAS_NEMESIS_LOGS") == "1":
            print(c.logs(60000, tail=1500))
