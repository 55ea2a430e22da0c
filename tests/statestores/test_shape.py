"""Engines are built by composition: their inheritance depth may only shrink.

A store holds its shared parts (``store.files``, ``store.tasks``, ``store.delivery``,
``store.snapshot_state``) instead of inheriting them; what is left of each engine's chain
is listed here, deepest first, so a new level shows up as a failing test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statestores.base import Store
from statestores.delivery import Delivery
from statestores.engines import ENGINES, engine_class
from statestores.files import FileSet
from statestores.snapshots import SnapshotState
from statestores.tasks import Tasks

#: engine → its levels of inheritance within statestores (the engine class counts as 1).
DEPTH = {"lsm": 2, "appendlog": 2, "hybridlog": 2, "memonly": 2}


def _depth(cls: type) -> int:
    ours = [b for b in cls.__bases__ if b.__module__.startswith("statestores")]
    return 1 + max((_depth(b) for b in ours), default=0)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_inherits_deeper_than_today(engine: str) -> None:
    cls = engine_class(engine)
    assert issubclass(cls, Store)
    assert _depth(cls) <= DEPTH[engine], [
        k.__name__ for k in cls.__mro__ if k.__module__.startswith("statestores")
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_holds_the_shared_parts(engine: str, tmp_path: Path) -> None:
    with engine_class(engine)(str(tmp_path), sync="none") as store:
        assert isinstance(store.files, FileSet)
        assert isinstance(store.tasks, Tasks)
        assert isinstance(store.delivery, Delivery)
        assert isinstance(store.snapshot_state, SnapshotState)
        store.put(b"k", b"v")
        assert store.get(b"k") == b"v"
