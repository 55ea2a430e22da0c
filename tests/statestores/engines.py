"""Engine configurations the cross-engine tests run: defaults, and tiny thresholds that
make flushes, rolls and merges happen every few operations."""

from __future__ import annotations

from typing import Any

import statestores

#: Options that force constant flushing/merging, per engine (all with sync="os", so a
#: crash loses nothing that was acknowledged).
TINY: dict[str, dict[str, Any]] = {
    "lsm": {"memtable_bytes": 256, "max_runs_per_level": 2, "density_factor": 2, "sync": "os"},
    "appendlog": {"threshold": 256, "max_runs_per_level": 2, "max_snapshot_wals": 2, "sync": "os"},
    "hybridlog": {"ro_lag_interval": 2, "flush_interval": 4, "max_runs_per_level": 2, "max_wal_bytes": 512, "sync": "os"},
    "memonly": {"sync": "os"},
}

#: (engine, options) pairs for parametrized tests: every engine twice.
CONFIGS: list[tuple[str, dict[str, Any]]] = [(e, {"sync": "os"}) for e in statestores.ENGINES] + [
    (e, TINY[e]) for e in statestores.ENGINES
]


def config_id(cfg: tuple[str, dict[str, Any]]) -> str:
    engine, opts = cfg
    return engine + ("-tiny" if opts is TINY[engine] else "")
