"""A seed's fault schedule (issue 51): what goes wrong in one simulated cluster run, and
when — a function of the seed only (:func:`draw`), printed as the command-line flags that
replay it (:meth:`Schedule.args`).

Faults a schedule may hold (each drawn or left out by the seed):

- ``crash``: worker 1 crashes at ``at`` and a fresh process takes its slot ``down`` later;
- ``cut``: worker 1 and the coordinator cut apart at ``at`` for ``for`` seconds;
- ``outage``: Kafka unreachable at ``at`` for ``for`` seconds;
- ``stale``: a stale leader answers one partition (the epoch log, an ingress partition or
  the egress) at ``at`` for ``for`` seconds, ``behind`` records short — timed near a
  recovery (after the crash or the cut) when there is one, where recovery reads it;
- ``kafka_errors``: each produce request fails (timed out, nothing appended) with this
  probability;
- ``object_errors``: each try of an object-store call fails with this probability; the
  call retries as ``remotes.minio.MinioRemote`` does and fails (``RemoteError``) only when
  every try did (``sfaas.sim.objects``);
- ``coordinator``: the coordinator crashes at ``at`` and a fresh process starts ``down``
  later (the workers rejoin it; drawn last, so adding it changed no earlier draw);
- ``slow``: a slow link — every chunk between two processes (worker 1 and the
  coordinator, worker 0 and the coordinator, or the two workers) sent at ``at`` or in the
  ``for`` seconds after takes ``extra`` seconds more, in order (a chunk never overtakes
  the one before it); ``extra`` 0.05–3 s, past the lease's round trip in most draws and
  past the heartbeat timeout (2 s in a run) in a third (``sfaas.sim.network``);
- ``clock``: a wall-clock jump — one process's ``time()`` (not its ``monotonic()``) steps
  by ``seconds`` (±0.5–30 s) at ``at`` and stays off by that much, as after an NTP step; a
  restart of the process keeps it (the clock is its machine's: ``sfaas.sim.ports``).

- ``kafka_cut``: worker 1 cut from every broker at ``at`` for ``for`` seconds (the
  others still reach them: the coordinator loses it as cut from Kafka); the request it has
  on the wire if it dies meanwhile lands after the heal, as an orphaned socket's bytes do
  (``sfaas.sim.log.SimKafka.cut``). Drawn after the standbys, last of all; near a
  recovery when the schedule has one.

- ``disk``: a disk fault — one worker's file system (its stores' disk: ``sfaas.sim.disk``)
  fails its first mutating call at or after ``at``: an I/O ``error`` (nothing written) or a
  ``torn`` write (a random prefix written); every later call of that file system fails too
  and its descriptors are closed (``statestores.testing.FaultyFS``). The worker reacts as
  the product does; once it is gone the supervisor restarts it over the same directory.

The last three are drawn after everything else, the store included, so that adding them
changed no earlier draw (``tests/sim/test_budget.py:test_the_store_is_drawn_last``; the
disk fault after the other two: ``tests/sim/test_disk_faults.py``).

And the snapshot interval, ``rounds`` (drawn after all of them): 0.1–0.6 of the load's
length, so that several rounds complete before and between the faults, and a recovery
restores a real round (not round 0) and replays the epoch log from there.

And the workers' store engine, ``store`` (drawn last of all, so that adding it changed no
earlier draw): one of :data:`STORES` — memonly, or an engine with files whose flushes,
seals and merges a round names and a recovery restores (``--store``); a file engine's
rounds come :data:`FILE_ROUNDS` times as often.

And ``standbys`` (drawn after the disk fault, last of all): one standby worker per worker
in :data:`STANDBYS` of the seeds, following every store of its primary
(``sfaas.sim.replicas``); a crashed or lost primary's standby is promoted to its slot.

And the workload's shape: ``hot`` — :data:`HOT` accounts at :data:`HOT_RATE` requests per
second (conflicting transactions in most epochs: the cross-worker fallback's ordered
locks), else the ``Bank`` defaults (8 accounts, 200 per second).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Schedule", "Slow", "Jump", "Disk", "draw", "STALE_TOPICS", "STORES", "FILE_ROUNDS",
           "HOT", "HOT_RATE", "LINKS", "PROCESSES", "DISK_KINDS", "DISK_WORKERS", "STANDBYS"]

#: a hot workload: accounts, and requests per simulated second
HOT, HOT_RATE = 3, 2000.0
#: about how long a hot workload sends (its faults land in it)
HOT_LOAD_SECONDS = 0.1

#: the topics a stale leader may answer, by the short names the flags use
STALE_TOPICS = ("epochs", "in", "out")

#: the store engines a seed draws among (``sfaas.sim.cluster.SMALL_STORES`` and memonly)
STORES = ("memonly", "hybridlog", "lsm", "appendlog")
#: a file engine's rounds come this many times as often as the drawn interval: its restore
#: bugs need a round that names what a flush or a merge left behind (a store's third round
#: or later: hybridlog's tails and the region covering them, 2d6b97e), restored by a
#: recovery — and the faults land in the first second
FILE_ROUNDS = 8

#: the links a slow-link fault slows (a run of the budget has two workers)
LINKS = (("worker-1", "coordinator"), ("worker-0", "coordinator"), ("worker-0", "worker-1"))
#: the processes whose wall clock a clock jump may step
PROCESSES = ("coordinator", "worker-0", "worker-1")

#: what a disk fault does to the failing call: fails it, or writes a prefix then fails it
DISK_KINDS = ("error", "torn")
#: the workers whose disk a disk fault fails (the coordinator keeps no stores)
DISK_WORKERS = ("worker-0", "worker-1")
#: the share of seeds whose workers have a standby each (``--standbys 1``: the crashed
#: worker's standby is promoted; every store shipped, a rollback re-staging its files)
STANDBYS = 0.5

Pair = tuple[float, float]


def _process(text: str, flag: str) -> str:
    """``text`` if it names a process of a run (``coordinator`` or ``worker-N``)."""
    index = text.removeprefix("worker-")
    if text != "coordinator" and not (index != text and index.isdigit()):
        raise ValueError(f"{flag}: a process is coordinator or worker-N, not {text!r}")
    return text


@dataclass(frozen=True)
class Stale:
    at: float
    seconds: float
    topic: str  # one of STALE_TOPICS
    partition: int
    behind: int

    def flag(self) -> str:
        return f"{self.at:g},{self.seconds:g},{self.topic},{self.partition},{self.behind}"

    @classmethod
    def parse(cls, text: str) -> Stale:
        at, seconds, topic, partition, behind = text.split(",")
        if topic not in STALE_TOPICS:
            raise ValueError(f"--stale: the topic is one of {STALE_TOPICS}, not {topic!r}")
        return cls(float(at), float(seconds), topic, int(partition), int(behind))


@dataclass(frozen=True)
class Slow:
    """A slow link: chunks between processes ``a`` and ``b`` sent in [at, at + seconds)
    arrive ``extra`` seconds later than they would."""

    at: float
    seconds: float
    a: str
    b: str
    extra: float

    def flag(self) -> str:
        return f"{self.at:g},{self.seconds:g},{self.a},{self.b},{self.extra:g}"

    @classmethod
    def parse(cls, text: str) -> Slow:
        """``AT,FOR,A,B,EXTRA`` (e.g. ``0.5,1,worker-1,coordinator,0.8``)."""
        try:
            at, seconds, a, b, extra = text.split(",")
        except ValueError:
            raise ValueError(f"--slow is AT,FOR,A,B,EXTRA, not {text!r}") from None
        if a == b:
            raise ValueError(f"--slow: a link joins two processes, not {a} and itself")
        return cls(float(at), float(seconds), _process(a, "--slow"), _process(b, "--slow"),
                   float(extra))


@dataclass(frozen=True)
class Jump:
    """A wall-clock jump: ``process``'s ``time()`` steps by ``seconds`` at ``at``."""

    at: float
    process: str
    seconds: float

    def flag(self) -> str:
        return f"{self.at:g},{self.process},{self.seconds:g}"

    @classmethod
    def parse(cls, text: str) -> Jump:
        """``AT,PROCESS,SECONDS`` (e.g. ``0.4,coordinator,-12.5``)."""
        try:
            at, process, seconds = text.split(",")
        except ValueError:
            raise ValueError(f"--clock is AT,PROCESS,SECONDS, not {text!r}") from None
        return cls(float(at), _process(process, "--clock"), float(seconds))


@dataclass(frozen=True)
class Disk:
    """A disk fault: ``worker``'s file system fails its first mutating call at or after
    ``at`` as ``kind`` says (one of :data:`DISK_KINDS`), and every call after it."""

    at: float
    worker: str
    kind: str

    def flag(self) -> str:
        return f"{self.at:g},{self.worker},{self.kind}"

    @classmethod
    def parse(cls, text: str) -> Disk:
        """``AT,WORKER,KIND`` (e.g. ``0.4,worker-1,torn``)."""
        try:
            at, worker, kind = text.split(",")
        except ValueError:
            raise ValueError(f"--disk is AT,WORKER,KIND, not {text!r}") from None
        if _process(worker, "--disk") == "coordinator":
            raise ValueError("--disk: the coordinator keeps no stores; a disk fault is a "
                             "worker's (worker-N)")
        if kind not in DISK_KINDS:
            raise ValueError(f"--disk: the kind is one of {DISK_KINDS}, not {kind!r}")
        try:
            return cls(float(at), worker, kind)
        except ValueError:
            raise ValueError(f"--disk: AT is simulated seconds, not {at!r}") from None


@dataclass(frozen=True)
class Schedule:
    """One run's faults (see the module docstring); all off by default."""

    crash: Pair | None = None
    cut: Pair | None = None
    outage: Pair | None = None
    stale: Stale | None = None
    kafka_errors: float = 0.0
    object_errors: float = 0.0
    #: the workload: a few hot accounts (not a fault: kept when shrinking)
    hot: bool = False
    coordinator: Pair | None = None
    #: the snapshot interval, simulated seconds (not a fault: kept when shrinking); None:
    #: the simulator's default (``sfaas.sim.cluster.ROUNDS``)
    rounds: float | None = None
    #: the workers' store engine (not a fault: kept when shrinking)
    store: str = "memonly"
    slow: Slow | None = None
    clock: Jump | None = None
    disk: Disk | None = None
    #: standby workers per worker (not a fault: kept when shrinking)
    standbys: int = 0
    #: worker 1 cut from every broker at ``at`` for ``for`` seconds
    kafka_cut: Pair | None = None

    def args(self) -> list[str]:
        """The ``python -m sfaas.sim`` flags that give this schedule."""
        out: list[str] = []
        flags = {"coordinator": "crash-coordinator", "kafka_cut": "cut-kafka"}
        for name in ("crash", "cut", "outage", "coordinator", "kafka_cut"):
            pair = getattr(self, name)
            if pair is not None:
                out += [f"--{flags.get(name, name)}", f"{pair[0]:g},{pair[1]:g}"]
        if self.stale is not None:
            out += ["--stale", self.stale.flag()]
        if self.slow is not None:
            out += ["--slow", self.slow.flag()]
        if self.clock is not None:
            out += ["--clock", self.clock.flag()]
        if self.disk is not None:
            out += ["--disk", self.disk.flag()]
        if self.kafka_errors:
            out += ["--kafka-errors", f"{self.kafka_errors:g}"]
        if self.object_errors:
            out += ["--object-errors", f"{self.object_errors:g}"]
        if self.hot:
            out += ["--accounts", str(HOT), "--rate", f"{HOT_RATE:g}"]
        if self.rounds is not None:
            out += ["--rounds", f"{self.rounds:g}"]
        if self.store != "memonly":
            out += ["--store", self.store]
        if self.standbys:
            out += ["--standbys", str(self.standbys)]
        return out

    def faults(self) -> int:
        return len([f for f in (self.crash, self.cut, self.outage, self.stale,
                                self.kafka_errors, self.object_errors, self.coordinator,
                                self.slow, self.clock, self.disk, self.kafka_cut) if f])

    def without(self, name: str) -> Schedule:
        """This schedule less one fault (shrinking)."""
        off: object = 0.0 if name in ("kafka_errors", "object_errors") else None
        return Schedule(**{**self.__dict__, name: off})

    def __str__(self) -> str:
        return " ".join(self.args()) or "(none)"


#: the fields of a schedule, in the order shrinking drops them
FAULTS = ("crash", "cut", "outage", "stale", "kafka_errors", "object_errors", "coordinator",
          "slow", "clock", "disk", "kafka_cut")


def _r(x: float) -> float:
    return round(x, 2)


def draw(seed: int, *, load_seconds: float = 1.0, partitions: int = 4) -> Schedule:
    """The schedule of ``seed`` (its own ``random.Random``, apart from the run's):
    ``load_seconds`` is about how long the workload sends (faults land in it)."""
    rng = random.Random(f"sfaas.sim.faults {seed}")
    hot = rng.random() < 0.3
    load = HOT_LOAD_SECONDS if hot else load_seconds

    def when() -> float:
        return _r(rng.uniform(0.02, load))

    crash = (when(), _r(rng.uniform(0.05, 1.0))) if rng.random() < 0.5 else None
    cut = (when(), _r(rng.uniform(0.1, 2.0))) if rng.random() < 0.35 else None
    outage = (when(), _r(rng.uniform(0.1, 3.0))) if rng.random() < 0.25 else None
    stale = None
    if rng.random() < 0.5:
        recoveries = [sum(p) for p in (crash, cut) if p is not None]
        at = _r(rng.choice(recoveries) + rng.uniform(0.0, 0.3)) if recoveries else when()
        topic = rng.choice(STALE_TOPICS)
        part = rng.randrange(partitions) if topic == "in" else 0
        stale = Stale(at, _r(rng.uniform(0.2, 3.0)), topic, part, rng.randint(1, 20))
    kafka_errors = rng.choice((0.0, 0.0, 0.005, 0.02))
    object_errors = rng.choice((0.0, 0.0, 0.05, 0.2))
    coordinator = (when(), _r(rng.uniform(0.05, 1.0))) if rng.random() < 0.25 else None
    rounds = max(0.01, _r(rng.uniform(0.1, 0.6) * load))
    store = rng.choice(STORES)
    if store != "memonly":
        rounds = max(0.01, _r(rounds / FILE_ROUNDS))
    # (drawn after all the rest: no earlier draw of any seed changed)
    slow = None
    if rng.random() < 0.3:
        a, b = rng.choice(LINKS)
        slow = Slow(when(), _r(rng.uniform(0.2, 3.0)), a, b, _r(rng.uniform(0.05, 3.0)))
    jump = None
    if rng.random() < 0.3:
        process = rng.choice(PROCESSES)
        jump = Jump(when(), process, _r(rng.choice((-1, 1)) * rng.uniform(0.5, 30.0)))
    # (drawn after the slow link and the clock jump: no earlier draw of any seed changed)
    disk = None
    if rng.random() < 0.25:
        disk = Disk(when(), rng.choice(DISK_WORKERS), rng.choice(DISK_KINDS))
    # (drawn after the disk fault: no earlier draw of any seed changed)
    standbys = 1 if rng.random() < STANDBYS else 0
    # (drawn after the standbys: no earlier draw of any seed changed) — near a recovery
    # when there is one: a fence on the wire when the cut worker is lost lands late
    kafka_cut = None
    if rng.random() < 0.3:
        recoveries = [sum(p) for p in (crash, cut) if p is not None]
        at = _r(rng.choice(recoveries) + rng.uniform(0.0, 0.2)) if recoveries else when()
        kafka_cut = (at, _r(rng.uniform(0.5, 4.0)))
    return Schedule(crash, cut, outage, stale, kafka_errors, object_errors, hot, coordinator,
                    rounds, store, slow, jump, disk, standbys, kafka_cut)
