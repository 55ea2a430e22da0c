"""The local cluster's supervisor restarts a process that dies, and gives up (clearly) on one
that keeps dying."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from launcher import supervisor as supervisor_module
from launcher.supervisor import MAX_CRASHES, STANDBY_RESTART_DELAY, Child, Supervisor
from sfaas.errors import EXIT_FENCED, EXIT_START_AGAIN


def _run(sup: Supervisor, until, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        if sup.poll():
            sup.write()
        time.sleep(0.05)


def test_a_crashing_process_is_restarted_with_backoff_then_given_up(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    # `sfaas no-such-command` exits at once with argparse's usage error (code 2)
    child = Child("worker", 0, ["no-such-command"], str(tmp_path / "w.log"))
    sup = Supervisor(tmp_path, {"app": "t"}, [child])
    sup.start(child)
    t0 = time.monotonic()
    _run(sup, lambda: bool(child.gave_up))
    assert child.gave_up, "the supervisor never gave up"
    assert child.restarts == MAX_CRASHES - 1 and not child.alive
    # at once, then backoff 0.2 + 0.4 + 0.8 s between the starts
    assert time.monotonic() - t0 >= 1.4
    assert f"exited {MAX_CRASHES} times" in child.gave_up and "exit code 2" in child.gave_up
    assert str(tmp_path / "w.log") in child.gave_up
    listed = json.loads((tmp_path / "cluster.json").read_text())["processes"]
    assert listed == [child.public()] and listed[0]["gave_up"] == child.gave_up
    assert "invalid choice: 'no-such-command'" in (tmp_path / "w.log").read_text()


def test_workers_killed_from_outside_are_restarted_at_once_and_never_given_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chaos run kills workers every few seconds: each kill is a fault, not a crash loop.
    More kills than ``MAX_CRASHES`` within the window, each restarted by the poll that saw
    it, and the supervisor never gives up (a crash of its own still counts: the test above)."""
    monkeypatch.setattr(supervisor_module, "KILLED_AFTER", 0.2)  # (the child ran long enough)
    (tmp_path / "cluster.json").write_text("{}")
    inner = tmp_path / "inner"  # (`sfaas supervise` on an empty dir waits until killed)
    inner.mkdir()
    (inner / "cluster.json").write_text("{}")
    child = Child("worker", 0, ["supervise", "--state-dir", str(inner), "--workers", "0"],
                  str(tmp_path / "w.log"))
    sup = Supervisor(tmp_path, {"app": "t"}, [child])
    sup.start(child)
    try:
        for kills in range(1, MAX_CRASHES + 3):
            time.sleep(0.25)
            assert child.proc is not None
            os.kill(child.pid, signal.SIGKILL)
            child.proc.wait()
            sup.poll()
            assert child.restarts == kills and child.alive and not child.gave_up, (kills, child)
        assert not child.exits
    finally:
        sup.stop()


def test_faults_are_restarted_without_end_and_crashes_are_given_up() -> None:
    """What the supervisor decides on each exit (no process: its bookkeeping alone): a
    worker that could not join because the cluster changed (``EXIT_START_AGAIN``) or that
    fenced itself is restarted however often; a crash of its own counts toward giving up."""
    sup = Supervisor(Path("/nonexistent"), {"app": "t"}, [])
    now = 1000.0
    for code, given_up in ((EXIT_START_AGAIN, False), (EXIT_FENCED, False), (1, True)):
        child = Child("worker", 0, [], "w.log", started=now - 5.0)
        for _ in range(MAX_CRASHES + 2):
            now += 2.0  # (each ran past KILLED_AFTER; all within CRASH_WINDOW)
            sup._exited(child, code, now)
            if child.gave_up:
                break
            child.started = now
        assert bool(child.gave_up) is given_up, (code, child)
        assert child.next_start or given_up


def test_a_stalled_process_is_restarted_at_once_but_counted() -> None:
    """The watchdog's kill of a process that ran a while (paused past its liveness limit)
    restarts it without the crash backoff — the cluster waits for it — and still counts
    toward giving up (a process that wedges at once every time is not restarted for ever);
    a crash keeps its growing backoff."""
    sup = Supervisor(Path("/nonexistent"), {"app": "t"}, [])
    now = 1000.0
    delays: dict[str, list[float]] = {}
    for how in ("stalled", "crashed"):
        child = Child("coordinator", 0, [], "c.log", started=now - 5.0)
        delays[how] = []
        for _ in range(MAX_CRASHES + 2):
            now += 2.0  # (each ran past KILLED_AFTER; all within CRASH_WINDOW)
            child.watchdog_killed = how == "stalled"
            sup._exited(child, -signal.SIGKILL if how == "stalled" else 1, now)
            if child.gave_up:
                break
            delays[how].append(round(child.next_start - now, 2))
            child.started = now
        assert child.gave_up, (how, child)
    assert delays == {"stalled": [0.0] * (MAX_CRASHES - 1),
                      "crashed": [0.0, 0.2, 0.4, 0.8, 1.6][:MAX_CRASHES - 1]}, delays


def test_with_standbys_a_dead_worker_is_restarted_after_the_failover_not_during_it(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    waits: dict[int, float] = {}
    at_once: dict[int, bool] = {}
    for standbys in (0, 1):
        child = Child("worker", 0, ["no-such-command"], str(tmp_path / f"w{standbys}.log"))
        sup = Supervisor(tmp_path, {"app": "t", "standbys": standbys}, [child])
        sup.start(child)
        while child.alive:  # until the supervisor saw it exit
            sup.poll()
            time.sleep(0.01)
        exited = time.monotonic()
        at_once[standbys] = child.restarts == 1  # (restarted by the poll that saw the exit)
        while child.restarts < 1:
            sup.poll()
            time.sleep(0.01)
        waits[standbys] = time.monotonic() - exited
        sup.stop()
    # without standbys the first restart comes at once; with, after the delay
    assert at_once == {0: True, 1: False}, at_once
    assert waits[0] < STANDBY_RESTART_DELAY - 0.3, waits
    assert waits[1] >= STANDBY_RESTART_DELAY - 0.05, waits


def test_stop_terminates_children_and_does_not_restart_them(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    # `sfaas services status` would exit; `sfaas supervise` on an empty dir waits forever: use it
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "cluster.json").write_text("{}")
    child = Child("coordinator", 0, ["supervise", "--state-dir", str(inner), "--workers", "0"],
                  str(tmp_path / "c.log"))
    sup = Supervisor(tmp_path, {}, [child])
    sup.start(child)
    time.sleep(1.0)
    assert child.proc is not None and child.proc.poll() is None
    sup.stop()
    assert child.proc is None and not child.alive and child.restarts == 0


def test_free_ports_for_the_cluster_are_outside_the_ephemeral_range() -> None:
    """A port from the ephemeral range can be taken by any outgoing connection between the
    choice and the coordinator's bind (a CI run failed so: 'address already in use')."""
    import socket

    from launcher.cluster import ephemeral_ports, free_port

    lo, hi = ephemeral_ports()
    for _ in range(50):
        port = free_port("127.0.0.1")
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_clusters_free_ports_are_never_handed_out_twice(tmp_path: Path, monkeypatch) -> None:
    """The supervisor picks every process's metrics port before any process binds one, so a
    pick that is free now may already belong to a process not yet started (a CI run failed
    so: a worker's metrics port came out equal to the coordinator's, 'address already in
    use'). Here the random choice repeats itself on purpose: the ports must still differ."""
    import launcher.cluster as cluster_mod

    lo, hi = cluster_mod.ephemeral_ports()
    base = 10000 if lo - 1 - 10000 >= 1000 else hi + 1  # where the first range of picks starts
    repeats = iter([7] * 4 + [11] * 4 + [13] * 4 + [17] * 4)

    class Repeating:
        def randrange(self, n: int) -> int:
            return next(repeats)

    monkeypatch.setattr(cluster_mod.random, "SystemRandom", Repeating)
    children = [Child("coordinator", 0, ["coordinator"], str(tmp_path / "c.log"))]
    children += [Child("worker", i, ["worker"], str(tmp_path / f"w{i}.log")) for i in range(2)]
    # the coordinator's control port is the first the choice repeats: also never reused
    sup = Supervisor(tmp_path, {"metrics": "free", "coordinator": f"127.0.0.1:{base + 7}"}, children)
    for c in children:
        sup.metrics(c)
    ports = [int(c.args[c.args.index("--metrics-port") + 1]) for c in children]
    assert ports == [base + 11, base + 13, base + 17], ports
    assert [c.metrics for c in children] == [f"http://127.0.0.1:{p}/metrics" for p in ports]


def test_up_reports_a_recovery_that_stopped_retrying_even_when_it_stops_mid_poll(
        tmp_path: Path, monkeypatch) -> None:
    """The coordinator may write ``recovery_stopped`` to the ready file between ``sfaas up``'s
    two reads of it (is it ready? did anything exit?). ``ps`` then names the coordinator as
    having given up; ``up`` must still raise the recovery's reason and leave the cluster up
    for its status page, not take it for a crash and stop it (a CI failure of
    test_reconfig: the cluster was gone when the test asked ``ps`` for its coordinator)."""
    import os

    import pytest

    from launcher import cluster
    from sfaas.errors import ClusterError
    from sfaas.runtime.settings import Settings

    s = Settings.load({"home": str(tmp_path), "namespace": "race"})
    sd = cluster.state_dir(s)
    sd.mkdir(parents=True)
    (sd / "cluster.json").write_text(json.dumps({"processes": [
        {"role": "coordinator", "pid": os.getpid(), "log": str(sd / "coordinator.log")}]}))
    ready = sd / "ready"
    ready.write_text(json.dumps({"recovering": True}))
    why = "recovery failed 3 times in a row the same way: worker 0 could not roll back"
    real_ready = cluster._ready
    reads = []

    def ready_then_stop(path: Path) -> bool:
        out = real_ready(path)
        if not reads:  # the coordinator gives up just after this read
            ready.write_text(json.dumps({"recovering": False, "recovery_stopped": why}))
        reads.append(out)
        return out

    stopped = []
    monkeypatch.setattr(cluster, "_ready", ready_then_stop)
    monkeypatch.setattr(cluster, "down", lambda settings, timeout=15.0: stopped.append("down"))
    monkeypatch.setattr(cluster, "_signal", lambda pid, sig: stopped.append(f"signal {sig}"))
    with pytest.raises(ClusterError, match=f"{why}. The cluster is still running"):
        cluster._await_ready(s, os.getpid(), timeout=10)
    assert stopped == [], "up stopped a cluster whose recovery stopped: its status page is gone"


_RETIRING = """
import asyncio, sys, threading, time
from launcher.commands import _run_service
from sfaas.errors import EXIT_RETIRED
from sfaas.runtime.settings import Settings

async def retire():
    await asyncio.sleep(0.3)  # (serving: its liveness file is touched)
    # what a retiring worker leaves behind: work that ends only after its loop (1.5 s here)
    threading.Thread(target=time.sleep, args=(1.5,)).start()
    print("retiring", flush=True)
    raise SystemExit(EXIT_RETIRED)

_run_service(retire, Settings.load({"home": sys.argv[1], "heartbeat_timeout": 0.4}))
"""


def test_a_worker_retired_by_a_rescale_stays_alive_to_the_watchdog_until_it_exited(
        tmp_path: Path) -> None:
    """A worker a rescale retired exits with ``EXIT_RETIRED``, which the supervisor does not
    restart; the rest of its exit (threads, the interpreter) took up to 1.8 s on a loaded
    host, and the watchdog killed it for a stale liveness file — the kill's code is no
    "retired", so it was restarted into a cluster without a place for it. Its file stays
    fresh until it is gone."""
    import subprocess
    import sys

    from sfaas.errors import EXIT_RETIRED
    from sfaas.runtime import liveness

    proc = subprocess.Popen([sys.executable, "-c", _RETIRING, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "retiring\n"
        path, oldest = liveness.alive_path(str(tmp_path), ""), 0.0
        while proc.poll() is None:
            age = liveness.age(path)
            assert age is not None, f"no liveness file {path}"
            oldest = max(oldest, age)
            time.sleep(0.02)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_RETIRED
    # beats every 0.1 s (timeout / 4); without them the file ages by the whole 1.5 s
    assert oldest < 0.6, f"the liveness file aged {oldest:.2f} s while the worker exited"
