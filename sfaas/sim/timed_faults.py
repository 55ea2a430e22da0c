"""The network's, the clocks', the disks' and one process's Kafka link's timed faults of a
schedule (``sfaas.sim.faults``): a slow link, a wall-clock jump, a disk fault and a worker
cut from the brokers, each a task of the run that waits for its time, injects the fault,
traces it (``fault slow …``, ``fault clock …``, ``fault disk …``, ``fault kafka-cut …``)
and, for a window, undoes it.

A slow link is the network's (:meth:`sfaas.sim.network.SimNetwork.slow`); a clock jump
steps a machine's wall clock (:meth:`sfaas.sim.ports.WallClocks.jump`), which the process
of that name reads through its clock port's ``time()`` — its incarnations after a restart
too. A disk fault arms a worker's file system (:func:`sfaas.sim.disk.disk_fault`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sfaas.sim.disk import SimDisk, disk_fault
from sfaas.sim.faults import Jump, Schedule, Slow
from sfaas.sim.log import SimKafka
from sfaas.sim.network import SimNetwork
from sfaas.sim.ports import WallClocks

__all__ = ["check", "clock_jump", "kafka_cut", "slow_link", "start"]

Trace = Callable[[str], None]


async def slow_link(net: SimNetwork, slow: Slow, trace: Trace) -> None:
    """The link ``slow`` names takes ``slow.extra`` s more from ``slow.at`` for
    ``slow.seconds``."""
    await asyncio.sleep(slow.at)
    trace(f"fault slow {slow.a} {slow.b} +{slow.extra:g} s")
    net.slow(slow.a, slow.b, slow.extra)
    await asyncio.sleep(slow.seconds)
    trace(f"fault unslow {slow.a} {slow.b}")
    net.unslow(slow.a, slow.b)


async def kafka_cut(kafka: SimKafka, at: float, seconds: float, trace: Trace,
                    process: str = "worker-1") -> None:
    """``process`` reaches no broker from ``at`` for ``seconds`` (``SimKafka.cut`` traces it)."""
    await asyncio.sleep(at)
    kafka.cut(process, seconds)
    await asyncio.sleep(seconds)
    trace(f"fault kafka-heal {process}")


async def clock_jump(walls: WallClocks, jump: Jump, trace: Trace) -> None:
    """``jump.process``'s wall clock steps by ``jump.seconds`` at ``jump.at``, for good."""
    await asyncio.sleep(jump.at)
    trace(f"fault clock {jump.process} {jump.seconds:+g} s")
    walls.jump(jump.process, jump.seconds)


def _check(name: str, workers: int, flag: str) -> None:
    index = name.removeprefix("worker-")
    if name != "coordinator" and not (index.isdigit() and int(index) < workers):
        raise ValueError(f"{flag}: {name!r} is no process of a run of {workers} workers "
                         f"(coordinator, worker-0 … worker-{workers - 1})")


def check(schedule: Schedule, workers: int) -> None:
    """A ``ValueError`` if ``schedule``'s slow link, clock jump or disk fault names a process
    a run of ``workers`` workers does not have."""
    if schedule.slow is not None:
        for name in (schedule.slow.a, schedule.slow.b):
            _check(name, workers, "--slow")
    if schedule.clock is not None:
        _check(schedule.clock.process, workers, "--clock")
    if schedule.disk is not None:
        _check(schedule.disk.worker, workers, "--disk")


def start(schedule: Schedule, net: SimNetwork, walls: WallClocks, workers: int,
          trace: Trace,
          disk_of: Callable[[str], SimDisk | None] = lambda name: None,
          kafka: SimKafka | None = None) -> list[asyncio.Task[None]]:
    """The tasks of ``schedule``'s slow link, clock jump and disk fault (none if it has
    none), in a run of ``workers`` workers (see :func:`check`); ``disk_of``: a running
    process's disk, by name."""
    check(schedule, workers)
    loop = asyncio.get_running_loop()
    tasks = []
    if schedule.slow is not None:
        tasks.append(loop.create_task(slow_link(net, schedule.slow, trace)))
    if schedule.clock is not None:
        tasks.append(loop.create_task(clock_jump(walls, schedule.clock, trace)))
    if schedule.disk is not None:
        tasks.append(loop.create_task(disk_fault(disk_of, schedule.disk, trace)))
    if schedule.kafka_cut is not None and kafka is not None:
        tasks.append(loop.create_task(kafka_cut(kafka, *schedule.kafka_cut, trace)))
    return tasks
