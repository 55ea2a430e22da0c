"""Warm spares: a process started before it is needed, so a restart skips Python's start.

A worker or coordinator that dies is replaced by a new ``python -m sfaas ROLE`` process,
and before it can register it starts an interpreter and imports the runtime: 0.4–1.1 s on
a 2-core host, the longest step of a killed worker's reply gap after the rollback and the
replay (``python -m benchmarks.cluster.series``). The supervisor (``launcher.supervisor``)
therefore keeps *spares* per role (:data:`POOL`: two for workers, one for the
coordinator), each started a little after the role's last (re)start or spare:

- ``python -m sfaas spare ROLE`` (``launcher.spare.serve``: the process's side, apart so
  that the supervisor's side imports no command) imports what ROLE runs (:data:`IMPORTS`)
  and waits for one line on its stdin, a pipe from the supervisor;
- to restart a child, the supervisor writes that line (:meth:`Spares.take`): the JSON of the
  child's command line, its log file and the environment it adds; the spare sends its
  output to the log, sets the environment and runs the command as ``python -m sfaas`` would
  have — the same code, only already imported;
- a spare whose stdin closes (the supervisor went away) exits; one that dies while it
  waits failed, and its role's restarts start cold from then on.

Nothing but the supervisor writes to a spare's stdin, and the line is JSON, never pickle.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("sfaas.supervisor")

__all__ = ["Spares", "IMPORTS", "SPARE_DELAY"]

#: What a spare of each role imports before it waits (what the role's process runs).
#: (MinIO's client and uvloop were imported after the restart: 0.1-0.2 s of a failover)
IMPORTS: dict[str, tuple[str, ...]] = {
    "worker": ("launcher.commands", "worker.service", "sfaas.runtime.kafka", "remotes.minio",
               "uvloop"),
    "coordinator": ("launcher.commands", "coordinator.service", "sfaas.runtime.kafka",
                    "remotes.minio", "uvloop"),
}
#: Seconds after a role's process (re)started, or a spare started, before its next spare
#: starts: the starting process gets the cores first.
SPARE_DELAY = 2.0
#: Spares kept per role. Faults come in series (the faults series kills a worker twice,
#: 2 s apart): with one spare, the second restart found none ready — the first one's
#: replacement starts :data:`SPARE_DELAY` s after it — and started cold, 0.8 s before it
#: registered where a warm one takes 0.03 s. A coordinator restarts rarely twice at once.
POOL: dict[str, int] = {"worker": 2, "coordinator": 1}


class Spares:
    """The supervisor's spare processes, up to :data:`POOL` per role."""

    def __init__(self, state_dir: Path, roles: Sequence[str] = tuple(IMPORTS)) -> None:
        self._dir = state_dir
        self._roles = [r for r in roles if r in IMPORTS]
        #: role → its waiting spares, the oldest first
        self._procs: dict[str, list[subprocess.Popen[bytes]]] = {}
        #: role → when its next spare may start (monotonic; absent: none due)
        self._due: dict[str, float] = {}
        #: restarts that took a spare, and spares started
        self.taken = 0
        self.started = 0

    def take(self, role: str, args: Sequence[str], logfile: str,
             env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """Hand ``args`` to ``role``'s spare, which becomes that process (None: no live
        spare; the caller starts one the cold way). A new spare follows later either way."""
        waiting = self._procs.get(role, [])
        proc = waiting.pop(0) if waiting else None  # (the oldest: the likeliest imported)
        self.later(role)
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return None
        line = json.dumps({"args": list(args), "log": logfile, "env": dict(env)}) + "\n"
        try:
            proc.stdin.write(line.encode())
            proc.stdin.close()
        except OSError as exc:  # (it died between the poll and the write)
            log.warning("the %s spare (pid %d) could not take over: %s", role, proc.pid, exc)
            proc.kill()
            proc.wait()
            return None
        self.taken += 1
        return proc

    def later(self, role: str) -> None:
        """A ``role`` process (re)started: its next spare starts :data:`SPARE_DELAY` s on."""
        if role in self._roles:
            self._due[role] = time.monotonic() + SPARE_DELAY

    def poll(self) -> None:
        """Start the spares that are due. A spare that exits while it waits failed (it
        leaves only when its pipe closes): its role restarts cold from then on, so that a
        spare that cannot start (its log says why) is not started again every 2 s."""
        now = time.monotonic()
        for role in list(self._roles):
            waiting = self._procs.setdefault(role, [])
            dead = next((p for p in waiting if p.poll() is not None), None)
            if dead is not None:
                self._roles.remove(role)
                self._due.pop(role, None)
                self._stop(self._procs.pop(role))
                log.warning("the %s spare (pid %d) exited with code %s (see %s): %s restarts "
                            "start cold from now on", role, dead.pid, dead.returncode,
                            self._dir / f"spare-{role}.log", role)
                continue
            due = self._due.get(role)
            if len(waiting) < POOL.get(role, 1) and due is not None and now >= due:
                waiting.append(self._start(role))
                if len(waiting) < POOL.get(role, 1):
                    self._due[role] = now + SPARE_DELAY
                else:
                    del self._due[role]

    def _start(self, role: str) -> subprocess.Popen[bytes]:
        out = open(self._dir / f"spare-{role}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sfaas", "spare", role], stdin=subprocess.PIPE,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        self.started += 1
        return proc

    def stop(self) -> None:
        """Stop every spare (their stdin closes: they exit)."""
        self._due.clear()
        self._stop([p for waiting in self._procs.values() for p in waiting])
        self._procs.clear()

    @staticmethod
    def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        for proc in procs:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def pids(self) -> list[int]:
        return [p.pid for waiting in self._procs.values() for p in waiting]

    def describe(self) -> dict[str, Any]:
        return {"spares": sorted(r for r, waiting in self._procs.items() for _ in waiting),
                "taken": self.taken, "started": self.started}
