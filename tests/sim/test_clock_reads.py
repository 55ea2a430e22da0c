"""Every clock read of the product goes through its process's clock port (issue 51: "every
clock ... scheduled by one seeded random source"; no ``if simulated:``), so a simulated
wall-clock jump (``--clock AT,PROCESS,SECONDS``) reaches the decisions that read the wall
clock: a durable timer's wake-up (``worker/world.py:World.wake_for_timers``) and the
``now`` of an epoch a worker begins under a lease (``worker/protocols/lease.py``). The
epochs' gathering window runs on the clock port's monotonic clock, so a run with it on
replays byte for byte.

The layout check reads the source of ``worker``, ``coordinator`` and ``sfaas/runtime``: no
``time.time``/``time.monotonic`` outside the real clock port (``sfaas/runtime/ports.py``)
but the few reads named in :data:`ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from examples.bank import app
from sfaas.runtime import ports, wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn import internal
from sfaas.sim import clock, cluster
from sfaas.sim.__main__ import ROLES
from sfaas.sim.budget import run_seed
from sfaas.sim.faults import draw
from sfaas.sim.ports import WALL_START, VirtualClockPort, WallClocks
from worker.protocols.lease import EpochLeaseHolder
from worker.state import WorkerState
from worker.world import World

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("worker", "coordinator", "sfaas/runtime")
#: The clock functions a process must read through its port.
CLOCKS = {"time", "monotonic"}
#: (file, function) → why it reads the real clock. Nothing else may.
ALLOWED: dict[tuple[str, str], str] = {
    ("sfaas/runtime/ports.py", "SystemClock"): "the real clock port itself",
    ("sfaas/runtime/liveness.py", "age"):
        "the age of a file's mtime, which the OS stamps with the machine's real clock "
        "(the launcher's liveness files)",
}


def _clock_reads(path: Path) -> list[tuple[int, str]]:
    """(line, enclosing function or class) of each ``time.time``/``time.monotonic`` (called
    or passed on) and each ``from time import time``/``monotonic`` in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = node.name
        if (isinstance(node, ast.Attribute) and node.attr in CLOCKS
                and isinstance(node.value, ast.Name) and node.value.id == "time"):
            found.append((node.lineno, scope))
        if (isinstance(node, ast.ImportFrom) and node.module == "time"
                and any(a.name in CLOCKS for a in node.names)):
            found.append((node.lineno, scope))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, "<module>")
    return found


def test_the_product_reads_the_clocks_only_through_its_clock_port() -> None:
    wrong, used = [], set()
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, scope in _clock_reads(path):
                if (rel, scope) in ALLOWED:
                    used.add((rel, scope))
                else:
                    wrong.append(f"{rel}:{line} (in {scope})")
    assert not wrong, ("reads of the real clock, not the process's clock port "
                       "(ports.current().clock, or the clock the part was built with):\n"
                       + "\n".join(wrong))
    assert used == set(ALLOWED), f"allowed reads no longer there: {set(ALLOWED) - used}"


def test_the_layout_check_sees_a_direct_read(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import time\nfrom time import monotonic\n\n\ndef f():\n"
                   "    return time.time() - time.time_ns()\n\n\n"
                   "class C:\n    clock = time.monotonic\n")
    assert _clock_reads(src) == [(2, "<module>"), (6, "f"), (10, "C")]


# -- a jump of the simulated wall clock reaches the worker's decisions -------------------------
def _ports(walls: WallClocks, name: str) -> ports.Ports:
    """The real ports but for the clock: the virtual one, with ``name``'s wall clock."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, clock.VirtualLoop)
    return dataclasses.replace(ports.REAL, clock=VirtualClockPort(loop.clock, walls.of(name)))


async def _in_process(p: ports.Ports, fn: Any) -> Any:
    """``fn()`` as the process of ports ``p`` runs it (its tasks' context)."""
    return await asyncio.get_running_loop().create_task(_call(fn), context=ports.context(p))


async def _call(fn: Any) -> Any:
    return fn()


def _world() -> tuple[World, list[float]]:
    """A worker's world (built in its process: no clock given), and when its epochs woke."""
    settings = Settings.load({"home": "/nonexistent", "snapshot_interval": 0}, env={})
    world = World(settings, WorkerState(10, False, ""), SimpleNamespace())  # type: ignore[arg-type]
    woke: list[float] = []
    world.wakes(SimpleNamespace(work_arrived=lambda: woke.append(
        asyncio.get_running_loop().time())))  # type: ignore[arg-type]
    return world, woke


def _timer_wakes(jump: float, begun: bool = False) -> list[float]:
    """When a worker's epochs wake for a timer due 10 s after its start (the due time the
    coordinator's clock stamped), its own wall clock stepped by ``jump`` s at 1 s;
    ``begun``: a live epoch began after the jump, its ``now`` the cluster's clock."""

    async def scenario() -> list[float]:
        walls = WallClocks()
        p = _ports(walls, "worker-0")
        made: tuple[World, list[float]] = await _in_process(p, _world)
        world, woke = made
        wall = p.clock.time  # (this worker's: the cluster's until the jump)
        due = wall() + 10.0
        world.timers.on_record("op", internal.timer_key("k", due, 1, 0), b"x")
        await asyncio.sleep(1.0)
        walls.jump("worker-0", jump)
        if begun:
            world._state.loop = SimpleNamespace(queue=[])  # type: ignore[assignment]
            await _in_process(p, lambda: world.before_begin(wall() - jump))  # the cluster's now
        await _in_process(p, world.wake_for_timers)  # (a commit's records re-arm the wake)
        await asyncio.sleep(60.0)
        return woke

    return clock.run(scenario(), seed=0)


def test_a_timer_wakes_the_epochs_by_the_workers_own_wall_clock() -> None:
    on_time = _timer_wakes(0.0)
    assert len(on_time) == 1 and abs(on_time[0] - 10.0) < 0.01, on_time
    early = _timer_wakes(4.0)  # its clock runs 4 s ahead: the timer is due 4 s sooner
    assert len(early) == 1 and abs(early[0] - 6.0) < 0.01, early
    late = _timer_wakes(-30.0)  # 30 s behind: 30 s later
    assert len(late) == 1 and abs(late[0] - 40.0) < 0.01, late


def test_a_timer_wakes_by_the_clusters_clock_once_an_epoch_showed_it() -> None:
    """After a live epoch began, the wake is timed on the cluster's clock as its ``now``
    showed it, whatever this machine's clock says: on time, neither early (empty epochs
    every 2 ms until this clock reached the due time) nor late."""
    for jump in (4.0, -30.0):
        woke = _timer_wakes(jump, begun=True)
        assert len(woke) == 1 and abs(woke[0] - 10.0) < 0.01, (jump, woke)


def test_a_leased_epoch_takes_its_now_from_the_workers_wall_clock() -> None:
    async def scenario() -> tuple[float, list[wire.Begin]]:
        walls = WallClocks()
        p = _ports(walls, "worker-1")
        begun: list[wire.Begin] = []
        host = SimpleNamespace(index=1, n_workers=2, start_epoch=begun.append,
                               send_peers=lambda msg: None)
        lease = await _in_process(p, lambda: EpochLeaseHolder(host))  # type: ignore[arg-type]
        lease.upto, lease.run, lease.begun, lease.committed = 10, 7, 4, 4
        await asyncio.sleep(2.5)
        walls.jump("worker-1", -90.0)
        lease.advance()  # epoch 4 committed under the lease: epoch 5 begins here
        return p.clock.time(), begun

    wall, begun = clock.run(scenario(), seed=0)
    assert [b.epoch for b in begun] == [5]
    assert wall == WALL_START + 2.5 - 90.0 and begun[0].now == wall, (begun, wall)


def test_a_run_with_the_gathering_window_on_replays_byte_for_byte(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window (``coordinator/epochs.py``) waits for requests to gather between epochs;
    timed by ``time.perf_counter`` it made two runs of a seed differ (the simulator runs
    with ``epoch_gather`` 0 for that)."""
    settings = cluster.SimCluster._settings
    monkeypatch.setattr(cluster.SimCluster, "_settings", lambda self: dataclasses.replace(
        settings(self), epoch_gather=0.005))
    runs = [run_seed(app, ROLES, 1, draw(1)) for _ in range(2)]
    assert not runs[0].violations, runs[0].violations
    digests = [hashlib.sha256("\n".join(o.trace).encode()).hexdigest()[:16] for o in runs]
    assert digests[0] == digests[1], digests
