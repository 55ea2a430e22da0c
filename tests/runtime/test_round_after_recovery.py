"""A recovery that replayed epochs is followed by a round at once, not an interval later:
a fault before the next round replays every one of them again (the faults series, issue 48:
a kill 10 ms after a recovery that replayed 586 epochs — MinIO's outage had paused the
rounds — replayed the same 586)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coordinator.bulletin import Bulletin
from coordinator.protocols.rounds import RoundKeeper
from coordinator.state import Layout
from remotes import PathRemote
from sfaas.runtime import wire

INTERVAL = 5.0

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


class _Clock:
    def __init__(self) -> None:
        self.mono = 100.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return 1_800_000_000.0 + self.mono


async def _keeper_after_a_lost_round(tmp_path: Path) -> tuple[RoundKeeper, _Clock]:
    """A keeper whose round 1 was lost with a worker (an interval has not passed since)."""
    clock = _Clock()
    keeper = RoundKeeper(INTERVAL, 2, lambda: Layout(1, 1, ()),
                         lambda: PathRemote(tmp_path / "rounds"),
                         lambda op, p: PathRemote(tmp_path / "stores"), clock=clock)
    clock.mono += INTERVAL
    assert keeper.marker(epoch=1, txns=1) is None  # (reads the published rounds first)
    assert keeper._loading is not None
    await keeper._loading
    assert keeper.marker(epoch=1, txns=1) == 1
    keeper.abort("lost worker 0")
    clock.mono += 1.0
    assert keeper.marker(epoch=9, txns=9) is None  # (the next one an interval after round 1)
    return keeper, clock


async def test_the_epoch_after_a_recovery_that_replayed_takes_a_round(tmp_path: Path) -> None:
    keeper, _ = await _keeper_after_a_lost_round(tmp_path)
    keeper.recovered(epochs_replayed=586)
    assert keeper.marker(epoch=600, txns=600) == 2


async def test_a_recovery_that_replayed_nothing_waits_for_the_interval(tmp_path: Path) -> None:
    keeper, clock = await _keeper_after_a_lost_round(tmp_path)
    keeper.recovered(epochs_replayed=0)  # (rolled back to the newest round itself)
    assert keeper.marker(epoch=10, txns=10) is None
    clock.mono += INTERVAL
    assert keeper.marker(epoch=11, txns=11) == 2


def test_the_bulletin_tells_the_rounds_how_many_epochs_a_recovery_replayed() -> None:
    told: list[Any] = []

    class Rounds:
        def on_report(self, msg: wire.Snapshotted) -> None: ...
        def abort(self, why: str) -> None: ...
        def recovered(self, epochs_replayed: int) -> None:
            told.append(epochs_replayed)

    class Metrics:
        def recovered(self, info: dict[str, Any]) -> None:
            told.append("metrics")

    class ReadyFile:
        def write(self) -> None: ...

    Bulletin(Metrics(), Rounds(), ReadyFile()).recovered(  # type: ignore[arg-type]
        {"attempt": 1, "round": 3, "epochs_replayed": 586, "seconds": 1.2})
    assert told == ["metrics", 586]
