"""A worker whose store directory lost files (a disk that lost them, a directory deleted
under a process still writing it: the failover benchmark's lost machine) starts with that
store empty when the snapshot rounds hold its state — the recovery downloads the round —
instead of exiting at every restart until the supervisor gives up on the slot. Without
rounds the files are the only copy: the error stands and nothing is moved."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import statestores
from remotes import PathRemote
from sfaas.runtime.state import open_partition_stores
from tests.runtime.apps.ledger import app

OP = sorted(app.operators)[0]


def _damaged(root: Path) -> str:
    """Partition 0 of ``OP`` written, closed, then a file its CURRENT names deleted."""
    stores = open_partition_stores(app, str(root), [0], 2, store="lsm")
    stores[(OP, 0)].put(b"alice", b"100")
    stores.close()
    where = os.path.join(root, OP, "p0")
    named = [n for n in os.listdir(where) if n.startswith("lsm-")]
    assert named, os.listdir(where)
    for n in named:
        os.remove(os.path.join(where, n))
    return where


def test_with_rounds_a_damaged_store_is_set_aside_and_opened_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    where = _damaged(tmp_path / "data")
    with caplog.at_level(logging.ERROR, "sfaas.runtime.state"):
        stores = open_partition_stores(
            app, str(tmp_path / "data"), [0], 2, store="lsm",
            remote_of=lambda op, p: PathRemote(str(tmp_path / "remote" / op / f"p{p}")))
    try:
        assert dict(stores[(OP, 0)].items()) == {}
        assert stores[(OP, 0)].remote is not None
        stores[(OP, 0)].put(b"bob", b"5")  # a working store
    finally:
        stores.close()
    assert os.path.exists(os.path.join(f"{where}.damaged", "CURRENT"))  # kept for a look
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"the store at {where} is damaged" in line and "missing" in line
    assert f"moved to {where}.damaged" in line


def test_a_second_damage_replaces_the_first_set_aside(tmp_path: Path) -> None:
    def remote(op: str, p: int) -> PathRemote:
        return PathRemote(str(tmp_path / "remote" / op / f"p{p}"))

    for _ in range(2):
        where = _damaged(tmp_path / "data")
        open_partition_stores(app, str(tmp_path / "data"), [0], 2, store="lsm",
                              remote_of=remote).close()
    assert sorted(n for n in os.listdir(os.path.dirname(where)) if n.startswith("p0")) == \
        ["p0", "p0.damaged"]


def test_without_rounds_the_error_stands_and_nothing_is_moved(tmp_path: Path) -> None:
    where = _damaged(tmp_path / "data")
    with pytest.raises(statestores.CorruptionError, match="missing"):
        open_partition_stores(app, str(tmp_path / "data"), [0], 2, store="lsm")
    assert os.path.exists(os.path.join(where, "CURRENT"))
    assert not os.path.exists(f"{where}.damaged")
