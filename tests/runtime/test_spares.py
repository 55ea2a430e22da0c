"""The supervisor's warm spares (``launcher.spares``): a restart takes over a process that
imported the runtime already, and that process is the one the command line asked for —
its output in the child's log, its environment the child's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher import spares as spares_module
from launcher.spares import Spares
from launcher.supervisor import Child, Supervisor

#: seconds after which a hanging test ends the process (the ``watchdog`` fixture)
HANG_AFTER = 120
pytestmark = pytest.mark.usefixtures("watchdog")


def _until(what: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _idle_supervisor_args(root: Path) -> list[str]:
    """``sfaas supervise`` on an empty state directory: runs until killed, writing its pid
    into that directory's ``cluster.json``."""
    inner = root / "inner"
    inner.mkdir(exist_ok=True)
    (inner / "cluster.json").write_text("{}")
    return ["supervise", "--state-dir", str(inner), "--workers", "0"]


def _supervisor_pid(root: Path) -> int:
    try:
        return int(json.loads((root / "inner" / "cluster.json").read_text()).get("supervisor", 0))
    except (OSError, ValueError):
        return 0


def test_a_spare_becomes_the_process_its_line_names(tmp_path: Path) -> None:
    spare = subprocess.Popen([sys.executable, "-m", "sfaas", "spare", "worker"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        log = tmp_path / "child.log"
        # a bad setting in the environment the line adds: the command says so in the log
        order = {"args": _idle_supervisor_args(tmp_path), "log": str(log),
                 "env": {"SFAAS_HEARTBEAT_TIMEOUT": "not-a-number"}}
        assert spare.stdin is not None
        spare.stdin.write((json.dumps(order) + "\n").encode())
        spare.stdin.close()
        assert _until(lambda: _supervisor_pid(tmp_path) == spare.pid), \
            "the spare did not run the command"
        assert _until(lambda: "settings unreadable" in log.read_text()), log.read_text()
    finally:
        spare.kill()
        spare.wait()


def test_a_spare_whose_supervisor_goes_away_exits() -> None:
    spare = subprocess.Popen([sys.executable, "-m", "sfaas", "spare", "coordinator"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert spare.stdin is not None
    spare.stdin.close()
    assert spare.wait(60) == 0


def test_a_spare_of_no_role_says_what_it_expected() -> None:
    run = subprocess.run([sys.executable, "-m", "sfaas", "spare", "gateway"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "sfaas spare {worker,coordinator}" in run.stderr and "gateway" in run.stderr


def _supervised(tmp_path: Path) -> tuple[Child, Spares, Supervisor]:
    """A supervisor with spares, running one idle worker child."""
    (tmp_path / "cluster.json").write_text("{}")
    child = Child("worker", 0, _idle_supervisor_args(tmp_path), str(tmp_path / "w.log"))
    spares = Spares(tmp_path)
    sup = Supervisor(tmp_path, {"app": "t"}, [child], spares)
    sup.start(child)
    return child, spares, sup


def test_a_killed_child_restarts_from_its_warm_spare(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spares_module, "SPARE_DELAY", 0.1)
    child, spares, sup = _supervised(tmp_path)
    try:
        assert _until(lambda: sup.poll() or bool(spares.pids())), "no spare started"
        spare_pid = spares.pids()[0]
        time.sleep(1.0)  # (it imports the runtime meanwhile)
        started = spares.started
        assert child.proc is not None
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait()
        assert _until(lambda: sup.poll() and child.alive)
        assert child.pid == spare_pid and spares.taken == 1
        assert _until(lambda: _supervisor_pid(tmp_path) == spare_pid), \
            "the restarted child is not running its command"
        # and a new spare follows for the next restart
        assert _until(lambda: sup.poll() or spares.started > started)
    finally:
        sup.stop()
    assert not spares.pids()


def test_two_kills_in_a_row_both_restart_from_warm_spares(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The faults series kills a worker twice, 2 s apart: the second restart must find a
    spare ready too, not one that starts :data:`SPARE_DELAY` after the first restart."""
    monkeypatch.setattr(spares_module, "SPARE_DELAY", 0.1)
    child, spares, sup = _supervised(tmp_path)
    try:
        assert _until(lambda: sup.poll() or len(spares.pids()) == 2), "not two spares"
        warm = spares.pids()
        time.sleep(1.0)  # (they import the runtime meanwhile)
        monkeypatch.setattr(spares_module, "SPARE_DELAY", 60.0)  # (no new spare meanwhile)
        for kill in range(2):
            assert child.proc is not None
            os.kill(child.pid, signal.SIGKILL)
            child.proc.wait()
            assert _until(lambda: sup.poll() and child.alive)
            assert child.pid == warm[kill], f"restart {kill + 1} did not take a warm spare"
        assert spares.taken == 2
    finally:
        sup.stop()
    assert not spares.pids()


def test_without_spares_restarts_are_cold(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    child = Child("worker", 0, _idle_supervisor_args(tmp_path), str(tmp_path / "w.log"))
    sup = Supervisor(tmp_path, {"app": "t"}, [child])
    sup.start(child)
    try:
        first = child.pid
        assert child.proc is not None
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait()
        assert _until(lambda: sup.poll() and child.alive)
        assert child.pid != first and _until(lambda: _supervisor_pid(tmp_path) == child.pid)
    finally:
        sup.stop()


def test_a_spare_that_dies_while_it_waits_is_not_started_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare leaves only when its pipe closes: one that exits otherwise failed (a broken
    install, the OOM killer), and its role restarts cold from then on, not a new spare every
    2 s."""
    monkeypatch.setattr(spares_module, "SPARE_DELAY", 0.05)
    spares = Spares(tmp_path, ["worker"])
    spares.later("worker")
    assert _until(lambda: (spares.poll(), bool(spares.pids()))[1])
    os.kill(spares.pids()[0], signal.SIGKILL)
    time.sleep(0.5)
    for _ in range(20):
        spares.poll()
        time.sleep(0.05)
    assert spares.pids() == [] and spares.started == 1
    assert spares.take("worker", ["worker"], str(tmp_path / "w.log"), {}) is None
    spares.stop()
