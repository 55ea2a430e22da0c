"""``Settings.epoch_gather``: the coordinator's eager epochs begin no sooner than the
gathering window after the previous Begin, however busy the workers say they are (issue
34: at low load epochs of one or two transactions spend CPU on every epoch's messages and
records); the window scales with the measured load up to that budget (issue 47,
``coordinator.gathering``). The coordinator's epoch loop runs here against fakes of its
narrow ports."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator.epochs import EagerEpochs
from coordinator.gathering import FULL_AT, Gathering
from coordinator.inbox import Inbox
from coordinator.state import ClusterState
from sfaas.errors import ConfigError
from sfaas.runtime import wire
from sfaas.runtime.settings import Settings


class _Busy:
    """Workers that always report waiting work (the loop never idles) and the barrier
    that answers each epoch at once; records when each Begin went out."""

    def __init__(self, roots: int = 1, epoch_time: float = 0.0) -> None:
        self.begins: list[float] = []
        self.roots = roots
        self.epoch_time = epoch_time

    def broadcast(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Begin):
            self.begins.append(time.perf_counter())

    def lose_slot(self, index: int, why: str) -> None:  # pragma: no cover - not reached
        raise AssertionError(why)

    async def wait(self, epoch: int) -> list[wire.Report]:
        await asyncio.sleep(self.epoch_time)
        return [wire.Report(epoch, i, self.roots, [], [], [0, 0], [0, 0], pending=5)
                for i in range(2)]

    # (EpochEnds: no round, no rescale; EpochObserver)
    def end(self, epoch: int, txns: int) -> tuple[int | None, bool]:
        return None, False

    async def switch(self, round_id: int) -> None:  # pragma: no cover - not reached
        raise AssertionError

    def epoch(self, waited: float, executed: float) -> None:
        pass


async def _begins(gather: float, seconds: float, adaptive: bool = False,
                  roots: int = 1) -> list[float]:
    busy = _Busy(roots, 0.002 if adaptive else 0.0)
    epochs = EagerEpochs(ClusterState(2), Inbox(), busy, busy, busy, busy,  # type: ignore[arg-type]
                         Gathering(gather, adaptive))
    task = asyncio.create_task(epochs.run(idle=False))
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return busy.begins


def test_epochs_begin_at_most_once_per_gather_interval() -> None:
    gathered = asyncio.run(_begins(0.05, 0.5))
    at_once = asyncio.run(_begins(0.0, 0.5))
    assert 3 <= len(gathered) <= 11, len(gathered)  # (a loaded machine sleeps longer)
    assert min(b - a for a, b in zip(gathered, gathered[1:], strict=False)) >= 0.049
    assert len(at_once) > 10 * len(gathered), (len(at_once), len(gathered))


def test_a_loaded_cluster_gathers_the_whole_budget() -> None:
    """Epochs of 100 transactions each, begun every few ms: the load in epochs is far
    above ``FULL_AT``, so the adaptive window is the budget."""
    gathered = asyncio.run(_begins(0.05, 0.5, adaptive=True, roots=100))
    assert 3 <= len(gathered) <= 11, len(gathered)
    assert min(b - a for a, b in zip(gathered[2:], gathered[3:], strict=False)) >= 0.049


def test_the_window_follows_the_load() -> None:
    """Measured with a synthetic clock: no load, no wait; the wait grows with the rate
    and stops at the budget; the fixed mode always waits the budget."""
    g = Gathering(0.005)
    assert g.window == 0.0  # nothing measured yet: begin at once
    for _ in range(200):  # 1 transaction per 10 ms, epochs of 1 ms: load 0.1
        g.observe(1, 0.010, 0.001)
    assert abs(g.rate - 100) < 1 and abs(g.epoch_time - 0.001) < 1e-9
    assert abs(g.window - 0.005 * 0.1 / FULL_AT) < 1e-6
    for _ in range(200):  # 5 transactions per 5 ms: load 1.0, past FULL_AT
        g.observe(5, 0.005, 0.001)
    assert g.window == 0.005
    for _ in range(200):  # idle: one empty epoch a second
        g.observe(0, 1.0, 0.001)
    assert g.window < 0.0001
    assert Gathering(0.005, adaptive=False).window == 0.005


def test_epoch_gather_is_checked() -> None:
    assert Settings.load(env={"SFAAS_EPOCH_GATHER": "0.004"}).epoch_gather == 0.004
    with pytest.raises(ConfigError, match="epoch_gather"):
        Settings.load(env={"SFAAS_EPOCH_GATHER": "2"})
    with pytest.raises(ConfigError, match="epoch_gather"):
        Settings.load(env={"SFAAS_EPOCH_GATHER": "-0.1"})
    assert Settings.load(env={"SFAAS_EPOCH_GATHER_ADAPTIVE": "0"}).epoch_gather_adaptive is False
    with pytest.raises(ConfigError, match="EPOCH_GATHER_ADAPTIVE"):
        Settings.load(env={"SFAAS_EPOCH_GATHER_ADAPTIVE": "sometimes"})


class _StepBack:
    """A wall clock stepped back 30 s at its 4th read (an NTP step), then running on."""

    def __init__(self) -> None:
        self.reads = 0

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        self.reads += 1
        return 1_000_000.0 + self.reads - (30.0 if self.reads >= 4 else 0.0)


class _Nows(_Busy):
    def __init__(self) -> None:
        super().__init__()
        self.nows: list[float] = []

    def broadcast(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Begin):
            self.nows.append(msg.now)


def test_an_epochs_now_never_runs_backwards_when_the_wall_clock_steps_back() -> None:
    """Each epoch's ``now`` (``ctx.now()``) comes from the coordinator's clock port and never
    falls below an earlier epoch's: a clock stepped back holds it still until the wall
    catches up (the simulator's ``--clock AT,coordinator,-30`` reaches it)."""
    async def go() -> list[float]:
        busy = _Nows()
        state = ClusterState(2)
        epochs = EagerEpochs(state, Inbox(), busy, busy, busy, busy,  # type: ignore[arg-type]
                             Gathering(0.0, False), _StepBack())
        task = asyncio.create_task(epochs.run(idle=False))
        while len(busy.nows) < 8:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return busy.nows

    nows = asyncio.run(go())
    assert nows[:3] == [1_000_001.0, 1_000_002.0, 1_000_003.0]
    assert nows == sorted(nows), nows
    assert nows[3] == nows[2]  # (held: the wall read 999,974)


def test_a_recovery_holds_now_at_the_replayed_epochs() -> None:
    state = ClusterState(2)
    state.reach_now(5_000.0)  # the logged epochs ran up to this now
    assert state.next_now(4_000.0) == 5_000.0 and state.next_now(5_001.0) == 5_001.0
