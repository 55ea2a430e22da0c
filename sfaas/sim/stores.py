"""The workers' store engines in a run (``--store``): each engine's small options, and the
app whose operators use one (``sfaas.sim.cluster``)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from sfaas.app import App

__all__ = ["SMALL_STORES", "with_store"]

#: each engine's options in a run (``--store``): regions, WALs and segments small enough
#: that a run of a few hundred writes flushes, seals and merges — so a round's snapshot
#: names flushed files and sealed WALs, and a restore reads them back (the path of the
#: old hybridlog tail bug, 2d6b97e: with 2–3 accounts per store no region fills, so the
#: rounds' tails pile up until ``max_snapshot_wals`` — 1 or 2 here — makes a round flush
#: the regions, covering the tails of the rounds before)
SMALL_STORES: dict[str, dict[str, Any]] = {
    "memonly": {},
    "hybridlog": {"ro_lag_interval": 4, "flush_interval": 8, "max_wal_bytes": 4096,
                  "max_runs_per_level": 2, "max_snapshot_wals": 2},
    "appendlog": {"threshold": 2048, "max_runs_per_level": 2},
    "lsm": {"memtable_bytes": 4096, "max_runs_per_level": 2},
}


def with_store(app: App, engine: str) -> App:
    """A copy of ``app`` whose operators keep their state in ``engine`` with the small
    options of :data:`SMALL_STORES` (``app`` itself unchanged)."""
    if engine not in SMALL_STORES:
        raise ValueError(f"store must be one of {sorted(SMALL_STORES)}, got {engine!r}")
    new = copy.copy(app)
    new.operators = {name: dataclasses.replace(op, app=new, store=engine,
                                               store_options=dict(SMALL_STORES[engine]))
                     for name, op in app.operators.items()}
    return new
