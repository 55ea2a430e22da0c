"""A recovery waiting for its workers says which ones are still to be restarted and which
registered but are not ready yet (``coordinator.protocols.recovery``): the nemesis showed
"still waiting for worker(s) [1, 2] to be restarted" for two workers that had registered
seconds before and were waiting for a stopped broker — the operator looked for the wrong
fault."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from coordinator.protocols.recovery import Recovery


class _State:
    """The members of a cluster mid-recovery: slot 0 registered (opening its stores),
    slot 1 lost; both ready after ``quiet`` seconds without a change."""

    def __init__(self, quiet: int) -> None:
        self.members = [SimpleNamespace(index=0, alive=True, ready=asyncio.Event()),
                        SimpleNamespace(index=1, alive=False, ready=asyncio.Event())]
        self.quiet = quiet

    def all_ready(self) -> bool:
        return all(m.alive and m.ready.is_set() for m in self.members)

    def not_ready(self) -> list[int]:
        return [m.index for m in self.members if not (m.alive and m.ready.is_set())]

    async def wait_change(self, timeout: float) -> bool:
        self.quiet -= 1  # (a second without a change, at once)
        if self.quiet == 0:
            for m in self.members:
                m.alive = True
                m.ready.set()
        return False


@pytest.mark.timeout(30)
def test_a_waiting_recovery_tells_the_lost_slots_from_the_starting_ones(
        caplog: pytest.LogCaptureFixture) -> None:
    async def wait(state: _State) -> None:
        rec = Recovery(state, None, None, lambda: None, None)  # type: ignore[arg-type]
        await rec._wait_for_members(7)

    state = _State(quiet=12)
    with caplog.at_level(logging.WARNING, "sfaas.coordinator"):
        asyncio.run(wait(state))
    lines = [r.getMessage() for r in caplog.records]
    assert any("recovery 7: still waiting for worker(s) [0] to get ready" in x
               for x in lines), lines
    assert any("recovery 7: still waiting for worker(s) [1] to be restarted" in x
               for x in lines), lines
    assert len(lines) == 2, lines  # (once per ten quiet seconds)
