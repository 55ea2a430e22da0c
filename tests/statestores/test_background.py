"""statestores.background: worker processes per lane that run tasks off the caller's
process, die with their parent (even after SIGKILL) and never import the user's script."""

from __future__ import annotations

import faulthandler
import json
import operator
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statestores import background, bgworker, hints
from statestores.errors import BackgroundBusy, BackgroundDied, CorruptionError

REPO = Path(__file__).resolve().parents[2]
WAIT = 30  # seconds a background result may take on a busy machine


def _hang_guard(request: pytest.FixtureRequest, seconds: float) -> None:
    """Dump every thread's stack and exit if the test still runs after ``seconds``.

    To the terminal: pytest's fd capture keeps a duplicate of the real stderr (a dump to
    fd 2 would land in the capture file, lost when faulthandler exits the process)."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    fd = getattr(getattr(getattr(capman, "_global_capturing", None), "err", None), "targetfd_save", None)
    faulthandler.dump_traceback_later(seconds, exit=True, file=fd if isinstance(fd, int) else sys.__stderr__)


@pytest.fixture(autouse=True)
def fresh_lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts and ends without background processes, in process mode; a hang
    fails after 60 s with every thread's stack."""
    old = background.set_mode("process")
    background.shutdown()
    _hang_guard(request, 60)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        background.shutdown()
        background.set_mode(old)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, pgid)`` of ``pid`` from /proc, None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _living(pred: object) -> list[int]:
    """Pids of the non-zombie processes whose ``(state, ppid, pgid)`` satisfies ``pred``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[0] not in ("Z", "X") and pred(st):  # type: ignore[operator]
                out.append(int(name))
    return out


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"statestores._bgmain" in f.read()
    except OSError:
        return False


def _children() -> list[int]:
    """Our background workers among this process' children (the suite's Kafka and MinIO
    are children too)."""
    me = os.getpid()
    return [pid for pid in _living(lambda st: st[1] == me) if _is_worker(pid)]


def _lane_pids() -> dict[str, int | None]:
    """The worker pid of each lane this test created (a store left open by an earlier
    test may start workers of its own, so the lanes are asked, not the process table)."""
    with background._lock:
        return {name: (lane.proc.pid if lane.proc is not None else None) for name, lane in background._lanes.items()}


# ---------------------------------------------------------------- the API


def test_tasks_run_in_another_process_per_lane() -> None:
    merge_pid = background.submit(os.getpid).result(WAIT)
    flush_pid = background.submit(os.getpid, lane="flush").result(WAIT)
    assert len({os.getpid(), merge_pid, flush_pid}) == 3
    assert merge_pid in _children() and flush_pid in _children()
    # one process per lane, reused by the next task
    assert background.submit(os.getpid).result(WAIT) == merge_pid
    assert background.submit(os.getppid, lane="flush").result(WAIT) == os.getpid()


def test_results_and_exceptions_cross_the_pipe() -> None:
    assert background.submit(operator.add, 2, 3).result(WAIT) == 5
    big = {b"k%06d" % i: b"v" * (i % 50) for i in range(20_000)}  # several pipe buffers each way
    assert background.submit(dict, big, lane="flush").result(WAIT) == big
    # exception types (and their attributes) are preserved
    exc = background.submit(os.stat, "/nonexistent/statestores").exception(WAIT)
    assert isinstance(exc, FileNotFoundError) and exc.filename == "/nonexistent/statestores"
    assert "raised in background process" in "".join(exc.__notes__)  # with the worker's traceback
    exc = background.submit(hints.decode, b"junk", "/some/file.hint").exception(WAIT)
    assert isinstance(exc, CorruptionError) and exc.path == "/some/file.hint"
    # a task that prints does not corrupt the protocol
    assert background.submit(print, "printed by a background task").result(WAIT) is None
    assert background.submit(operator.mul, 6, 7).result(WAIT) == 42


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickle re-creates it with one argument
        super().__init__(f"{a}/{b}")


def test_an_unpicklable_exception_becomes_a_runtime_error() -> None:
    try:
        raise _Unpicklable(1, 2)
    except _Unpicklable as e:
        tid, ok, exc = pickle.loads(bgworker.error_reply(7, e))
    assert (tid, ok) == (7, False)
    assert isinstance(exc, RuntimeError) and "_Unpicklable('1/2')" in str(exc) and "Traceback" in str(exc)


def test_an_argument_that_cannot_cross_fails_the_task_not_the_lane() -> None:
    exc = background.submit(operator.add, lambda: 1, 2).exception(WAIT)
    assert isinstance(exc, (pickle.PicklingError, AttributeError, TypeError))
    assert background.submit(operator.add, 1, 2).result(WAIT) == 3

    def in_main() -> int:
        return 1

    in_main.__module__ = "__main__"  # the worker never imports the user's script
    exc = background.submit(in_main).exception(WAIT)
    assert isinstance(exc, TypeError) and "local=True" in str(exc)
    assert background.submit(in_main, local=True).result(WAIT) == 1


def test_local_tasks_run_on_the_dispatcher_thread() -> None:
    assert background.submit(os.getpid, local=True).result(WAIT) == os.getpid()
    t = background.submit(threading.current_thread, lane="flush", local=True).result(WAIT)
    assert t is not threading.current_thread() and t.name == "statestores-bg-flush"
    assert background.submit(lambda x: x + 1, 1, local=True).result(WAIT) == 2  # no pickling
    assert not any(_lane_pids().values())  # nothing was started for them


def test_thread_mode_runs_everything_in_process() -> None:
    background.set_mode("thread")  # (fresh_lanes puts the mode back)
    assert background.mode() == "thread"
    assert background.submit(os.getpid).result(WAIT) == os.getpid()
    background.warm_up("flush")
    assert background.submit(os.getpid, lane="flush").result(WAIT) == os.getpid()
    assert not any(_lane_pids().values())
    with pytest.raises(ValueError, match="SFAAS_BACKGROUND"):
        background.set_mode("fork")


def test_unknown_lanes_are_refused() -> None:
    with pytest.raises(ValueError, match="'compaction'"):
        background.submit(os.getpid, lane="compaction")
    with pytest.raises(ValueError, match="'compaction'"):
        background.warm_up("compaction")


def _on_a_thread(call: Callable[[], Any]) -> Any:
    """What ``call()`` returns or raises, run on a thread given up on after ``WAIT``
    seconds (a call that blocks on something that never happens fails, and does not hang)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert out, f"still blocked after {WAIT} s"
    return out[0]


def test_submit_raises_busy_when_the_lane_queue_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "MAX_QUEUED", 2)
    gate = threading.Event()
    blocker = background.submit(gate.wait, WAIT, local=True)
    deadline = time.monotonic() + WAIT
    while not blocker.running():  # the dispatcher holds it: the queue is empty again
        assert time.monotonic() < deadline
        time.sleep(0.005)
    queued = [background.submit(operator.add, i, 1) for i in range(2)]
    # never blocks: nothing can make room while the gate is shut, so a submit that waited
    # for room would still wait when the thread is given up on
    refused = _on_a_thread(lambda: background.submit(operator.add, 0, 0))
    assert isinstance(refused, BackgroundBusy) and "'merge'" in str(refused), refused
    assert not blocker.done() and not any(f.done() for f in queued)  # the queue was still full
    assert background.submit(operator.add, 1, 1, lane="flush").result(WAIT) == 2  # lanes are independent
    gate.set()
    assert blocker.result(WAIT) is True
    assert [f.result(WAIT) for f in queued] == [1, 2]
    assert background.submit(operator.add, 0, 0).result(WAIT) == 0


def test_a_killed_worker_fails_its_task_and_the_next_task_gets_a_new_one() -> None:
    pid = background.submit(os.getpid).result(WAIT)
    fut = background.submit(time.sleep, 60)
    deadline = time.monotonic() + WAIT
    while not fut.running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    exc = fut.exception(WAIT)
    assert isinstance(exc, BackgroundDied)
    assert "merge" in str(exc) and "-9" in str(exc)
    new = background.submit(os.getpid).result(WAIT)
    assert new != pid and new in _children()


def test_warm_up_starts_the_worker_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    # the worker's start is held until warm_up returned: a warm_up that waited for it would
    # still wait when the thread is given up on
    gate = threading.Event()
    start = background._Lane._ensure_proc

    def held_start(lane: Any) -> Any:
        assert gate.wait(WAIT), "warm_up never returned"
        return start(lane)

    monkeypatch.setattr(background._Lane, "_ensure_proc", held_start)
    assert _on_a_thread(lambda: (background.warm_up("flush"), background.warm_up("flush"))) == (None, None)
    assert not _lane_pids().get("flush")  # returned before its process started
    gate.set()
    deadline = time.monotonic() + WAIT
    while not _lane_pids().get("flush"):
        assert time.monotonic() < deadline, "warm_up started no process"
        time.sleep(0.01)
    pid = _lane_pids()["flush"]
    assert pid in _children()
    assert background.submit(os.getpid, lane="flush").result(WAIT) == pid  # it is the lane's


def test_the_worker_is_niced_and_marked() -> None:
    assert background.submit(os.nice, 0).result(WAIT) == min(19, os.nice(0) + 10)
    assert background.submit(os.getenv, background.CHILD_ENV, lane="flush").result(WAIT) == "1"


def test_the_worker_imports_statestores_from_its_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the cwd nor a PYTHONPATH without it can make the worker import another
    ``statestores`` (or none)."""
    shadow = tmp_path / "statestores"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the shadowing statestores in the cwd')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    path = background.submit(eval, "__import__('sys').path").result(WAIT)
    assert path[0] == background._ROOT and str(tmp_path) not in path
    assert str(tmp_path / "elsewhere") in path  # the rest of PYTHONPATH is kept


def test_shutdown_stops_the_workers_and_a_later_submit_starts_anew() -> None:
    pids = {background.submit(os.getpid).result(WAIT), background.submit(os.getpid, lane="flush").result(WAIT)}
    assert pids <= set(_children())
    running = background.submit(time.sleep, 30)
    queued = background.submit(operator.add, 1, 1)
    deadline = time.monotonic() + WAIT
    while not running.running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    t = time.monotonic()
    background.shutdown()
    # the grace a running task gets must end: shutdown returns long before the 30 s the task
    # would sleep (a generous bound, for a loaded machine; the grace is 2 s)
    assert time.monotonic() - t < 20
    assert not pids & set(_children())
    assert isinstance(running.exception(0), BackgroundDied)
    assert isinstance(queued.exception(0), BackgroundDied)
    assert background.submit(os.getpid).result(WAIT) not in pids


def test_a_forked_child_gets_its_own_lanes() -> None:
    background.submit(os.getpid).result(WAIT)  # the parent's lane exists
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            ppid = background.submit(os.getppid).result(20)
            os.write(w, str(ppid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            got = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int(got) == pid  # the worker that ran it is the forked child's own


# ---------------------------------------------------------------- SIGKILL leaves nothing behind

_WRITER = r"""
import itertools, os, sys
import statestores
d = sys.argv[1]
stores = [
    statestores.open("lsm", os.path.join(d, "lsm"), memtable_bytes=400, max_runs_per_level=2),
    statestores.open("appendlog", os.path.join(d, "al"), threshold=256, max_runs_per_level=2),
    statestores.open("hybridlog", os.path.join(d, "hl"), ro_lag_interval=2, flush_interval=4, max_runs_per_level=2),
]
for i in itertools.count():
    for s in stores:
        s.put(b"key-%05d" % (i % 3000), b"value-%d" % i)
    if i == 500:
        open(os.path.join(d, "ready"), "w").close()
    if i % 100 == 0:
        print(i, flush=True)
"""


def _read_to_eof(fd: int, timeout: float) -> bool:
    """Read ``fd`` until EOF; False if EOF did not come within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready and not os.read(fd, 1 << 16):
            return True


def test_sigkill_of_the_writer_leaves_no_process_and_no_descriptor(tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=_env(),
            start_new_session=True,
        )
    group = proc.pid
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + WAIT
        helpers: list[int] = []
        while not (tmp_path / "ready").exists() or len(helpers) < 2:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, f"writer not ready; helpers {helpers}"
            time.sleep(0.02)
            helpers = [p for p in _living(lambda st: st[2] == group) if p != group]
        assert (tmp_path / "al").exists() and (tmp_path / "hl").exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 2
        while (alive := _living(lambda st: st[2] == group)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive, f"processes of the killed writer's group still alive: {alive}"
        assert _read_to_eof(proc.stdout.fileno(), 2), "a process still holds the writer's stdout"
    finally:
        try:
            os.killpg(group, signal.SIGKILL)  # whatever is left (the old forkserver pool)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ---------------------------------------------------------------- no re-import of __main__

_SCRIPT = r"""
import json, os, sys, time
with open(os.environ["IMPORT_LOG"], "a") as f:
    f.write("%d %s\n" % (os.getpid(), __name__))
import statestores
d = sys.argv[1]
lsm = statestores.open("lsm", os.path.join(d, "lsm"), memtable_bytes=400, max_runs_per_level=2)
al = statestores.open("appendlog", os.path.join(d, "al"), threshold=256, max_runs_per_level=2)
for i in range(3000):
    lsm.put(b"key-%05d" % (i % 1000), b"value-%d" % i)
    al.put(b"key-%05d" % (i % 1000), b"value-%d" % i)
lsm.put(b"extra", b"0")
al.put(b"extra", b"0")
deadline = time.monotonic() + 30
while not (lsm.stats()["merges_done"] and al.stats()["merges_done"]) and time.monotonic() < deadline:
    lsm.put(b"extra", b"%f" % time.monotonic())
    al.put(b"extra", b"%f" % time.monotonic())
    time.sleep(0.01)
out = {name: {k: s.stats()[k] for k in ("merges_done", "flushes") if k in s.stats()} for name, s in (("lsm", lsm), ("appendlog", al))}
lsm.close()
al.close()
for engine, sub in (("lsm", "lsm"), ("appendlog", "al")):
    with statestores.open(engine, os.path.join(d, sub)) as s:
        out[engine]["keys"] = sum(1 for _ in s.items())
print(json.dumps(out))
"""


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _hang_guard(request, 150)  # the script gets 120 s
    script = tmp_path / "unguarded.py"
    script.write_text(_SCRIPT)
    log = tmp_path / "imports.log"
    env = {**_env(), "IMPORT_LOG": str(log)}
    res = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data")], capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 0, res.stderr
    assert "bootstrapping phase" not in res.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" __main__"), lines  # the script ran once
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["lsm"]["merges_done"] > 0 and out["lsm"]["flushes"] > 0
    assert out["appendlog"]["merges_done"] > 0
    assert out["lsm"]["keys"] == out["appendlog"]["keys"] == 1001


@pytest.mark.parametrize(("engine", "lanes"), [("appendlog", {"merge"}), ("hybridlog", {"merge", "flush"}),
                                               ("lsm", {"merge", "flush"})])
def test_opening_a_store_starts_its_lanes_processes(engine: str, lanes: set[str], tmp_path: Path) -> None:
    """A store's first merge must not pay for starting the background process (~0.3 s of
    CPU on the cores its caller runs on): an appendlog's first merge came with its first
    cap seal, rounds into a run, and stalled the runtime there. Opening starts them."""
    import statestores

    assert not any(_lane_pids().values())
    store = statestores.open(engine, tmp_path / engine)
    try:
        deadline = time.monotonic() + WAIT
        while {name for name, pid in _lane_pids().items() if pid} != lanes:
            assert time.monotonic() < deadline, f"{engine} started {_lane_pids()}, expected {lanes}"
            time.sleep(0.01)
        assert all(pid in _children() for name, pid in _lane_pids().items() if name in lanes)
    finally:
        store.close()
