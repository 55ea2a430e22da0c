"""Background processes for CPU-heavy store work (merges, memtable flushes).

The work runs in a separate process so that it uses the second core and never holds the
GIL of the process serving reads and writes. There are three *lanes*, ``"merge"``,
``"flush"`` (a flush must never queue behind a long merge) and ``"upload"`` (snapshot
uploads: checksums and transfers, see ``snapshots.ship``); each has one worker process
and one dispatcher thread (a daemon) that owns it. :func:`submit` puts the task on the
lane's bounded queue and returns at once; the dispatcher starts the worker if needed (so
the 0.1-0.5 s a process start takes is never paid on the caller's thread), sends it the
task, waits for the reply and completes the future. Submitted functions must be top-level
functions of a module the worker can import (not ``__main__``) with picklable arguments.

The worker is ``python -P -m statestores._bgmain <parent pid>`` started with
:class:`subprocess.Popen` (never :mod:`multiprocessing`): it imports ``statestores`` and
what the tasks name, never the user's ``__main__``, so a script that opens a store at
module level needs no ``if __name__ == "__main__":`` guard. It dies with its parent:
``PR_SET_PDEATHSIG`` (Linux) plus a watchdog thread that exits once ``os.getppid()``
changes; it inherits no descriptor but its pipes and stderr; it runs at ``nice`` 10 and
ignores SIGINT (the parent handles Ctrl-C). Tasks and replies are length-prefixed pickle
frames over the anonymous pipes between the two processes (nothing from the network).
Credentials never go into those pickles: before a task, the worker is sent the parent's
``remotes.credentials`` secrets — when they changed since it last got them — as one JSON
frame tagged :data:`~statestores.bgframes.CREDENTIALS`, so a pickled remote resolves its
secret there. The worker's side is :mod:`statestores.bgworker`.

**Done-callbacks run on the lane's dispatcher thread**, shared by every store in the
process: a done-callback must only hand the result to a thread the store owns (put it on
a queue, start a thread); it must never take a store lock or do slow work — the next
task of the lane waits for it, and if a store thread holds that lock while it waits for
a later task of the same lane, neither ever goes on.

``set_mode("thread")`` (the runtime's ``SFAAS_BACKGROUND=thread``), or ``submit(...,
local=True)``, runs tasks on the lane's dispatcher thread in this process instead (under
profilers, on a single core, or when an argument cannot cross processes).
``set_mode("loop")`` runs them later on the submitting thread's event loop, one at a time,
and a store's uploads too (:func:`serial`): no thread at all, an order the loop alone
decides — the simulator's (:mod:`statestores.bgloop`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .bgframes import CREDENTIALS, FRAME, PICKLE, recv_frame, write_all
from .bgloop import LoopLanes, LoopSerial, Serial, ThreadSerial, help_until, running_loop
from .errors import BackgroundBusy, BackgroundDied

__all__ = [
    "submit", "warm_up", "shutdown", "mode", "set_mode", "cpu_seconds", "MAX_QUEUED",
    "BackgroundBusy", "BackgroundDied", "serial", "monotonic", "wait", "wait_until", "Serial",
    "MODES",
]

log = logging.getLogger("statestores")

T = TypeVar("T")

#: Per lane bound on queued (not yet started) tasks; :func:`submit` raises
#: :class:`BackgroundBusy` beyond it.
MAX_QUEUED: int = 256

LANES = ("merge", "flush", "upload")

#: Set in the worker process (informational: tasks may look at it).
CHILD_ENV = "SFAAS_BACKGROUND_CHILD"

#: Seconds :func:`shutdown` waits for a lane's running task before killing its worker.
_SHUTDOWN_WAIT = 2.0


# the directory that holds the statestores package: first on the worker's PYTHONPATH
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: Where tasks run (:func:`set_mode`); one process-wide choice, like the lanes.
_mode = "process"
MODES = ("process", "thread", "loop")


def set_mode(value: str) -> str:
    """Run this process's tasks in background processes (``"process"``, the default), on
    the lanes' dispatcher threads (``"thread"``) or later on the submitting thread's event
    loop (``"loop"``, :mod:`statestores.bgloop`); returns the mode it replaces. The runtime
    sets it from its ``background`` setting (``SFAAS_BACKGROUND``); this library reads no
    environment variable of its own."""
    global _mode
    if value not in MODES:
        raise ValueError(
            f"background mode (SFAAS_BACKGROUND) must be one of {', '.join(MODES)}, "
            f"got {value!r}")
    old, _mode = _mode, value
    return old


def mode() -> str:
    """``"process"`` (default), ``"thread"`` or ``"loop"``: see :func:`set_mode`."""
    return _mode


def serial(name: str) -> Serial:
    """An executor that runs tasks one at a time in submit order (a store's uploads): a
    thread of its own, or the event loop in the ``loop`` mode. ``submit(fn, *args,
    not_before=t)``: the loop starts the task at ``t`` (:func:`monotonic`) at the
    earliest; a thread starts it at once, and the task waits itself (:func:`wait`)."""
    return LoopSerial(MAX_QUEUED) if _mode == "loop" else ThreadSerial(name)


def monotonic() -> float:
    """The clock of :func:`serial`'s ``not_before``: ``time.monotonic()``, or in the
    ``loop`` mode the running event loop's ``time()`` (virtual in a simulation)."""
    loop = running_loop() if _mode == "loop" else None
    return loop.time() if loop is not None else time.monotonic()


def wait_until(done: Callable[[], bool], wait: Callable[[], object]) -> None:
    """Wait for background work until ``done()``: ``wait()`` (a condition's, an event's,
    a future's wait) on a thread; in the ``loop`` mode, where the work is queued on this
    very thread, run it meanwhile (:func:`statestores.bgloop.help_until`)."""
    if _mode == "loop" and running_loop() is not None:
        help_until(done)
    else:
        wait()


def wait(event: threading.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event`` (a task waiting for its start time, see
    :func:`serial`); whether it is set. In the ``loop`` mode it never waits: the loop
    started the task at its time, or a waiter runs it now, wanting it done."""
    if _mode == "loop" or seconds <= 0:
        return event.is_set()
    return event.wait(seconds)


# ---------------------------------------------------------------------- parent side


class _Task:
    __slots__ = ("fn", "args", "future", "local")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], future: concurrent.futures.Future[Any],
        local: bool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.future = future
        self.local = local


_WARM = object()  # queue marker: start the worker now
_STOP = object()  # queue marker: stop the worker and the dispatcher


class _Lane:
    """One worker process and the dispatcher thread that owns it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: queue.Queue[Any] = queue.Queue(MAX_QUEUED)
        self.lock = threading.Lock()  # guards closed, warming and proc
        self.closed = False
        self.warming = False  # a _WARM marker is queued
        self.proc: subprocess.Popen[bytes] | None = None
        self._task_ids = 0
        self._credentials_sent = -1  # the credentials generation the worker holds
        self.thread = threading.Thread(target=self._run, name=f"statestores-bg-{name}", daemon=True)
        self.thread.start()

    # -- caller side

    def put(self, task: _Task) -> None:
        with self.lock:
            if self.closed:
                raise _LaneClosed
            try:
                self.queue.put_nowait(task)
            except queue.Full:
                raise BackgroundBusy(
                    f"background lane {self.name!r} has {self.queue.maxsize} tasks queued; "
                    "try again later"
                ) from None

    def warm(self) -> None:
        with self.lock:
            if self.closed or self.proc is not None or self.warming:
                return
            with contextlib.suppress(queue.Full):  # a full queue: the worker is busy anyway
                self.queue.put_nowait(_WARM)
                self.warming = True

    def stop(self) -> None:
        """Fail queued tasks, let the running one finish (<= 2 s, then kill), join."""
        dropped: list[_Task] = []
        with self.lock:
            if self.closed:
                return
            self.closed = True
            while True:  # no put can happen any more: drain, then the stop marker fits
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Task):
                    dropped.append(item)
            self.queue.put_nowait(_STOP)
        for task in dropped:
            # failed, not cancelled: callers handle a failed task already (while
            # fut.exception() raises for a cancelled future)
            if task.future.set_running_or_notify_cancel():
                task.future.set_exception(
                    BackgroundDied(
                        f"background lane {self.name!r} was shut down before the task ran"
                    )
                )
        del dropped
        if self.thread is threading.current_thread():
            return  # shutdown() from a done-callback: the dispatcher stops after it
        self.thread.join(_SHUTDOWN_WAIT)
        deadline = time.monotonic() + 5.0
        while self.thread.is_alive() and time.monotonic() < deadline:
            with self.lock:
                proc = self.proc
            if proc is not None:
                with contextlib.suppress(OSError):
                    proc.kill()
            self.thread.join(0.1)
        if self.thread.is_alive():
            log.warning("background lane %r did not stop (a local task still runs?)", self.name)

    # -- dispatcher thread

    def _run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if item is _STOP:
                    break
                try:
                    self._handle(item)
                except BaseException as exc:  # a bug here must not stop the lane
                    log.exception("background lane %r failed to run a task", self.name)
                    if isinstance(item, _Task) and not item.future.done():
                        item.future.set_exception(exc)
                del item  # drop the reference to the arguments (a memtable) now
        finally:
            self._stop_proc()

    def _handle(self, item: Any) -> None:
        if item is _WARM:
            with self.lock:
                self.warming = False
            if mode() == "process":
                try:
                    self._ensure_proc()
                except Exception as exc:  # retried by the next task
                    log.debug("starting the background %s process failed: %s", self.name, exc)
            return
        task: _Task = item
        if not task.future.set_running_or_notify_cancel():
            return
        if task.local or _in_child or mode() == "thread":
            self._run_local(task)
        else:
            self._run_remote(task)

    def _run_local(self, task: _Task) -> None:
        t0 = time.thread_time()
        try:
            result = task.fn(*task.args)
        except BaseException as exc:
            _charge(self.name, time.thread_time() - t0)
            task.future.set_exception(exc)
        else:
            _charge(self.name, time.thread_time() - t0)
            task.future.set_result(result)

    def _ensure_proc(self) -> subprocess.Popen[bytes]:
        with self.lock:
            proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                return proc
            # it died while idle (killed, OOM): start a new one rather than fail this task
            log.warning(
                "background %s process exited with %s while idle; starting a new one", self.name,
                proc.returncode,
            )
            self._reap()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env[CHILD_ENV] = "1"
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "statestores._bgmain", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            bufsize=0,
            env=env,
        )
        with self.lock:
            self.proc = proc
            closed = self.closed
        self._credentials_sent = -1
        if closed:  # stop() gave up waiting for us meanwhile
            proc.kill()
        return proc

    def _run_remote(self, task: _Task) -> None:
        fut = task.future
        try:
            proc = self._ensure_proc()
        except Exception as exc:
            fut.set_exception(exc)
            return
        assert proc.stdin is not None and proc.stdout is not None
        if getattr(task.fn, "__module__", None) == "__main__":
            fut.set_exception(
                TypeError(
                    f"{task.fn!r} is defined in __main__, which the background process does not "
                    "import; move it to a module or submit it with local=True"
                )
            )
            return
        self._task_ids += 1
        tid = self._task_ids
        try:
            frame = pickle.dumps((tid, task.fn, task.args), PICKLE)
        except Exception as exc:  # an argument cannot cross processes
            fut.set_exception(exc)
            return
        cpu0 = _proc_cpu(proc.pid)
        try:
            self._send_credentials(proc.stdin.fileno())
            write_all(proc.stdin.fileno(), FRAME.pack(len(frame)))
            write_all(proc.stdin.fileno(), frame)
            del frame
            reply = recv_frame(proc.stdout.fileno())
        except (OSError, EOFError, ValueError):
            reply = None
        cpu1 = _proc_cpu(proc.pid)
        if cpu0 is not None and cpu1 is not None:
            _charge(self.name, cpu1 - cpu0)
        if reply is None:
            fut.set_exception(
                BackgroundDied(
                    f"background {self.name} process died while running a task (exit code "
                    f"{self._reap()})"
                )
            )
            return
        try:
            rid, ok, value = pickle.loads(reply)
        except Exception as exc:
            fut.set_exception(
                RuntimeError(
                    f"the background {self.name} process sent a reply that cannot be read: {exc!r}"
                )
            )
            return
        if rid not in (tid, None):  # None: the worker could not read the task's id
            fut.set_exception(
                RuntimeError(
                    f"background {self.name} process replied to task {rid}, expected {tid}"
                )
            )
            self._reap(kill=True)
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def _send_credentials(self, fd: int) -> None:
        """The parent's remote credentials, if the worker lacks the current ones (JSON)."""
        from remotes import credentials

        generation, mapping = credentials.export()
        if generation == self._credentials_sent:
            return
        frame = CREDENTIALS + json.dumps(mapping).encode()
        write_all(fd, FRAME.pack(len(frame)))
        write_all(fd, frame)
        self._credentials_sent = generation

    def _reap(self, kill: bool = False) -> int | None:
        """Forget the worker (after EOF on its pipe: it died); its exit code."""
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return None
        if kill:
            with contextlib.suppress(OSError):
                proc.kill()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:  # EOF but alive: it closed its pipe itself
            proc.kill()
            return proc.wait()

    def _stop_proc(self) -> None:
        """Close the worker's stdin (it exits at EOF), wait <= 2 s, then kill it."""
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        try:
            proc.wait(_SHUTDOWN_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_cpu: dict[str, float] = dict.fromkeys(LANES, 0.0)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _charge(lane: str, seconds: float) -> None:
    _cpu[lane] += max(0.0, seconds)  # one writer per lane: its dispatcher thread


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` used so far; None where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of stat(5)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds the tasks of each lane used in this process's lifetime: the worker
    process's while it ran them (Linux), or the dispatcher thread's for local tasks."""
    return dict(_cpu)


class _LaneClosed(Exception):
    """(internal) The lane was stopped between looking it up and queueing on it."""


_lock = threading.Lock()
_lanes: dict[str, _Lane] = {}
_pid = os.getpid()
_in_child = False  # True in a worker process: tasks there run locally (no grandchildren)
_loop_lanes = LoopLanes(MAX_QUEUED)  # the loop mode's (they hold no thread)


def run_tasks_here() -> None:
    """Run every later task of this process on its lane's dispatcher thread: a worker
    process (:mod:`statestores.bgworker`) calls it, so its tasks start no worker of their own."""
    global _in_child
    _in_child = True


def _lane(name: str) -> _Lane:
    global _pid, _lanes
    if name not in LANES:
        raise ValueError(
            f"unknown background lane {name!r}; expected one of {', '.join(map(repr, LANES))}"
        )
    with _lock:
        if _pid != os.getpid():  # forked: the lanes (threads, pipes) belong to the parent
            _lanes = {}
            _pid = os.getpid()
        lane = _lanes.get(name)
        if lane is None:
            lane = _lanes[name] = _Lane(name)
        return lane


def submit(
    fn: Callable[..., T], *args: Any, lane: str = "merge", local: bool = False
) -> concurrent.futures.Future[T]:
    """Run ``fn(*args)`` in ``lane``'s worker process; the future carries its result or exception.

    Never blocks: raises :class:`BackgroundBusy` when ``MAX_QUEUED`` tasks already wait
    in the lane. If the worker dies while running the task the future fails with
    :class:`BackgroundDied` (the next task starts a new worker). ``local=True`` runs it on
    the lane's dispatcher thread in this process instead. Done-callbacks run on the
    dispatcher thread: see the module docstring. In the ``loop`` mode the task runs later
    on the caller's event loop, its done-callbacks there too (:mod:`statestores.bgloop`).
    """
    if _mode == "loop" and not _in_child:
        if lane not in LANES:
            raise ValueError(f"unknown background lane {lane!r}; expected one of "
                             f"{', '.join(map(repr, LANES))}")
        return _loop_lanes.submit(lane, fn, args, lambda s: _charge(lane, s))
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()
    task = _Task(fn, args, fut, local)
    for _ in range(3):
        try:
            _lane(lane).put(task)
            return fut
        except _LaneClosed:  # a concurrent shutdown(): the next lookup makes a new lane
            continue
    raise BackgroundBusy(f"background lane {lane!r} keeps being shut down")


def warm_up(lane: str = "merge") -> None:
    """Start ``lane``'s worker process now (on its dispatcher thread; returns at once)."""
    if _mode != "loop":
        _lane(lane).warm()


def shutdown() -> None:
    """Stop every lane: queued tasks fail with :class:`BackgroundDied`, a running one gets
    <= 2 s before its worker is killed (its future then fails the same way). A later
    :func:`submit` starts anew."""
    global _lanes
    with _lock:
        if _pid != os.getpid():
            lanes: list[_Lane] = []
        else:
            lanes = list(_lanes.values())
        _lanes = {}
    for lane in lanes:
        lane.stop()


def _after_fork_in_child() -> None:
    """A forked child gets fresh locks and no lanes; it closes the parent's worker pipes
    (they would keep a worker's stdin open after the parent closed it)."""
    global _lock, _lanes, _pid
    old = list(_lanes.values())
    _lock = threading.Lock()
    _lanes = {}
    _pid = os.getpid()
    for lane in old:
        proc = lane.proc
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)
