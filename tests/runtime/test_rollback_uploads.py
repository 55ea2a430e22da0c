"""A worker's rollback (worker.protocols.recovery.RollBack.restores) gives up its stores'
uploads of rounds after the one it rolls back to instead of waiting for them: a MinIO back
from an outage kept them retrying with backoff, and the survivor of a lost worker rolled
back seconds late (the fault series' worst gap, benchmarks/REPORTS.md)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import statestores
from sfaas.runtime.protocols.rounds import RoundManifest
from statestores import snapshots
from statestores.snapshots import SnapshotAbandoned
from tests.statestores.test_snapshot_abandon import GUARD, HeldRemote, fill
from worker.protocols.recovery import RollBack
from worker.state import WorkerState


def _rollback(stores: dict[tuple[str, int], statestores.Store]) -> RollBack:
    st = WorkerState(max_batch=10, local_fallback=False)
    st.index = 0
    st.engine = SimpleNamespace(stores=stores)  # type: ignore[assignment]
    none: Any = None  # (restores uses the state only)
    return RollBack(none, none, st, quiet=none, world=none, moving=none, links=none,
                    newer=none)


def _round(round_id: int) -> RoundManifest:
    return RoundManifest(round_id, 0, 1, 1, (), {0: 0}, {}, {}, (), 0)


@pytest.mark.parametrize("round_id", [1, 0])
async def test_a_rollback_gives_up_the_uploads_of_later_rounds(round_id: int, tmp_path: Path) -> None:
    remote = HeldRemote(tmp_path / "remote")
    with statestores.open("lsm", tmp_path / "db", remote=remote, sync="os") as s:
        v1 = fill(s, 0, 100)
        s.snapshot(1)
        fill(s, 100, 200, b"w")
        remote.hold()
        later = s.snapshot_async(2)  # the round the recovery gives up, stuck uploading
        guard = threading.Timer(GUARD, remote.release)  # (a rollback that waits: fails, no hang)
        guard.start()
        try:
            assert remote.entered.wait(GUARD)
            before = snapshots.restores(s)
            took = await _rollback({("op", 0): s}).restores(_round(round_id), time.perf_counter())
            assert not remote.released.is_set(), "the rollback waited for round 2's upload"
        finally:
            guard.cancel()
            remote.release()
        assert not any(isinstance(t, BaseException) for t in took), took
        with pytest.raises(SnapshotAbandoned):
            later.result(timeout=0)
        assert snapshots.restores(s) > before  # (its report, if still pending, is not sent)
        assert dict(s.items()) == (v1 if round_id == 1 else {})
