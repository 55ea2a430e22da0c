"""The fault checks of the chaos runs (``tests.cluster.faults``): a fault whose effect is
never seen fails the run, naming it — checked here with fakes that never take effect, and
with real processes and ports that do. No cluster, no Docker: seconds."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.cluster import test_nemesis
from tests.cluster.faults import FaultLog, port_closed, process_halted, process_stopped
from tests.runtime import test_recovery


def test_a_fault_never_seen_to_take_effect_fails_the_run_naming_it() -> None:
    log = FaultLog()
    assert not asyncio.run(log.confirm("pause", "worker-1 paused", lambda: None, timeout=0.2))
    assert asyncio.run(log.confirm("kill", "worker-0 killed", lambda: "pid 7 gone"))
    assert log.summary() == {"kill": "fired 1, took effect 1", "pause": "fired 1, took effect 0"}
    with pytest.raises(AssertionError, match="worker-1 paused: no effect seen"):
        log.check({"kill", "pause"})


def test_a_scheduled_kind_that_never_took_effect_fails_the_run() -> None:
    log = FaultLog()
    assert asyncio.run(log.confirm("kill", "worker-0 killed", lambda: "pid 7 gone"))
    log.check({"kill"})
    with pytest.raises(AssertionError, match=r"never took effect: \['minio'\]"):
        log.check({"kill", "minio"})
    log.not_injected("pause", "worker-2 paused", "unable to freeze")
    with pytest.raises(AssertionError, match="worker-2 paused: not injected"):
        log.check({"kill"})


def test_the_process_and_port_probes_see_real_effects() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert process_halted(proc.pid)() is None and process_stopped(proc.pid)() is None
        os.kill(proc.pid, signal.SIGSTOP)
        assert asyncio.run(FaultLog().confirm("pause", "sleep", process_stopped(proc.pid), 5))
        assert process_halted(proc.pid)() == f"pid {proc.pid} in state T"
        os.kill(proc.pid, signal.SIGKILL)
        assert asyncio.run(FaultLog().confirm("kill", "sleep", process_halted(proc.pid), 5))
    finally:
        proc.kill()
        proc.wait()
    assert process_halted(proc.pid)() == f"pid {proc.pid} gone"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert port_closed("127.0.0.1", port)() is None
    assert port_closed("127.0.0.1", port)() is not None


def test_an_outage_of_a_service_that_stays_up_fails_the_chaos_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``services.down`` that stops nothing (a broker sfaas did not start): the port stays
    open, and the chaos run's outage is recorded as not taken effect."""
    from launcher import services

    with socket.socket() as srv:  # the "broker", still listening
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        monkeypatch.setenv("SFAAS_KAFKA_PORT", str(srv.getsockname()[1]))
        monkeypatch.setattr(services, "down", lambda **_: None)
        monkeypatch.setattr(services, "up", lambda **_: None)
        log = FaultLog()
        asyncio.run(test_recovery._outage("kafka", 0.0, log, confirm_timeout=0.3))
    with pytest.raises(AssertionError, match="kafka stopped: no effect seen"):
        log.check({"kafka"})


class FakeCompose:
    """A compose project whose docker commands succeed and change nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.calls: list[tuple[str, ...]] = []

    def container(self, service: str) -> str:
        return f"cid-{service}"

    def network(self, name: str) -> str:
        return f"proj_{name}"

    def cut(self, service: str, net: str) -> list[str]:
        self.calls.append(("cut", service, net))
        return ["network", "connect", self.network(net), self.container(service)]

    def docker(self, *args: str) -> str:
        self.calls.append(args)
        if args[0] == "inspect":
            return {"{{.State.Pid}}": str(self.pid), "{{.State.Paused}}": "false",
                    "{{.State.Running}}": "true",
                    "{{json .NetworkSettings.Networks}}": '{"proj_data": {}, "proj_control": {}}'
                    }[args[2]]
        return ""


@pytest.mark.timeout(60)
def test_nemesis_faults_that_do_not_take_effect_fail_the_run(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """Every kind of the nemesis' faults against a docker that reports success and does
    nothing (and a SIGKILL that does not land): each is named as not taken effect."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        nemesis = test_nemesis.Nemesis(FakeCompose(proc.pid))  # type: ignore[arg-type]
        nemesis.confirm_timeout = 0.3
        monkeypatch.setattr(test_nemesis.os, "kill", lambda pid, sig: None)
        log, outages = FaultLog(), []  # type: ignore[var-annotated]

        async def run() -> None:
            for what in ["kill worker-0 0", "pause worker-1 0.1", "cut-data worker-2 0.1",
                         "cut-coord coordinator 0.1", "broker kafka-1 0.1", "minio minio-2 0.1"]:
                await nemesis.fire(what, outages, log)
            await asyncio.gather(*outages)
        asyncio.run(run())
    finally:
        monkeypatch.undo()
        proc.kill()
        proc.wait()
    assert set(log.fired) == {"kill", "pause", "cut-data", "cut-coord", "broker", "minio"}
    assert not log.effective and len(log.failed) == 6, log.failed
    with pytest.raises(AssertionError, match="worker-0 killed .* no effect seen") as e:
        log.check(log.fired)
    for name in ["worker-1 paused", "worker-2 cut from data", "coordinator cut from control",
                 "kafka-1 stopped", "minio-2 stopped"]:
        assert name in str(e.value), (name, e.value)
