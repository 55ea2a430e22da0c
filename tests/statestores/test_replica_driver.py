"""A follower driven by its caller (``Follower(driver=...)``): no thread of its own — the
caller runs its steps when it likes (the simulator's event loop does, on virtual time) —
and the shipper's acknowledgements an event loop waits on (``Shipper.on_ack``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from pathlib import Path

import remotes
import statestores
from statestores.replica import LocalSource, Shipper

from .engines import TINY
from .replicas import _fill


class Manual:
    """A driver the test turns by hand: each :meth:`step` runs one step of the follower."""

    def __init__(self) -> None:
        self.steps: Generator[float, None, None] | None = None
        self.waits: list[float] = []
        self.halted = False

    def __call__(self, steps: Generator[float, None, None], name: str) -> Callable[[], None]:
        assert name.startswith("statestores-follow-")
        self.steps = steps

        def halt() -> None:
            self.halted = True
            steps.close()
        return halt

    def step(self, n: int = 1) -> None:
        assert self.steps is not None
        for _ in range(n):
            self.waits.append(next(self.steps))


def test_a_driven_follower_runs_only_when_its_driver_steps_it(tmp_path: Path) -> None:
    db = statestores.open("lsm", tmp_path / "primary", remote=remotes.PathRemote(tmp_path / "r"),
                          **TINY["lsm"])
    shipper = Shipper(db)
    acks: list[bool] = []
    off = shipper.on_ack(lambda: acks.append(shipper.acked(1)))
    driver = Manual()
    threads = threading.active_count()
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper), driver=driver)
    assert threading.active_count() == threads  # (no thread of its own)
    _fill(db, 200)
    db.snapshot(1)
    db.settle()
    assert f.stats()["seq"] == 0 and shipper.followers == 0  # (nothing ran yet)
    driver.step(20)
    assert f.stats()["seq"] == db.version()[0] and f.snapshots() == [1]
    assert driver.waits[-1] == 0.0  # (a tip: caught up, nothing new)
    assert shipper.acked(1) and acks == [True]  # (the mark installed, the listener told once)
    off()
    _fill(db, 50, 200)
    db.snapshot(2)
    db.settle()
    driver.step(20)
    assert f.snapshots() == [1, 2] and acks == [True]  # (no longer listening)
    store = f.promote(2)
    assert driver.halted and shipper.followers == 0  # (its stream closed with the steps)
    assert dict(store.items()) == dict(db.items())
    store.close()
    shipper.close()
    db.close()
