"""``Settings.epoch_gather``: the coordinator's eager epochs begin no sooner than that many
seconds after the previous Begin, however busy the workers say they are (issue 34: at
low load epochs of one or two transactions spend CPU on every epoch's messages and
records). The coordinator's epoch loop runs here against fakes of its narrow ports."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator.epochs import EagerEpochs
from coordinator.inbox import Inbox
from coordinator.state import ClusterState
from sfaas.errors import ConfigError
from sfaas.runtime import wire
from sfaas.runtime.settings import Settings


class _Busy:
    """Workers that always report waiting work (the loop never idles) and the barrier
    that answers each epoch at once; records when each Begin went out."""

    def __init__(self) -> None:
        self.begins: list[float] = []

    def broadcast(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Begin):
            self.begins.append(time.perf_counter())

    def lose_slot(self, index: int, why: str) -> None:  # pragma: no cover - not reached
        raise AssertionError(why)

    async def wait(self, epoch: int) -> list[wire.Report]:
        await asyncio.sleep(0)
        return [wire.Report(epoch, i, 1, [], [], [0, 0], [0, 0], pending=5) for i in range(2)]

    # (Markers, Switches)
    def marker(self, epoch: int, txns: int, force: bool = False) -> int | None:
        return None

    def due(self) -> bool:
        return False

    def arm(self, round_id: int) -> None:  # pragma: no cover - not reached
        raise AssertionError

    async def switch(self, round_id: int) -> None:  # pragma: no cover - not reached
        raise AssertionError


async def _begins(gather: float, seconds: float) -> list[float]:
    busy = _Busy()
    epochs = EagerEpochs(ClusterState(2), Inbox(), busy, busy, busy, busy,  # type: ignore[arg-type]
                         lambda waited, executed: None, gather)
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


def test_epoch_gather_is_checked() -> None:
    assert Settings.load(env={"SFAAS_EPOCH_GATHER": "0.004"}).epoch_gather == 0.004
    with pytest.raises(ConfigError, match="epoch_gather"):
        Settings.load(env={"SFAAS_EPOCH_GATHER": "2"})
    with pytest.raises(ConfigError, match="epoch_gather"):
        Settings.load(env={"SFAAS_EPOCH_GATHER": "-0.1"})
