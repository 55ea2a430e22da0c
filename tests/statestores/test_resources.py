"""Opening and closing a store gives back every thread, process and descriptor it took:
200 stores of each engine (with WALs, flushes, merges and a snapshot each) leave the
process holding what it held before."""

from __future__ import annotations

from pathlib import Path

import pytest

import remotes
import statestores
from tests.resources import held, leftover
from tests.statestores.engines import TINY

N = 200


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_200_stores_opened_and_closed_hold_nothing(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")

    def cycle(i: int) -> None:
        with statestores.open(engine, tmp_path / f"db{i % 3}", remote=remote, **TINY[engine]) as s:
            for k in range(20):
                s.put(b"k%03d" % k, b"v%d" % i)
            if i % 20 == 0:
                s.snapshot(i + 1)

    cycle(0)  # the process-wide background lanes start once and stay: part of the baseline
    baseline = held()
    for i in range(1, N):
        cycle(i)
    extra = leftover(baseline)
    assert not extra, f"{engine}: after {N} stores the process holds {extra} more than before ({baseline})"
