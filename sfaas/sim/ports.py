"""The simulated fillings of the product's ports (``sfaas.runtime.ports``).

One simulated process gets ``Ports(kafka=SimKafkaPort(sim, name), objects=SimObjects(store),
network=net.port(name), clock=VirtualClockPort(clock, walls.of(name)), disk=...,
replica=replicas.port(...))`` (its disk: ``sfaas.sim.disk.SimDisk``, or the real files;
its replica transport: ``sfaas.sim.replicas``): every process
of a run shares the log, the object store, the switch and the virtual clock, and the
network knows each process by its name (so a partition can cut two of them apart). Its
wall clock is its machine's (:class:`WallClocks`): what a clock jump steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiokafka.errors import KafkaConnectionError

from sfaas.runtime.ports import DiskPort, LocalDisk, Ports, TcpReplicas
from sfaas.sim.clock import VirtualClock
from sfaas.sim.log import SimKafka
from sfaas.sim.network import SimNetwork
from sfaas.sim.objects import SimObjectStore
from sfaas.sim.replicas import SimReplicas

if TYPE_CHECKING:
    from remotes import Remote
    from sfaas.runtime.settings import Settings

__all__ = ["ProcessExited", "SimKafkaPort", "SimObjects", "VirtualClockPort", "WALL_START",
           "Wall", "WallClocks", "process_ports"]

#: What ``time()`` reads at virtual time 0 (2027-01-01 UTC): a fixed wall clock, so the
#: wall times a run reads are a function of its seed too.
WALL_START = 1_798_761_600.0


class SimKafkaPort:
    """The Kafka port of process ``owner`` on a :class:`SimKafka`; a probe fails while the
    cluster is out or cut from ``owner``."""

    def __init__(self, sim: SimKafka, owner: str | None = None) -> None:
        self.sim = sim
        self.owner = owner
        self.producers: list[Any] = []
        #: the process died (:meth:`kill`): it makes no client any more
        self.dead = False

    def _alive(self) -> None:
        if self.dead:
            raise KafkaConnectionError("the process is dead (simulated)")

    def producer(self, **kwargs: Any) -> Any:
        self._alive()
        p = self.sim.producer(owner=self.owner, **kwargs)
        self.producers.append(p)
        return p

    def kill(self) -> None:
        """The process died: its producers reach the log no more (``SimProducer.kill``),
        and it makes no new client."""
        self.dead = True
        for p in self.producers:
            p.kill()

    def consumer(self, **kwargs: Any) -> Any:
        self._alive()
        return self.sim.consumer(owner=self.owner, **kwargs)

    def admin(self, **kwargs: Any) -> Any:
        self._alive()
        return self.sim.admin(owner=self.owner, **kwargs)

    async def probe(self, host: str, port: int) -> None:
        broker = self.sim.broker
        if not broker.reachable(self.owner):
            raise ConnectionRefusedError(111, f"{host}:{port}: the simulated Kafka is out")


class SimObjects:
    """The object port on a :class:`SimObjectStore` (one bucket: the settings' is ignored)."""

    def __init__(self, store: SimObjectStore) -> None:
        self.store = store

    def remote(self, settings: Settings, prefix: str) -> Remote:
        return self.store.remote(prefix)


class Wall:
    """One machine's wall clock: how far it is off the run's (seconds; a jump steps it)."""

    def __init__(self) -> None:
        self.offset = 0.0


class WallClocks:
    """The wall clocks of a run's machines, one per process name. A restarted process
    reads its name's — the clock is the machine's, and a supervisor restarts a process on
    its machine — so a clock stepped by a jump stays stepped across restarts, as an NTP
    step would."""

    def __init__(self) -> None:
        self._walls: dict[str, Wall] = {}

    def of(self, name: str) -> Wall:
        """The wall clock of process ``name`` (on time until a jump)."""
        return self._walls.setdefault(name, Wall())

    def jump(self, name: str, seconds: float) -> None:
        """Step ``name``'s wall clock by ``seconds`` (back when negative): its ``time()``
        reads that much off from now on; its ``monotonic()`` does not move."""
        self.of(name).offset += seconds


class VirtualClockPort:
    """The clock port on a :class:`VirtualClock`: ``monotonic()`` is virtual time,
    ``time()`` is :data:`WALL_START` plus it, plus the offset of the process's ``wall``
    (none: on time)."""

    def __init__(self, clock: VirtualClock, wall: Wall | None = None) -> None:
        self._clock = clock
        self._wall = wall or Wall()

    def monotonic(self) -> float:
        return self._clock.now

    def time(self) -> float:
        return WALL_START + self._clock.now + self._wall.offset


class ProcessExited(BaseException):
    """Raised in the task that called a simulated process's exit: the real exit never
    returns, so neither does this one. (A cancellation alone was not enough: Python 3.11's
    ``asyncio.wait_for`` drops a cancellation when its inner call fails at once — a dead
    network's connect — and a fenced worker's rejoin went on for ever, its slot never
    restarted: seed 133.)"""


class SimProcess:
    """The process port of simulated process ``name``: its exit is ``ended(name, code)``
    — the cluster cuts it off at once (network, Kafka) and ends its tasks; the supervisor
    restarts it — and raises :class:`ProcessExited` in the caller."""

    def __init__(self, name: str, ended: Callable[[str, int], None]) -> None:
        self._name = name
        self._ended = ended

    def exit(self, code: int) -> None:
        self._ended(self._name, code)
        raise ProcessExited(code)


def process_ports(name: str, kafka: SimKafka, objects: SimObjectStore, net: SimNetwork,
                  clock: VirtualClock, ended: Callable[[str, int], None],
                  walls: WallClocks | None = None, disk: DiskPort | None = None,
                  replicas: SimReplicas | None = None) -> Ports:
    """The ports of the simulated process ``name`` (``ended``: what its exit does;
    ``walls``: the machines' wall clocks, none: every one on time; ``disk``: what its
    stores write through, none: the real files; ``replicas``: the run's replication
    servers, none: the real ``tcp`` transport)."""
    wall = walls.of(name) if walls is not None else None
    network = net.port(name)
    replica = replicas.port(network) if replicas is not None else TcpReplicas()
    return Ports(kafka=SimKafkaPort(kafka, name), objects=SimObjects(objects),
                 network=network, clock=VirtualClockPort(clock, wall),
                 process=SimProcess(name, ended), disk=disk or LocalDisk(), replica=replica)
