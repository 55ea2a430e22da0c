"""The simulator's slow link and wall-clock jump (issue 51 item 1): a slow link delays
every chunk between two processes by its extra seconds and keeps their order; a clock jump
moves one process's ``time()`` — not its ``monotonic()``, not another's — for good, its
restarts included; a run with either replays byte for byte, from ``python -m sfaas.sim``
too; and the flags a schedule prints give it back."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import subprocess
import sys

import pytest

from examples.bank import app
from sfaas.app import App
from sfaas.runtime import channels, ports, wire
from sfaas.runtime.settings import Settings
from sfaas.sim import clock
from sfaas.sim.__main__ import ROLES, parser, schedule
from sfaas.sim.budget import command, run_seed
from sfaas.sim.cluster import Process, Roles
from sfaas.sim.faults import LINKS, PROCESSES, Jump, Schedule, Slow, Stale, draw
from sfaas.sim.network import SimNetwork
from sfaas.sim.ports import WALL_START, VirtualClockPort, WallClocks

SECRET = "s3cret"
#: what each chunk takes without a fault: the switch's delay range (seconds)
DELAY = (0.001, 0.01)


#: seconds after which a hanging test ends the process (the ``watchdog`` fixture)
HANG_AFTER = 300
pytestmark = pytest.mark.usefixtures("watchdog")


def _chunk(i: int) -> bytes:
    return b"%04d" % i


async def _arrivals(net: SimNetwork, name: str) -> tuple[int, dict[int, float]]:
    """A server of process ``name`` noting when each 4-byte chunk arrives: (port, times)."""
    loop = asyncio.get_running_loop()
    times: dict[int, float] = {}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                chunk = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                return
            times[int(chunk)] = loop.time()

    server = await net.port(name).start_server(on_connect, "sim", 0)
    return server.sockets[0].getsockname()[1], times


@pytest.mark.parametrize("seed", range(5))
def test_a_slow_link_delays_its_chunks_by_the_extra_and_keeps_their_order(seed: int) -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop.random, delay=DELAY)  # type: ignore[attr-defined]
        port, times = await _arrivals(net, "server")
        _, slowed = await net.port("client").open_connection("sim", port)
        _, other = await net.port("third").open_connection("sim", port)
        sent: dict[int, float] = {}

        def send(writer: asyncio.StreamWriter, i: int) -> None:
            writer.write(_chunk(i))
            sent[i] = loop.time()

        send(slowed, 0)
        await asyncio.sleep(0.1)
        net.slow("client", "server", 1.0)
        for i in range(1, 6):
            send(slowed, i)
            send(other, 100 + i)  # (another link: not slowed)
            await asyncio.sleep(0.05)
        net.unslow("client", "server")
        for i in range(6, 9):
            send(slowed, i)
        await asyncio.sleep(3.0)
        took = {i: times[i] - sent[i] for i in sent}
        assert [i for i in times if i < 100] == list(range(9))  # (in the order read)
        assert DELAY[0] <= took[0] <= DELAY[1]
        assert all(1.0 + DELAY[0] <= took[i] <= 1.0 + DELAY[1] for i in range(1, 6)), took
        assert all(DELAY[0] <= took[100 + i] <= DELAY[1] for i in range(1, 6)), took
        # sent once the link is fast again: behind the slowed chunks, never before them
        assert all(times[i] >= times[5] and took[i] > 0.8 for i in range(6, 9)), took
        # and what is sent later again takes the drawn delay only
        send(slowed, 9)
        await asyncio.sleep(0.1)
        assert DELAY[0] <= times[9] - sent[9] <= DELAY[1]
    clock.run(body(), seed=seed)


def _ping(i: int) -> wire.Message:
    return wire.Heartbeat(i, i, [], float(i))


def test_a_slow_link_slows_both_ways_and_the_connect_but_not_other_links() -> None:
    """The product's channels over a slowed link: the connect (its first packet and the
    handshake) and each round trip take the extra both ways; a third process's do not."""
    async def body() -> None:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop.random, delay=DELAY)  # type: ignore[attr-defined]

        async def echo(chan: channels.Channel) -> None:
            while True:
                for msg in await chan.recv():
                    chan.send(msg)

        server = await channels.serve("sim", 0, SECRET, echo, network=net.port("server"))
        port = server.sockets[0].getsockname()[1]
        net.slow("server", "client", 0.5)  # (either order of the two names)
        t0 = loop.time()
        chan = await channels.connect("sim", port, SECRET, network=net.port("client"))
        assert loop.time() - t0 >= 3 * 0.5  # (the SYN, the server's nonce, and its answer)
        fast = await channels.connect("sim", port, SECRET, network=net.port("third"))
        for c, least, most in ((chan, 1.0, 1.0 + 2 * DELAY[1]), (fast, 0.0, 2 * DELAY[1])):
            t0 = loop.time()
            c.send(_ping(1))
            assert await c.recv() == [_ping(1)]
            assert least + 2 * DELAY[0] <= loop.time() - t0 <= most
    clock.run(body(), seed=7)


def test_a_clock_jump_moves_that_process_time_only() -> None:
    """Through the ports :func:`sfaas.sim.ports.process_ports` gives: the jumped process's
    ``time()`` reads the offset from then on, its ``monotonic()`` does not move, another
    process's clock stays on time; the process's next incarnation keeps the offset (its
    machine's clock), and jumps add up."""
    async def body() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        walls = WallClocks()
        coord = VirtualClockPort(loop.clock, walls.of("coordinator"))
        worker = VirtualClockPort(loop.clock, walls.of("worker-0"))
        await asyncio.sleep(5.0)
        assert coord.time() == worker.time() == WALL_START + 5.0 == WALL_START + loop.time()
        walls.jump("coordinator", -12.5)
        assert coord.time() == WALL_START + 5.0 - 12.5
        assert coord.monotonic() == worker.monotonic() == 5.0
        assert worker.time() == WALL_START + 5.0
        await asyncio.sleep(1.0)
        assert coord.time() == WALL_START + 6.0 - 12.5  # (it keeps the offset and runs on)
        restarted = VirtualClockPort(loop.clock, walls.of("coordinator"))
        assert restarted.time() == coord.time()
        walls.jump("coordinator", 30.0)
        assert restarted.time() == coord.time() == WALL_START + 6.0 + 17.5
        assert worker.time() == WALL_START + 6.0
    clock.run(body(), seed=1)


class _Sampled:
    """A process of the run that notes its clock port's ``time() - monotonic()`` every
    0.05 simulated s while it runs."""

    def __init__(self, real: Process, name: str, its: ports.Ports,
                 seen: dict[str, set[float]]) -> None:
        self._real, self._its = real, its
        self._seen = seen.setdefault(name, set())

    async def _sample(self) -> None:
        while True:
            self._seen.add(round(self._its.clock.time() - self._its.clock.monotonic()
                                 - WALL_START, 6))
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        side = asyncio.ensure_future(self._sample())
        try:
            await self._real.run()
        finally:
            side.cancel()


class _SampledRoles:
    """The real roles, each process sampled (:class:`_Sampled`) into ``seen``."""

    def __init__(self) -> None:
        self.seen: dict[str, set[float]] = {}

    def coordinator(self, s: Settings, name: str, its: ports.Ports) -> Process:
        return _Sampled(ROLES.coordinator(s, name, its), "coordinator", its, self.seen)

    def worker(self, s: Settings, a: App, name: str, its: ports.Ports) -> Process:
        return _Sampled(ROLES.worker(s, a, name, its), name, its, self.seen)


def test_a_clock_jump_in_a_run_shows_in_that_process_time_only() -> None:
    """In a whole run: the clock port of worker 0 reads 20 s ahead after the jump (and on
    time before it); the coordinator's and worker 1's never move."""
    sampled = _SampledRoles()
    roles = Roles(sampled.coordinator, sampled.worker)
    sched = Schedule(clock=Jump(0.3, "worker-0", 20.0))
    o = run_seed(app, roles, 4, sched)
    assert o.violations == []
    assert any(line.endswith("fault clock worker-0 +20 s") for line in o.trace)
    assert sampled.seen == {"coordinator": {0.0}, "worker-0": {0.0, 20.0}, "worker-1": {0.0}}


def _digest(trace: list[str]) -> str:
    return hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16]


#: a schedule with each new fault: the slow link past the heartbeat timeout (2 s in a run)
EACH = {
    "slow": Schedule(slow=Slow(0.3, 1.5, "worker-1", "coordinator", 2.5)),
    "clock": Schedule(clock=Jump(0.4, "coordinator", -25.0)),
}


@pytest.mark.parametrize("fault", sorted(EACH))
def test_a_run_with_each_fault_replays_byte_for_byte(fault: str) -> None:
    """Twice in this process and once from the printed command: the same trace, with the
    fault in it. (A slow link changes the trace; a clock jump shows in none of its lines —
    nothing a run traces reads the wall clock: ``test_a_clock_jump_in_a_run_…`` shows it
    reaches the process.)"""
    seed, sched = 2, EACH[fault]
    runs = [run_seed(app, ROLES, seed, sched) for _ in range(2)]
    assert runs[0].trace == runs[1].trace
    assert runs[0].violations == []
    assert any(f" fault {fault} " in line for line in runs[0].trace)
    argv = command(seed, sched).removeprefix("python ").split()
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True)
    assert f"digest {_digest(runs[0].trace)}" in out.stdout


def test_a_slow_link_changes_the_run() -> None:
    """The slow link of :data:`EACH` (past the heartbeat timeout) against the same link
    slowed by 0 s: another trace — worker 1's lease lapses behind the link and the
    coordinator loses it; it ran throughout, so it rejoins in its slot with its stores (it
    used to be fenced, exit 77, and restarted: ``worker.fence.FenceLease.start``), and the
    cluster recovers and answers everything."""
    sched = EACH["slow"]
    assert sched.slow is not None
    null = dataclasses.replace(sched, slow=dataclasses.replace(sched.slow, extra=0.0))
    runs = [run_seed(app, ROLES, 2, s) for s in (sched, null)]
    assert [o.violations for o in runs] == [[], []]
    unfaulted = [[line for line in o.trace if " fault " not in line] for o in runs]
    assert unfaulted[0] != unfaulted[1]
    assert runs[0].simulated_seconds > runs[1].simulated_seconds
    # the recovery aborted the transactions in flight of both slots' egress producers;
    # nobody exited
    assert {line.split()[2] for line in runs[0].trace if " aborted " in line} == {
        "sim.bank.out.slot-0", "sim.bank.out.slot-1"}
    assert not any(" aborted " in line for line in runs[1].trace)
    assert not any(" exits with " in line for o in runs for line in o.trace)


def test_the_flags_give_the_new_faults_back() -> None:
    """``Schedule.args`` through the command's own parser gives the schedule back, with
    every other fault beside the new ones; bad flags are refused by name."""
    s = Schedule(crash=(0.5, 0.25), cut=(1.0, 2.0), outage=(0.3, 1.5),
                 stale=Stale(1.2, 0.8, "epochs", 0, 7), kafka_errors=0.02, object_errors=0.2,
                 coordinator=(0.7, 0.3), rounds=0.05, store="lsm",
                 slow=Slow(0.57, 2.28, "worker-0", "worker-1", 1.57),
                 clock=Jump(0.02, "worker-1", -16.86))
    args = s.args()
    assert "--slow 0.57,2.28,worker-0,worker-1,1.57" in " ".join(args)
    assert "--clock 0.02,worker-1,-16.86" in " ".join(args)
    assert schedule(parser().parse_args(["--app", "a:b", "--seed", "1", *args])) == s
    for seed in range(40):
        drawn = dataclasses.replace(draw(seed), hot=False)  # (hot: --accounts, --rate)
        assert schedule(parser().parse_args(["--app", "a:b", "--seed", "1",
                                             *drawn.args()])) == drawn
    for bad in ("0.5,1,worker-1,worker-1,0.8", "0.5,1,worker-1,0.8", "0.5,1,w1,coordinator,1"):
        with pytest.raises(ValueError, match="--slow"):
            Slow.parse(bad)
    for bad in ("0.4,-12", "0.4,nobody,-12"):
        with pytest.raises(ValueError, match="--clock"):
            Jump.parse(bad)
    run = subprocess.run([sys.executable, "-m", "sfaas.sim", "--app", "examples.bank:app",
                          "--seed", "1", "--clock", "0.4,worker-2,5"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "'worker-2' is no process of a run of 2 workers" in run.stderr


def test_the_new_faults_are_drawn_by_the_seed_after_the_rest() -> None:
    """Each drawn by some seeds (every link, every process, jumps both ways) and pinned:
    the draw of a seed is its own (seed 0's and 1's new faults, from the session that
    added them); the rest of each draw is ``test_budget.py``'s pin."""
    schedules = [draw(seed) for seed in range(200)]
    slows = [s.slow for s in schedules if s.slow is not None]
    jumps = [s.clock for s in schedules if s.clock is not None]
    assert 30 <= len(slows) <= 90 and 30 <= len(jumps) <= 90
    assert {(s.a, s.b) for s in slows} == set(LINKS)
    assert max(s.extra for s in slows) > 2.0  # (past the run's heartbeat timeout)
    assert {j.process for j in jumps} == set(PROCESSES)
    assert min(j.seconds for j in jumps) < -10 and max(j.seconds for j in jumps) > 10
    assert draw(0).slow == Slow(0.57, 2.28, "worker-0", "worker-1", 1.57)
    assert draw(1).clock == Jump(0.02, "worker-1", -16.86)


def test_a_slow_registration_reaches_the_restarted_coordinator() -> None:
    """Found by the slow link (the simulator's own bug, fixed in ``SimCluster._exited``):
    worker 0's registration crawls over a slow link while worker 1, cut off, makes the
    coordinator's startup fail; the coordinator's process ended, but the handler of worker
    0's connection, still in its handshake, went on as a zombie, took the registration and
    the restarted coordinator waited for worker 0 for ever (nothing answered)."""
    sched = _schedule("--cut 0.2,1.8 --slow 0.03,2.32,worker-0,coordinator,0.95")
    o = run_seed(app, ROLES, 96, sched)
    assert any("exit coordinator: ChannelClosed" in line for line in o.trace)
    assert o.violations == [] and o.sent == len(o.replies)


def _schedule(flags: str) -> Schedule:
    return schedule(parser().parse_args(["--app", "a:b", "--seed", "0", *flags.split()]))
