"""What the coordinator accepts from a registered worker beyond what decodes
(``coordinator/inbound.py``): a worker speaks only for its own slot, and its report counts
the calls of every worker."""

from __future__ import annotations

import pytest

from coordinator.inbound import check
from sfaas.runtime import wire


def test_a_worker_speaks_only_for_its_own_slot() -> None:
    check(wire.Heartbeat(1, 0), 1, 2)
    check(wire.Register("w", "127.0.0.1", 9, 9, 0), 1, 2)  # (a Register names the slot it asks)
    for other in (0, 2, 5):
        with pytest.raises(wire.ProtocolError, match=f"worker 1 sent Heartbeat as worker {other}"):
            check(wire.Heartbeat(other, 0), 1, 2)


def test_a_report_counts_the_calls_of_every_worker() -> None:
    good = wire.Report(3, 1, 0, [], [], [0, 0], [0, 0], 0)
    check(good, 1, 2)
    with pytest.raises(wire.ProtocolError, match="worker 1's report counts calls of 3 workers, not 2"):
        check(wire.Report(3, 1, 0, [], [], [0, 0, 0], [0, 0, 0], 0), 1, 2)
