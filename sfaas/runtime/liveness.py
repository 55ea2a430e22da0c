"""The liveness file: a process proves its event loop turns by touching a file.

A coordinator or worker process touches its liveness file every quarter of
``heartbeat_timeout``, from a task of its event loop — so a loop blocked for long, or a
process stopped (SIGSTOP), leaves the file growing old while the process still exists.
Its supervisor (``launcher.supervisor``) kills a child whose file grew older than
:func:`max_age` and restarts it; ``sfaas alive --max-age S`` reads the file for a container
healthcheck or a Kubernetes liveness probe (exit 0: fresh, 1: stale or missing).

The file is the setting ``alive_file`` (``$SFAAS_ALIVE_FILE``: ``sfaas up`` gives each child
its own) if set, else ``{home}/alive`` — one process per container, or per home. Its
content is the pid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

log = logging.getLogger("sfaas.runtime.liveness")

__all__ = ["ENV", "alive_path", "touch", "touch_forever", "touch_while_exiting", "age", "max_age",
           "TURN", "Turns", "EXIT_GRACE"]

#: The environment variable naming a process's liveness file (``Settings.alive_file``; the
#: supervisor sets it for each child).
ENV = "SFAAS_ALIVE_FILE"


#: The longest a long synchronous step keeps the event loop before :class:`Turns` gives it
#: a turn (seconds).
TURN = 0.02


class Turns:
    """Give the event loop a turn every :data:`TURN` seconds of a long step whose parts
    never wait (a serial fallback's runs, a recovery's rebuild): held longer, the loop
    would send no heartbeat and touch no liveness file, and the process would be declared
    lost. ``await turns()`` between the parts; ``turns.given`` counts the turns."""

    def __init__(self) -> None:
        self.given = 0
        self._until = time.perf_counter() + TURN

    async def __call__(self) -> None:
        if time.perf_counter() >= self._until:
            await asyncio.sleep(0)
            self.given += 1
            self._until = time.perf_counter() + TURN


def alive_path(home: str, alive_file: str) -> str:
    """This process's liveness file: ``alive_file``, or when empty ``{home}/alive``."""
    return alive_file or os.path.join(home, "alive")


def max_age(heartbeat_timeout: float) -> float:
    """Seconds after which a silent process is declared stuck: the heartbeat timeout and a
    second. A loop slower than that is lost to the cluster anyway — the coordinator calls a
    worker silent for ``heartbeat_timeout`` lost, and a coordinator's workers fence
    themselves soon after (``worker.fence``) — so replacing it then only starts its
    successor sooner (a paused coordinator: issue 48; it was ``2 × timeout + 1``)."""
    return heartbeat_timeout + 1.0


def touch(path: str) -> None:
    """Mark the process alive now (the file's modification time)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, path)


async def touch_forever(path: str, every: float) -> None:
    """Touch ``path`` every ``every`` seconds until cancelled (a failure is logged once and
    retried: a full disk must not take the process down)."""
    failing = False
    while True:
        try:
            touch(path)
            failing = False
        except OSError as exc:
            if not failing:
                log.warning("cannot touch the liveness file %s: %s", path, exc)
            failing = True
        await asyncio.sleep(every)


#: Seconds a process that is exiting on purpose keeps its liveness file fresh from a thread
#: (:func:`touch_while_exiting`): its loop has ended, and the rest of its exit — the
#: executor's threads, the stores' background work, the interpreter's own — took 0.7–1.8 s
#: on a loaded 2-core host; the supervisor killed a retiring worker at 1.75 s and, the exit
#: code no longer saying "retired", restarted it into a cluster that had no place for it.
EXIT_GRACE = 15.0


def touch_while_exiting(path: str, every: float, seconds: float = EXIT_GRACE) -> threading.Thread:
    """Touch ``path`` every ``every`` seconds for ``seconds`` from a daemon thread, while the
    process exits on purpose (a worker a rescale retired): an exit slower than that is
    stuck, and its stale file lets the supervisor kill it as before."""
    def run() -> None:
        # Counted, not timed against a clock: this thread's only clock is its sleeps (the
        # product reads clocks only through its clock port, and a real exit needs no more).
        for _ in range(max(1, round(seconds / every))):
            try:
                touch(path)
            except OSError:
                return
            time.sleep(every)

    thread = threading.Thread(target=run, name="liveness-exit", daemon=True)
    thread.start()
    return thread


def age(path: str, now: float | None = None) -> float | None:
    """Seconds since ``path`` was last touched (None: no such file)."""
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    return (time.time() if now is None else now) - mtime
