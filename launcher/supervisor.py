"""The local cluster's supervisor: starts the coordinator and the workers, restarts the ones
that die.

``sfaas up`` starts this as one background process (``python -m sfaas supervise``); it
starts every role as its own child (own session, own log), polls them, and restarts a child
that exits — at once the first time, then after a backoff (0.2 s doubling to 5 s; a
worker of a cluster with standbys waits at least ``STANDBY_RESTART_DELAY``), and not more
than ``MAX_CRASHES`` times in ``CRASH_WINDOW`` seconds: then it gives up on that role with
a clear error in its log and in ``cluster.json`` (``sfaas ps`` shows it) — a SIGKILL from
outside after the process ran a second (an operator, a chaos test, the OOM killer), or a
worker that fenced itself after a pause, is a fault, not a crash: restarted at once and
not counted; so is a worker that could not join
because the cluster changed under it (``EXIT_START_AGAIN``), restarted after the backoff.
The backoff starts over once a process ran ``HEALTHY_AFTER`` s. It rewrites
``cluster.json`` (atomically) whenever a process starts or stops. On SIGTERM (``sfaas
down``) it stops the coordinator first (which stops the workers cleanly), then whatever is
left, and exits.

The workers of a cluster take their index from the coordinator, so a restarted worker
simply registers again and takes the slot of the lost one (``coordinator.protocols.recovery``).

A child that stays silent is treated as one that died: each child touches its liveness file
(``sfaas.runtime.liveness``; the supervisor names it ``{role}-{index}.alive`` in the state
directory) from its event loop every quarter of ``heartbeat_timeout``; one whose file grew
older than ``heartbeat_timeout + 1`` s (``$SFAAS_SUPERVISOR_MAX_AGE`` overrides it, 0
turns it off) — after ``START_GRACE`` seconds of starting; the coordinator as soon as it
touched its file once since it started — is SIGKILLed, logged with its file's age,
counted (``stalls`` in ``cluster.json``, and toward giving up like a crash) and, once it
ran ``KILLED_AFTER`` s, restarted at once (no backoff). A stopped (SIGSTOP) or wedged
process is replaced instead of holding its slot.

Rescaling (``sfaas scale``): on SIGHUP the supervisor reads the wanted number of worker
processes from ``workers`` in its state directory and starts the missing ones (they join
the cluster); a worker a scale-down retired exits with ``EXIT_RETIRED`` and is not
restarted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.cluster import free_port
from launcher.spares import Spares
from sfaas.errors import EXIT_FENCED, EXIT_RECOVERY_STOPPED, EXIT_RETIRED, EXIT_START_AGAIN
from sfaas.runtime import liveness
from sfaas.runtime.metrics import local_url
from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.supervisor")

__all__ = ["supervise", "MAX_CRASHES", "CRASH_WINDOW", "STANDBY_RESTART_DELAY", "START_GRACE",
           "stalled"]

#: A role that exits this often within ``CRASH_WINDOW`` seconds is not restarted again.
MAX_CRASHES = 5
#: Seconds a process must have run for a SIGKILL from outside to count as a fault rather
#: than a crash (``Supervisor._exited``).
KILLED_AFTER = 1.0
#: Seconds of running after its last exit that reset a process's restart backoff.
HEALTHY_AFTER = 10.0
CRASH_WINDOW = 60.0
#: With standbys, seconds before a dead worker process is restarted: a standby takes the
#: lost slot, the restarted process only becomes a new standby, and its start (a second
#: of imports and connections) would otherwise compete for the CPU with the promoted
#: standby's recovery.
STANDBY_RESTART_DELAY = 1.0
#: Seconds after a child starts before its liveness file is watched (imports, first touch).
START_GRACE = 15.0


def stalled(started: float, age: float | None, now: float, limit: float,
            grace: float = START_GRACE, up_ends_grace: bool = False) -> str:
    """Why a child started at ``started`` (monotonic) whose liveness file is ``age``
    seconds old (None: missing) is stuck at ``now`` — "" if it is not (or ``limit`` ≤ 0).
    ``up_ends_grace``: once the child touched its file since it started (it is up), it is
    held to ``limit`` at once, not only after ``grace``."""
    if limit <= 0:
        return ""
    up = age is not None and age < now - started  # (touched since this start)
    if now - started < grace and not (up_ends_grace and up):
        return ""
    if age is None:
        return f"it never touched its liveness file in {now - started:.1f} s"
    if age > limit:
        return f"its liveness file is {age:.1f} s old (limit {limit:g} s): stopped or stuck"
    return ""


def _spares_on() -> bool:
    try:
        return Settings.load().supervisor_spares
    except Exception:  # (the children fail loudly on bad settings themselves)
        return True


def _max_age() -> float:
    try:
        s = Settings.load()
    except Exception as exc:  # (the children fail loudly on bad settings themselves)
        log.warning("settings unreadable (%s): the liveness limit is %.0f s", exc,
                    liveness.max_age(2.0))
        return liveness.max_age(2.0)
    if s.supervisor_max_age >= 0:
        return s.supervisor_max_age
    return liveness.max_age(s.heartbeat_timeout)


@dataclass
class Child:
    """One supervised process (what ``cluster.json`` lists)."""

    role: str
    index: int
    args: list[str]
    log: str
    pid: int = 0
    restarts: int = 0
    alive: bool = False
    gave_up: str = ""
    exits: deque[float] = field(default_factory=deque)
    next_start: float = 0.0
    #: seconds before the next restart: 0 for a first crash (a killed worker's slot waits
    #: for its replacement), then 0.2 s doubling to 5 s
    backoff: float = 0.0
    retired: bool = False
    proc: subprocess.Popen[bytes] | None = None
    #: its ``/metrics`` URL (empty: off)
    metrics: str = ""
    #: its liveness file (``sfaas.runtime.liveness``), and when it last started (monotonic)
    alive_file: str = ""
    started: float = 0.0
    #: how often it was killed for silence (each also counts as a crash), and whether the
    #: exit being reaped is such a kill
    stalls: int = 0
    watchdog_killed: bool = False
    #: when it last exited (monotonic; 0: never)
    last_exit: float = 0.0

    def public(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("role", "index", "pid", "log", "restarts", "alive",
                                              "gave_up", "metrics", "stalls")}


class Supervisor:
    def __init__(self, state_dir: Path, info: dict[str, Any], children: list[Child],
                 spares: Spares | None = None) -> None:
        self.state_dir = state_dir
        #: the warm spares a restart takes over (``launcher.spares``; None: cold restarts)
        self.spares = spares
        self.info = info
        self.children = children
        self.stopping = False
        #: ports handed to this cluster's processes (they bind them later): never twice
        self.ports: set[int] = set()
        control = str(info.get("coordinator", "")).rpartition(":")[2]
        if control.isdigit():
            self.ports.add(int(control))
        #: seconds a child's liveness file may be old (0: not watched)
        self.max_age = _max_age()

    def metrics(self, c: Child) -> None:
        """Give ``c`` its metrics port (kept across its restarts): as ``cluster.json``'s
        ``metrics`` says — ``"free"`` ports, ``"off"``, or a base port (the coordinator's;
        worker process ``i`` gets base + 1 + i)."""
        mode = self.info.get("metrics", "off")
        if mode == "off":
            return
        if c.role == "coordinator":
            host = str(self.info.get("coordinator", "")).rpartition(":")[0]
        else:
            host = str(self.info.get("worker_host", "127.0.0.1"))
        if mode == "free":
            port = free_port(host, avoid=self.ports)
        else:
            port = int(mode) + (0 if c.role == "coordinator" else 1 + c.index)
        self.ports.add(port)
        if port > 65535:
            log.warning("%s %d serves no metrics: port %d is beyond 65535", c.role, c.index, port)
            return
        c.args += ["--metrics-port", str(port)]
        c.metrics = local_url(host, port, "/metrics")

    def start(self, c: Child) -> None:
        """Start ``c`` — a restart through its role's warm spare when one is up."""
        c.alive_file = str(self.state_dir / f"{c.role}-{c.index}.alive")
        try:
            os.unlink(c.alive_file)  # (a previous process's file says nothing of this one)
        except FileNotFoundError:
            pass
        env = {liveness.ENV: c.alive_file}
        proc = None
        if self.spares is not None:
            proc = self.spares.take(c.role, c.args, c.log, env) if c.restarts else None
            self.spares.later(c.role)
        warm = proc is not None
        if proc is None:
            out = open(c.log, "ab")  # noqa: SIM115 - handed to the child
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "sfaas", *c.args], stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                    env=dict(os.environ, **env),
                )
            finally:
                out.close()
        c.proc = proc
        c.pid, c.alive, c.started = proc.pid, True, time.monotonic()
        log.info("started %s %d (pid %d)%s", c.role, c.index, c.pid,
                 " from its warm spare" if warm else "")

    def write(self) -> None:
        doc = dict(self.info, supervisor=os.getpid(), processes=[c.public() for c in self.children])
        tmp = self.state_dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, self.state_dir / "cluster.json")

    def watch(self, now: float) -> None:
        """SIGKILL every child that stayed silent (see the module docstring); :meth:`poll`
        then reaps and restarts it like one that died."""
        for c in self.children:
            if c.proc is None or self.stopping or c.proc.poll() is not None:
                continue
            # (a coordinator loads no state at its start: once up, a silence is a stall —
            # and a stalled coordinator stops every reply, so it goes at once; a worker's
            # start may hold its loop restoring stores, and the cluster itself replaces a
            # silent worker after heartbeat_timeout)
            why = stalled(c.started, liveness.age(c.alive_file), now, self.max_age, START_GRACE,
                          up_ends_grace=c.role == "coordinator")
            if why:
                log.error("killing %s %d (pid %d): %s", c.role, c.index, c.pid, why)
                c.stalls += 1
                c.watchdog_killed = True
                c.proc.kill()
                c.proc.wait()

    def poll(self) -> bool:
        """Reap exited children, restart due ones; True if anything changed."""
        changed = False
        now = time.monotonic()
        self.watch(now)
        if self.spares is not None and not self.stopping:
            self.spares.poll()
        for c in self.children:
            if c.proc is not None and c.proc.poll() is not None:
                code = c.proc.returncode
                c.proc, c.alive = None, False
                changed = True
                if self.stopping:
                    continue
                if code == EXIT_RECOVERY_STOPPED and c.role == "coordinator":
                    c.gave_up = (f"its recovery stopped retrying (exit code {code}): a restart "
                                 f"would fail the same way — see {c.log}")
                    log.error("coordinator %s", c.gave_up)
                    continue
                if code == EXIT_FENCED:
                    log.warning("%s %d (pid %d) fenced itself (its lease ran out): restarting",
                                c.role, c.index, c.pid)
                if code == EXIT_RETIRED and c.role == "worker":
                    log.info("worker %d (pid %d) retired by a rescale; not restarted",
                             c.index, c.pid)
                    c.retired = True
                    continue
                self._exited(c, code, now)
            if (not self.stopping and c.proc is None and not c.gave_up and c.next_start
                    and now >= c.next_start):
                c.next_start = 0.0
                c.restarts += 1
                self.start(c)
                changed = True
            if c.alive and c.last_exit and now - c.last_exit > HEALTHY_AFTER:
                c.backoff = 0.0  # healthy for a while: a later crash restarts at once again
        self.children = [c for c in self.children if not c.retired]
        return changed

    def _exited(self, c: Child, code: int, now: float) -> None:
        """Schedule the restart of ``c``, which exited with ``code`` — or give up on it after
        ``MAX_CRASHES`` crashes within ``CRASH_WINDOW`` s. A SIGKILL from outside (not the
        watchdog's) after the process ran ``KILLED_AFTER`` s is a fault, not a crash loop:
        restarted at once and not counted (a chaos run or an operator may kill a worker
        every few seconds; giving up would leave its slot empty)."""
        # a SIGKILL from outside, or a worker that fenced itself after a pause (its lease ran
        # out: the cluster has replaced it), after running a while: a fault, not a crash
        killed = ((code == -signal.SIGKILL and not c.watchdog_killed or code == EXIT_FENCED)
                  and now - c.started >= KILLED_AFTER)
        # a process the watchdog killed after running a while (paused, wedged) is counted
        # toward giving up, but restarted at once: the cluster waits for it (the pause
        # series' coordinator gaps grew by 0.2, 0.4, 0.8 s of backoff)
        stalled = c.watchdog_killed and now - c.started >= KILLED_AFTER
        c.watchdog_killed = False
        c.last_exit = now
        if not killed and code != EXIT_START_AGAIN:  # (the cluster changed under it)
            c.exits.append(now)
        while c.exits and now - c.exits[0] > CRASH_WINDOW:
            c.exits.popleft()
        if len(c.exits) >= MAX_CRASHES:
            c.gave_up = (f"exited {len(c.exits)} times within {CRASH_WINDOW:.0f} s "
                         f"(last exit code {code}); not restarted again — see {c.log}")
            log.error("%s %d %s", c.role, c.index, c.gave_up)
            return
        delay = 0.0 if killed or stalled else c.backoff
        if c.role == "worker" and int(self.info.get("standbys", 0)) > 0:
            delay = max(delay, STANDBY_RESTART_DELAY)
        c.next_start = now + delay
        log.warning("%s %d (pid %d) exited with code %s%s; restarting in %.1f s", c.role,
                    c.index, c.pid, code, " (a fault: not counted as a crash)"
                    if killed or code == EXIT_START_AGAIN else "", delay)
        if not killed and not stalled:
            c.backoff = min(5.0, max(0.2, c.backoff * 2))

    def scale(self) -> None:
        """Start worker processes up to the number in ``workers`` (written by ``sfaas scale``)."""
        try:
            want = int((self.state_dir / "workers").read_text())
        except (FileNotFoundError, ValueError) as exc:
            log.warning("SIGHUP without a readable 'workers' file (%s); ignored", exc)
            return
        have = [c for c in self.children if c.role == "worker"]
        top = max((c.index for c in have), default=-1)
        for i in range(top + 1, top + 1 + max(0, want - len(have))):
            c = Child("worker", i, ["worker", "--name", f"worker-{i}"],
                      str(self.state_dir / f"worker-{i}.log"))
            self.metrics(c)
            self.children.append(c)
            self.start(c)
        self.write()

    def stop(self) -> None:
        self.stopping = True
        if self.spares is not None:
            self.spares.stop()
        order = [c for c in self.children if c.role == "coordinator"] + \
                [c for c in self.children if c.role != "coordinator"]
        for c in order:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
                if c.role == "coordinator":  # it stops the workers: give them a moment
                    try:
                        c.proc.wait(5.0)
                    except subprocess.TimeoutExpired:
                        pass
        deadline = time.monotonic() + 15.0
        for c in order:
            while c.proc is not None and c.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if c.proc is not None and c.proc.poll() is None:
                log.warning("%s %d ignored SIGTERM; killing", c.role, c.index)
                c.proc.kill()
                c.proc.wait()
        self.poll()
        self.write()


def supervise(state_dir: str, workers: int) -> int:
    """Run the supervisor (the ``sfaas supervise`` command); returns when stopped."""
    sd = Path(state_dir)
    info = json.loads((sd / "cluster.json").read_text())
    children = [Child("coordinator", 0, ["coordinator"], str(sd / "coordinator.log"))]
    children += [Child("worker", i, ["worker", "--name", f"worker-{i}"],
                       str(sd / f"worker-{i}.log"))
                 for i in range(workers)]

    sup = Supervisor(sd, info, children, Spares(sd) if _spares_on() else None)
    for c in children:
        sup.metrics(c)
    stop = False
    rescale = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    def on_hup(signum: int, frame: Any) -> None:
        nonlocal rescale
        rescale = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    for c in children:
        sup.start(c)
    sup.write()
    while not stop:
        if rescale:
            rescale = False
            sup.scale()
        if sup.poll():
            sup.write()
        time.sleep(0.05)
    sup.stop()
    return 0
