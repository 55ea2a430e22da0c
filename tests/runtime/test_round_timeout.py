"""A snapshot round's timeout is measured on the monotonic clock: a step of the wall clock
(NTP, a resumed VM) neither fails a healthy round in flight nor keeps a stuck one.

Found with the simulator's clock jump (``--clock AT,coordinator,90``, issue 51): a forward
step of the coordinator's wall clock failed the round in flight — ``snapshot round 2
failed: not complete after 90 s`` — though it had run for milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.protocols.rounds import ROUND_TIMEOUT, RoundKeeper
from coordinator.state import Layout
from remotes import PathRemote

INTERVAL = 0.05


pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


class _Clocks:
    """A clock port whose wall clock the test steps apart from its monotonic one."""

    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_800_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def _layout() -> Layout:
    return Layout(1, 1, ())


async def _round_in_flight(keeper: RoundKeeper, clocks: _Clocks) -> int:
    """Start a round (the first marker reads the published index first)."""
    clocks.advance(INTERVAL)
    assert keeper.marker(epoch=1, txns=1) is None  # (starts reading the published rounds)
    assert keeper._loading is not None
    await keeper._loading
    round_id = keeper.marker(epoch=1, txns=1)
    assert round_id is not None
    return round_id


@pytest.mark.parametrize("step", [90.0, 3600.0])
async def test_a_forward_wall_step_does_not_fail_a_round_in_flight(tmp_path: Path,
                                                                   step: float) -> None:
    clocks = _Clocks()
    keeper = RoundKeeper(INTERVAL, 2, _layout, lambda: PathRemote(tmp_path / "rounds"),
                         lambda op, p: PathRemote(tmp_path / "stores"), clock=clocks)
    await _round_in_flight(keeper, clocks)
    clocks.wall += step
    clocks.advance(0.01)
    keeper.marker(epoch=2, txns=2)
    assert keeper.failed == 0 and keeper._inflight is not None


async def test_a_backward_wall_step_does_not_keep_a_stuck_round(tmp_path: Path) -> None:
    clocks = _Clocks()
    keeper = RoundKeeper(INTERVAL, 2, _layout, lambda: PathRemote(tmp_path / "rounds"),
                         lambda op, p: PathRemote(tmp_path / "stores"), clock=clocks)
    stuck = await _round_in_flight(keeper, clocks)
    clocks.wall -= 600.0
    clocks.advance(ROUND_TIMEOUT + 1.0)  # (no report came: the round is stuck)
    keeper.marker(epoch=2, txns=2)
    assert keeper.failed == 1
    _, failed, why = keeper.failures[-1]
    assert failed == stuck and why.startswith("not complete after 61 s")
