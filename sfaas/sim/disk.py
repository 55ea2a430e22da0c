"""The disks of a simulated run (issue 51): each process's stores write through a
file system the simulator hands them (the disk port, ``sfaas.runtime.ports.DiskPort``),
and a disk fault (``--disk AT,WORKER,KIND``, ``sfaas.sim.faults.Disk``) fails it.

A process's disk is one :class:`~statestores.testing.FaultyFS` over the real files of its
home, shared by all its stores, with no fault armed: until a fault it is the real file
system (the stores then run their background jobs in this process, on the loop, with it:
the fault reaches a flush or a merge as well). At the fault's time :func:`disk_fault` arms
it: its next mutating call fails — ``error``: nothing written; ``torn``: a random prefix of
a write written — and every call after it fails too, its descriptors closed (the stores'
directory locks released), as a dead disk. What the worker does then is the product's
(the store's error reaches whatever wrote); once that incarnation is gone — exited on its
own, or crashed by another fault — its next one runs in the same home on a fresh file
system (``SimCluster._start``): it finds what the torn write left there.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from sfaas.sim.faults import Disk
from statestores.testing import FaultyFS

__all__ = ["SimDisk", "disk_fault"]

Trace = Callable[[str], None]


class SimDisk:
    """The disk port of one incarnation of a simulated process: one file system for all its
    stores; a torn write's prefix is drawn from ``seed`` (its own source: arming a fault
    draws nothing from the run's)."""

    def __init__(self, name: str, incarnation: int, seed: int, trace: Trace) -> None:
        self.name = name
        self.fs = FaultyFS(None, torn=False,
                           seed=zlib.crc32(f"sfaas.sim.disk {seed} {name} {incarnation}".encode()),
                           on_fault=lambda what: trace(f"disk {name} fails: {what}"))

    def file_system(self) -> FaultyFS:
        return self.fs

    @property
    def dead(self) -> bool:
        """The disk failed: every call fails, nothing of this incarnation holds a lock."""
        return self.fs.dead

    def fail_next(self, kind: str) -> None:
        """Fail the next mutating call as ``kind`` says (``error`` or ``torn``)."""
        self.fs.fail_next(torn=kind == "torn")


async def disk_fault(disk_of: Callable[[str], SimDisk | None], fault: Disk,
                     trace: Trace) -> None:
    """At ``fault.at`` arm the disk of ``fault.worker``'s incarnation then running
    (``disk_of``; None: it is not running, and the fault has nothing to fail)."""
    await asyncio.sleep(fault.at)
    disk = disk_of(fault.worker)
    if disk is None or disk.dead:
        trace(f"fault disk {fault.worker} {fault.kind}: no live disk to fail")
        return
    trace(f"fault disk {fault.worker} {fault.kind}: its next write fails")
    disk.fail_next(fault.kind)
