"""Fencing a zombie worker, without a cluster: the lease's arithmetic on a fake clock, the
generation checks of peer channels, a lease-gated channel and egress, the epoch log's
generation, and the supervisor's decision to kill a silent child (``worker/fence.py``,
``worker/calls.py``, ``launcher/supervisor.py``, ``sfaas/runtime/liveness.py``)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher import supervisor
from launcher.supervisor import Child, Supervisor, stalled
from sfaas.errors import EXIT_FENCED, ChannelClosed
from sfaas.runtime import channels, liveness, wire
from sfaas.runtime.epochlog import EpochRecord
from tests.fuzz.harness import FakeChannel, bare_worker
from tests.runtime.txn_fakes import TxnProducer
from worker.calls import stale_generation
from worker.fence import LEASE_FRACTION, Fenced, FenceLease
from worker.links import CoordinatorLink

T = 2.0  # heartbeat_timeout


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _lease(clock: Clock, closed: list[bool] | None = None) -> FenceLease:
    flag = closed if closed is not None else [False]
    return FenceLease(T, lambda: flag[0], clock=clock, exit=None)


# -- the lease's arithmetic --------------------------------------------------------------------

def test_the_lease_runs_from_the_answered_beats_send_time_not_the_answers_arrival() -> None:
    clock = Clock()
    lease = _lease(clock)
    lease.grant(100.0)
    assert lease.until == 100.0 + T * LEASE_FRACTION
    clock.t = 100.99
    assert lease.valid()
    clock.t = 101.0
    assert not lease.valid()
    # a paused process reads an old answer late: it does not extend the lease past its beat
    clock.t = 106.0
    lease.on_alive(0, 7, 100.5)
    assert not lease.valid() and lease.until == 101.5
    # an answer older than the newest one never shortens it
    lease.grant(100.2)
    assert lease.until == 101.5


def test_a_busy_loop_waits_for_the_next_answer_and_only_a_long_silence_fences() -> None:
    clock = Clock()
    lease = _lease(clock)
    lease.grant(100.0)
    clock.t = 101.0 + T  # expired by exactly T, the channel open: wait, do not leave
    assert lease.check() is False and not lease.fenced
    clock.t = 101.0 + T + 0.01
    with pytest.raises(Fenced, match=r"fenced: no word from the coordinator for 3\.0 s "
                                     r"\(lease expired\), leaving"):
        lease.check()


def test_an_expired_lease_with_a_closed_channel_fences_at_once() -> None:
    clock, closed = Clock(), [False]
    lease = _lease(clock, closed)
    lease.grant(100.0)
    clock.t = 101.2
    closed[0] = True
    with pytest.raises(Fenced, match="its channel is closed"):
        lease.check()
    # ... but a lease that holds lets the worker act (and quiesce) even so
    lease2 = _lease(Clock(100.5), closed)
    lease2.grant(100.0)
    assert lease2.check()


def test_waiting_to_rejoin_acts_on_nothing_and_is_not_fenced() -> None:
    clock, closed = Clock(), [True]
    lease = _lease(clock, closed)
    lease.grant(100.0)
    lease.suspend()
    clock.t = 200.0
    assert lease.check() is False and not lease.fenced
    lease.grant(199.9)  # the restarted coordinator's Assign answered the Register
    assert lease.check()
    lease.suspend()  # ... and when the coordinator cannot be rejoined, the worker leaves
    with pytest.raises(Fenced, match="fenced: could not rejoin the coordinator, leaving"):
        lease.fence("could not rejoin the coordinator")


def test_a_worker_that_ran_while_its_coordinator_stood_still_rejoins_instead_of_leaving() -> None:
    """The coordinator paused (the pauses series: SIGSTOP, then its supervisor replaces it):
    a worker that ran throughout — its heartbeat task ticked every T/4 — holds an expired
    lease but is not fenced; once the lease expired by more than T it leaves the channel to
    rejoin. A worker that was itself paused (no tick for the pause) is fenced as before."""
    clock, closed = Clock(), [False]
    lease = _lease(clock, closed)
    lease.tick()
    clock.t = 100.2
    lease.grant(100.2)  # the last beat the coordinator answered; then it stood still
    while clock.t < 103.5:  # (to 103.7: expired by 2.5 s)
        clock.t += T / 4
        lease.tick()
        assert not lease.valid() or clock.t < 101.2
        assert lease.check() is lease.valid() and not lease.fenced  # acts on nothing, stays
    assert lease.coordinator_silent()  # expired by more than T: leave the channel, rejoin
    closed[0] = True  # (or the supervisor killed the coordinator: the channel closed)
    assert not lease.coordinator_silent()
    assert lease.check() is False and not lease.fenced
    lease.suspend()  # rejoining: nothing acts until the new coordinator's Assign
    lease.grant(103.1)
    assert lease.check()

    # the same silence, but this worker stood still for it: a zombie, fenced on waking
    clock, closed = Clock(), [False]
    zombie = _lease(clock, closed)
    zombie.tick()
    clock.t = 100.2
    zombie.grant(100.2)
    clock.t = 100.4
    zombie.tick()
    clock.t = 106.4  # SIGCONT: the channel closed meanwhile, no tick yet
    closed[0] = True
    with pytest.raises(Fenced, match="its channel is closed"):
        zombie.check()
    # ... and a tick after the pause does not make it awake again
    clock2, closed2 = Clock(), [False]
    late = _lease(clock2, closed2)
    late.tick()
    clock2.t = 100.2
    late.grant(100.2)
    clock2.t = 106.4
    late.tick()
    assert not late.awake() and not late.coordinator_silent()
    with pytest.raises(Fenced, match="lease expired"):
        late.check()
    # without snapshot rounds nothing can be rejoined: an awake worker leaves as before
    clock3, closed3 = Clock(), [False]
    alone = FenceLease(T, lambda: closed3[0], rejoins=False, clock=clock3, exit=None)
    alone.tick()
    clock3.t = 100.2
    alone.grant(100.2)
    while clock3.t < 103.5:
        clock3.t += T / 4
        alone.tick()
        if clock3.t > 101.2 + T:
            break
        alone.check()
    assert not alone.awake() and not alone.coordinator_silent()
    with pytest.raises(Fenced, match="lease expired"):
        alone.check()


def test_a_worker_whose_coordinator_is_silent_from_its_first_beat_rejoins() -> None:
    """The heartbeat task starts the lease itself (a standby just promoted, a replacement
    just assigned) and the coordinator is cut off at once: no Alive ever comes. The process
    ran throughout, so once the lease expired by more than T it leaves the channel to
    rejoin — it used to count its first tick as the end of a stall and leave the process
    (the nemesis' seed 4: the promoted standby restarted and took another slot)."""
    clock, closed = Clock(), [False]
    lease = _lease(clock, closed)
    lease.start(100.0)  # (worker.heartbeat: assigned, not yet ready)
    while clock.t < 100.0 + T * LEASE_FRACTION + T + 0.3:
        clock.t += T / 4
        lease.tick()
        assert lease.check() is lease.valid() and not lease.fenced
    assert lease.awake() and lease.coordinator_silent()
    # a process that stood still after its start is fenced as before
    clock2 = Clock()
    paused = _lease(clock2)
    paused.start(100.0)
    clock2.t = 100.0 + T * LEASE_FRACTION + T + 0.3
    with pytest.raises(Fenced, match="lease expired"):
        paused.check()


def test_answers_renew_the_lease_while_the_worker_acts_on_something_else() -> None:
    """The coordinator's channel is read by a task of its own: an ``Alive`` renews the lease
    although nobody asks for the next message (the worker is busy with a recovery)."""
    async def main() -> tuple[list[wire.Alive], list[wire.Message]]:
        link = CoordinatorLink("s" * 16)
        begin = wire.Begin(3, 1.0, None, False)
        link.channel = FakeChannel([wire.encode_frame([wire.Alive(0, 9, 1.5), begin]),
                                    wire.encode_frame([wire.Alive(0, 9, 2.0)])])
        alive: list[wire.Alive] = []
        link.listen(alive.append)
        for _ in range(10):
            await asyncio.sleep(0)
        got = await link.recv()
        with pytest.raises(ChannelClosed):
            await link.recv()
        with pytest.raises(ChannelClosed):  # (and so does every later one)
            await link.recv()
        return alive, got

    alive, got = asyncio.run(main())
    assert [a.sent for a in alive] == [1.5, 2.0]
    assert got == [wire.Begin(3, 1.0, None, False)]


def test_held_returns_once_an_answer_renews_the_lease() -> None:
    async def main() -> float:
        lease = FenceLease(T, lambda: False, exit=None)
        lease.grant(time.monotonic() - T * LEASE_FRACTION - 0.01)  # just expired
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: lease.on_alive(0, 1, time.monotonic()))
        t0 = time.monotonic()
        await lease.held()
        assert lease.valid()
        return time.monotonic() - t0

    waited = asyncio.run(main())
    assert 0.05 < waited < 1.0, waited


def test_held_fences_when_no_answer_comes() -> None:
    async def main() -> None:
        lease = FenceLease(0.4, lambda: False, exit=None)
        lease.grant(time.monotonic() - 0.3)
        await lease.held()

    with pytest.raises(Fenced):
        asyncio.run(main())


def test_a_worker_the_coordinator_declares_lost_always_holds_an_expired_lease() -> None:
    """Seeded schedules of beats, network delays, and pauses of either process: at every
    moment the coordinator's watchdog would declare the worker lost, the worker's lease —
    from the answers it received by then — has expired."""
    seed = random.SystemRandom().randrange(1 << 32)
    rnd = random.Random(seed)
    for _ in range(200):
        beats = []  # (sent, arrived at the coordinator, answer arrived at the worker)
        t = 0.0
        while t < 30:
            t += T / 4 + (rnd.expovariate(1.0) if rnd.random() < 0.1 else 0.0)  # worker pauses
            there = t + rnd.uniform(0, 0.3) + (rnd.uniform(0, 5) if rnd.random() < 0.05 else 0)
            back = there + rnd.uniform(0, 0.3) + (rnd.uniform(0, 5) if rnd.random() < 0.05 else 0)
            beats.append((t, there, back))
        for now in [x / 10 for x in range(5, 320)]:
            heard = [there for _, there, _ in beats if there <= now]
            lost = now - (max(heard) if heard else 0.0) > T
            acked = [sent for sent, there, back in beats if back <= now]
            until = max(acked) + T * LEASE_FRACTION if acked else -1.0
            if lost:
                assert now >= until, f"seed {seed}: lost at {now} but leased until {until}"


# -- generations on peer channels ----------------------------------------------------------------

def test_a_hello_with_a_stale_generation_is_refused_naming_index_and_generations(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[FakeChannel, FakeChannel, FakeChannel]:
        w = bare_worker(str(tmp_path))
        w.state.peers = [["127.0.0.1", 1, 50], ["127.0.0.1", 2, 70]]
        stale = FakeChannel([wire.encode_frame([wire.Result(1, True, 1)])], peer="zombie")
        await w.calls.serve(stale, [wire.Hello(1, 60)])
        fresh = FakeChannel([], peer="replacement")
        with pytest.raises(ChannelClosed):  # served until its input ends
            await w.calls.serve(fresh, [wire.Hello(1, 70)])
        # a newer membership (a recovery's) makes an accepted channel stale at its next frame
        later = FakeChannel([wire.encode_frame([wire.Result(1, True, 1)])] * 3, peer="older")
        w.state.set_owners(w.state.owners, 2, [["127.0.0.1", 1, 50], ["127.0.0.1", 3, 80]])
        await w.calls.serve(later, [wire.Hello(1, 70)])
        return stale, fresh, later

    with caplog.at_level(logging.WARNING, logger="sfaas.worker"):
        stale, fresh, later = asyncio.run(main())
    assert stale.closed and len(stale.frames) == 1, "the stale channel was read"
    assert later.closed and len(later.frames) == 3
    refusals = [r.getMessage() for r in caplog.records if "refusing the channel" in r.getMessage()]
    assert refusals == [
        "refusing the channel of worker 1 at zombie: its generation 60 is older than 70, the "
        "membership's (a fenced process)",
        "refusing the channel of worker 1 at older: its generation 70 is older than 80, the "
        "membership's (a fenced process)",
    ]


def test_a_membership_without_generations_refuses_nobody(tmp_path: Path) -> None:
    w = bare_worker(str(tmp_path))
    assert not stale_generation(w.state, 1, 0, "p")  # (rows of two: generation unknown)
    w.state.peers = [["h", 1, 5], ["h", 2, 9]]
    assert stale_generation(w.state, 1, 8, "p") and not stale_generation(w.state, 1, 9, "p")
    assert not stale_generation(w.state, 7, 0, "p")  # an index beyond the membership: checked elsewhere


# -- a lease-gated channel ---------------------------------------------------------------------------

def test_a_gated_channel_holds_its_messages_until_the_gate_opens() -> None:
    async def main() -> tuple[list[wire.Message], float]:
        got: asyncio.Queue[tuple[list[wire.Message], float]] = asyncio.Queue()

        async def on_conn(ch: channels.Channel) -> None:
            while True:
                got.put_nowait((await ch.recv(), time.monotonic()))

        server = await channels.serve("127.0.0.1", 0, "s" * 16, on_conn)
        port = server.sockets[0].getsockname()[1]
        ch = await channels.connect("127.0.0.1", port, "s" * 16)
        open_ = [False]
        ch.gate = lambda: open_[0]
        ch.send(wire.Hello(3, 9))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(got.get(), 0.3)
        t_open = time.monotonic()
        open_[0] = True
        msgs, at = await asyncio.wait_for(got.get(), 2.0)
        ch.close()
        server.close()
        return msgs, at - t_open

    msgs, delay = asyncio.run(main())
    assert msgs == [wire.Hello(3, 9)] and delay < 0.5


def test_egress_stamps_replies_with_the_generation_and_a_fenced_worker_produces_nothing(
        tmp_path: Path) -> None:
    exits: list[int] = []

    async def main() -> TxnProducer:
        w = bare_worker(str(tmp_path), snapshot_interval=1.0)
        w.state.generation = 1234
        prod = TxnProducer()
        w.egress.lanes[0].producer = w.egress.lanes[1].producer = prod
        clock = Clock(10.0)
        lease = FenceLease(T, lambda: w.uplink.closed, clock=clock, exit=exits.append)
        w.egress._lease = lease
        lease.grant(10.0)
        w.state.offsets.take(0, 1)
        w.state.offsets.take(0, 2)
        w.egress.add(0, b"one", 0, 1)
        await w.egress.flush()
        clock.t = 11.0 + T + 0.5  # the lease ran out long ago (a pause): fenced at the next reply
        w.egress.add(0, b"two", 0, 2)
        with pytest.raises(Fenced):
            await w.egress.flush()
        return prod

    prod = asyncio.run(main())
    assert [(v, h) for _, v, _, h in prod.sent] == [(b"one", [("sfaas-gen", b"0.1234")])]
    assert prod.values() == [b"one"]
    assert exits[:1] == [EXIT_FENCED]


# -- the epoch log's generation -----------------------------------------------------------------------

def test_epoch_log_records_carry_the_generation_and_version_3_still_decodes() -> None:
    rec = EpochRecord(5, 1, 12.5, ((7, 0, 3),), generation=1_700_000_000_000_000, fence=41)
    data = rec.encode()
    assert data[4] == 6 and EpochRecord.decode(data) == rec
    import msgpack

    v5 = b"SFEL\x05" + msgpack.packb([5, 1, 12.5, [[7, 0, 3]], [], [], [], 9, []])
    assert (EpochRecord.decode(v5).generation, EpochRecord.decode(v5).fence) == (9, -1)

    v3 = b"SFEL\x03" + msgpack.packb([5, 1, 12.5, [[7, 0, 3]], [], [], []])
    assert EpochRecord.decode(v3).generation == 0
    v4 = b"SFEL\x04" + msgpack.packb([5, 1, 12.5, [[7, 0, 3]], [], [], [], 9])
    assert (EpochRecord.decode(v4).generation, EpochRecord.decode(v4).direct) == (9, ())
    bad = b"SFEL\x04" + msgpack.packb([5, 1, 12.5, [[7, 0, 3]], [], [], [], "x"])
    with pytest.raises(ValueError, match="the generation must be an int >= 0, got 'x'"):
        EpochRecord.decode(bad)


# -- liveness and the supervisor's watchdog ---------------------------------------------------------

def test_the_watchdog_decides_from_the_files_age_after_a_grace() -> None:
    assert stalled(100.0, None, 105.0, 5.0, grace=15.0) == ""  # starting
    assert "never touched its liveness file" in stalled(100.0, None, 116.0, 5.0, grace=15.0)
    assert stalled(100.0, 4.9, 130.0, 5.0, grace=15.0) == ""
    why = stalled(100.0, 5.2, 130.0, 5.0, grace=15.0)
    assert why == "its liveness file is 5.2 s old (limit 5 s): stopped or stuck"
    assert stalled(100.0, 500.0, 130.0, 0.0, grace=15.0) == ""  # off


def test_a_coordinator_that_is_up_gets_no_grace() -> None:
    """A coordinator paused a few seconds after a restart stops every reply: once it touched
    its file since it started, the watchdog holds it to the limit at once (issue 48: a 6 s
    pause 7 s after a restart was a 6.6 s gap, the next one 4.05 s)."""
    assert stalled(100.0, 3.5, 107.0, 3.0, grace=15.0) == ""  # (a worker: still in its grace)
    why = stalled(100.0, 3.5, 107.0, 3.0, grace=15.0, up_ends_grace=True)
    assert why == "its liveness file is 3.5 s old (limit 3 s): stopped or stuck"
    assert stalled(100.0, 1.0, 107.0, 3.0, grace=15.0, up_ends_grace=True) == ""  # fresh
    # the file of the process before this one (older than this start): still starting
    assert stalled(100.0, 9.0, 107.0, 3.0, grace=15.0, up_ends_grace=True) == ""
    assert stalled(100.0, None, 107.0, 3.0, grace=15.0, up_ends_grace=True) == ""


def test_sfaas_alive_reads_the_liveness_file(tmp_path: Path) -> None:
    f = tmp_path / "alive"

    def alive(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sfaas", "alive", *args], capture_output=True,
                              text=True, timeout=60, env=dict(os.environ, SFAAS_HOME=str(tmp_path)))

    missing = alive("--max-age", "5")
    assert missing.returncode == 1 and f"no liveness file {f}" in missing.stderr
    liveness.touch(str(f))
    assert alive("--max-age", "5").returncode == 0
    old = time.time() - 60
    os.utime(f, (old, old))
    stale = alive("--max-age", "5", "--file", str(f))
    assert stale.returncode == 1 and "last touched 60" in stale.stderr
    bad = alive("--max-age", "-1")
    assert bad.returncode == 2 and "--max-age must be a positive number of seconds, got -1" in bad.stderr


def test_the_sfaas_alive_probe_loads_no_runtime(tmp_path: Path) -> None:
    """The probe a healthcheck runs every few seconds in every container (the ``sfaas``
    console script: ``launcher.main``) reads the file with the standard library alone —
    through the runtime it cost 0.7 s of CPU a run — and reads the file the runtime
    touches by default."""
    from launcher import alive
    from sfaas.runtime.settings import Settings

    code = ("import sys; from launcher import main; rc = main(['alive', '--max-age', '5']); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sfaas', 'aiokafka', 'msgpack', 'worker', 'coordinator', 'statestores', 'remotes'}))")
    env = dict(os.environ, SFAAS_HOME=str(tmp_path))
    env.pop(liveness.ENV, None)
    s = Settings.load(env=env)
    liveness.touch(liveness.alive_path(s.home, s.alive_file))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=env, cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.split("\n")[-2] == "0 []", out
    assert alive.ENV == liveness.ENV


@pytest.mark.timeout(120)
def test_the_supervisor_kills_and_restarts_a_stopped_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A real worker process (waiting for a coordinator that never answers) touches its file;
    SIGSTOPped, it is SIGKILLed once the file is timeout + 1 s old, and restarted."""
    with socket_closed() as port:
        monkeypatch.setenv("SFAAS_HEARTBEAT_TIMEOUT", "0.5")
        monkeypatch.setenv("SFAAS_COORDINATOR", f"127.0.0.1:{port}")
        monkeypatch.setenv("SFAAS_HOME", str(tmp_path))
        monkeypatch.setenv("SFAAS_SECRET", "fencing-test-secret-0123")
        monkeypatch.setenv("SFAAS_APP", "tests.runtime.apps.ledger:app")
        monkeypatch.setenv("SFAAS_SNAPSHOT_INTERVAL", "0")
        monkeypatch.setattr(supervisor, "START_GRACE", 4.0)
        (tmp_path / "cluster.json").write_text("{}")
        child = Child("worker", 0, ["worker", "--name", "w0"], str(tmp_path / "w.log"))
        sup = Supervisor(tmp_path, {"app": "ledger"}, [child])
        assert sup.max_age == 1.5  # heartbeat_timeout + 1 s
        sup.start(child)
        first = child.pid
        try:
            deadline = time.monotonic() + 30
            while liveness.age(child.alive_file) is None:
                assert time.monotonic() < deadline, (tmp_path / "w.log").read_text()[-2000:]
                time.sleep(0.1)
            time.sleep(0.5)
            assert liveness.age(child.alive_file) < 1.0  # touched every 0.125 s
            os.kill(first, signal.SIGSTOP)
            stopped = time.monotonic()
            with caplog.at_level(logging.INFO, logger="sfaas.supervisor"):
                while child.pid == first and time.monotonic() < stopped + 30:
                    if sup.poll():
                        sup.write()
                    time.sleep(0.05)
            took = time.monotonic() - stopped
            assert child.pid != first and child.alive and child.stalls == 1, child.public()
            # not before the file is max_age (1.5 s) old — its last touch came at most
            # 0.125 s before the stop — and within the grace's end plus that otherwise
            # (a start slowed past the grace by a loaded host ends the grace before the
            # stop: then only the age counts, ~1.4 s; it once failed a bound of 2.0 s)
            assert 1.5 - 0.125 - 0.05 < took < 10.0, took
            assert any(f"killing worker 0 (pid {first}): its liveness file is" in r.getMessage()
                       for r in caplog.records)
            import json

            listed = json.loads((tmp_path / "cluster.json").read_text())["processes"][0]
            assert listed["stalls"] == 1 and listed["restarts"] == 1
        finally:
            sup.stop()


class socket_closed:
    """A local port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = int(s.getsockname()[1])
        s.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_recoverys_answer_stops_waiting_for_the_lease_once_the_coordinator_is_gone() -> None:
    """Found by the simulator (seed 309): the coordinator crashed while its workers
    recovered; each finished and waited for its lease to answer ``Recovered`` — inside the
    inbox loop, which alone would see the channel closed and rejoin the next coordinator. A
    worker awake throughout is never fenced, so it waited for ever. Now the wait ends when
    the channel closes (False: nobody to answer), and the loop goes on to the rejoin."""
    async def main() -> None:
        clock = SimpleNamespace(t=100.0)
        link = CoordinatorLink("s" * 16)
        link.channel = SimpleNamespace(closed=False)
        lease = link.lease = FenceLease(T, link.is_closed, clock=lambda: clock.t, exit=None)
        lease.tick()
        clock.t = 100.1
        lease.grant(100.1)  # (a beat sent now was answered)
        while clock.t < 100.1 + T * LEASE_FRACTION + 0.2:  # (awake throughout, the lease out)
            clock.t += 0.05
            lease.tick()
        waiting = asyncio.ensure_future(link.held_unless_closed())
        for _ in range(4):
            await asyncio.sleep(0.05)
            clock.t += 0.05
            lease.tick()
        assert not waiting.done() and not lease.valid() and lease.awake()
        link.channel.closed = True
        assert await asyncio.wait_for(waiting, 2) is False

    asyncio.run(main())


def test_a_recovery_step_waiting_for_the_lease_ends_when_the_channel_closes() -> None:
    """The simulator's seed 49 (``--crash 0.36,0.48 --slow 0.77,0.5,worker-0,coordinator,2.82``):
    a recovery's fence waited in ``held`` — inside the loop that reads the coordinator — for
    a lease only the rejoin after that loop renews; the awake worker had closed the channel
    to rejoin, and nothing ended the wait. ``held_open`` ends it with ``ChannelClosed``."""
    from sfaas.errors import ChannelClosed

    clock, closed = Clock(), [False]
    lease = _lease(clock, closed)
    lease.tick()
    clock.t = 100.2
    lease.grant(100.2)
    while clock.t < 103.5:  # awake throughout, its coordinator silent
        clock.t += T / 4
        lease.tick()
    closed[0] = True  # the heartbeat task left the channel to rejoin

    async def go() -> None:
        async def heartbeat_task() -> None:  # (the worker stays awake)
            while True:
                lease.tick()
                await asyncio.sleep(0.01)

        ticks = asyncio.ensure_future(heartbeat_task())
        try:
            with pytest.raises(TimeoutError):  # (held: waits for a renewal nobody can send)
                await asyncio.wait_for(lease.held(), 0.5)
            with pytest.raises(ChannelClosed, match="during the recovery"):
                await asyncio.wait_for(lease.held_open(), 5.0)
            assert not lease.fenced
        finally:
            ticks.cancel()

    asyncio.run(go())
