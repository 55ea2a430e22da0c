"""Leased epochs (``worker.protocols.lease``): workers that exchange their reports commit the same
epochs with the same votes as the coordinator would, never run past their lease, go idle
together and wake up together, and take a round's marker at the lease's epoch.

A simulated cluster: ``n`` :class:`worker.protocols.lease.EpochLeaseHolder` objects on fake workers, joined by
a network that delivers each channel's messages in order after random delays. Each epoch
a worker calls random peers (a call served after the callee reported makes it report
again, before the result, as ``worker.calls`` does), votes random conflicts and aborts,
and takes the work that arrived (at random times, ``work_arrived``). The seed of a failing
case is in the assertion message.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sfaas.runtime import wire
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes
from worker.protocols.lease import EpochLeaseHolder


@dataclass
class _Call:
    epoch: int
    src: int
    call_id: int


@dataclass
class _Result:
    call_id: int


@dataclass
class Net:
    rng: random.Random
    workers: list[FakeWorker] = field(default_factory=list)
    #: (src, dst) → the time the channel's last message arrives (keeps each channel in order)
    busy: dict[tuple[int, int], float] = field(default_factory=dict)
    #: every report any worker sent, in order (the coordinator's view)
    reports: list[wire.Report] = field(default_factory=list)
    #: what went wrong inside the loop's callbacks (where an exception would only be logged)
    errors: list[str] = field(default_factory=list)
    t0: float = 0.0

    #: what the workers sent the coordinator (``COORD``), other than reports
    to_coordinator: list[Any] = field(default_factory=list)

    def send(self, src: int, dst: int, msg: Any) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = max(now + self.rng.uniform(0, 0.002), self.busy.get((src, dst), 0.0) + 1e-6)
        self.busy[(src, dst)] = at
        if dst == COORD:
            loop.call_at(at, self.to_coordinator.append, msg)
        else:
            loop.call_at(at, self.workers[dst].receive, src, msg)


class FakeWorker:
    """What ``EpochLeaseHolder`` asks of a worker, with an epoch's execution simulated."""

    def __init__(self, net: Net, index: int, n: int, seed: int) -> None:
        self.net = net
        self.index = index
        self.assign = SimpleNamespace(n_workers=n)
        self.rng = random.Random(seed * 1000 + index)
        self.lease = EpochLeaseHolder(self)
        self.queue = 0  # work waiting for an epoch
        self.batch = 0
        self.commits: list[tuple[int, dict[int, int], dict[int, tuple[str, str]], int | None]] = []
        self.begun: list[int] = []
        self.epoch = 0
        self.tasks: set[asyncio.Future[Any]] = set()
        self.sent = [0] * n
        self.served = [0] * n
        self.waiting: set[int] = set()  # my calls without a result yet
        self.deferred: list[_Call] = []
        self.reported = 0  # the last epoch reported
        self.done_roots = False
        self.votes: tuple[list[list[int]], list[list[Any]]] = ([], [])
        self.call_ids = 0
        #: report waiting work whatever the queue holds (the cluster never goes idle)
        self.busy = False

    # -- what EpochLeaseHolder calls ------------------------------------------------------------------------
    @property
    def n_workers(self) -> int:
        return int(self.assign.n_workers)

    def tasks_add(self, t: asyncio.Future[Any]) -> None:
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    def send_peers(self, msg: wire.Message) -> None:
        for j in range(self.assign.n_workers):
            if j != self.index:
                self.net.send(self.index, j, msg)

    def start_epoch(self, begin: wire.Begin) -> None:
        if begin.epoch <= self.epoch:
            self.net.errors.append(f"worker {self.index} began epoch {begin.epoch} after {self.epoch}")
        if self.lease.upto and begin.epoch > self.lease.upto:
            self.net.errors.append(f"worker {self.index} began epoch {begin.epoch} past its lease {self.lease.upto}")
        self.epoch = begin.epoch
        self.begun.append(begin.epoch)
        self.batch, self.queue = self.queue, 0
        n = self.assign.n_workers
        self.sent, self.served = [0] * n, [0] * n
        self.done_roots = False
        tid0 = begin.epoch * 1000 + self.index * 100
        conflicts = [[tid0 + k, tid0 - 1] for k in range(self.batch) if self.rng.random() < 0.2]
        aborts = [[tid0 + k, "UserAbort", f"w{self.index}"] for k in range(self.batch) if self.rng.random() < 0.1]
        if self.rng.random() < 0.3:  # a tid every worker may vote to abort, each with its reason
            aborts.append([begin.epoch * 1000 + 999, "UserAbort", f"w{self.index}"])
        self.votes = (conflicts, aborts)
        self.lease.began(begin.epoch)
        for call in [c for c in self.deferred if c.epoch == begin.epoch]:
            self.deferred.remove(call)
            self._serve(call)
        for j in range(n):
            if j != self.index and self.batch and self.rng.random() < 0.5:
                self.call_ids += 1
                self.sent[j] += 1
                self.waiting.add(self.call_ids)
                self.net.send(self.index, j, _Call(begin.epoch, self.index, self.call_ids))
        asyncio.get_running_loop().call_later(self.rng.uniform(0, 0.003), self._roots_done, begin.epoch)

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int], aborts: dict[int, tuple[str, str]],
                           marker: int | None) -> None:
        if epoch != self.epoch:
            self.net.errors.append(f"worker {self.index} committed epoch {epoch} in epoch {self.epoch}")
        self.queue += len([t for t in conflicts if t // 100 % 10 == self.index and t // 1000 == epoch])
        await asyncio.sleep(self.rng.uniform(0, 0.001))
        self.commits.append((epoch, dict(conflicts), dict(aborts), marker))

    # -- the simulation --------------------------------------------------------------------------
    def replayed(self, epoch: int) -> None:
        self.net.send(self.index, COORD, wire.Replayed(0, self.index, epoch))

    def _roots_done(self, epoch: int) -> None:
        if epoch == self.epoch:
            self.done_roots = True
            self._maybe_report()

    def _maybe_report(self) -> None:
        if self.done_roots and not self.waiting and self.reported < self.epoch:
            self.report()

    def report(self) -> None:
        self.reported = self.epoch
        r = wire.Report(self.epoch, self.index, self.batch, [list(c) for c in self.votes[0]],
                        [list(a) for a in self.votes[1]], list(self.sent), list(self.served),
                        max(self.queue, int(self.busy)),
                        self.lease.run)
        self.net.reports.append(r)
        self.lease.reported(r)  # (to the peers under a lease, as worker.epochs does)

    def _serve(self, call: _Call) -> None:
        self.served[call.src] += 1
        if self.rng.random() < 0.3:  # the call met a conflict here: a vote only a later report has
            self.votes[0].append([call.epoch * 1000 + call.src * 100 + 50 + call.call_id % 40, 1])
        if self.reported == self.epoch:  # served after my report: report again first
            self.report()
        self.net.send(self.index, call.src, _Result(call.call_id))

    def receive(self, src: int, msg: Any) -> None:
        if isinstance(msg, _Call):
            if msg.epoch == self.epoch:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, 0.001), self._serve_now, msg)
            else:
                if msg.epoch < self.epoch:
                    self.net.errors.append(f"worker {self.index} got a call for past epoch {msg.epoch}")
                self.deferred.append(msg)
        elif isinstance(msg, _Result):
            self.waiting.discard(msg.call_id)
            self._maybe_report()
        elif isinstance(msg, wire.Report):
            self.lease.on_report(msg)
        elif isinstance(msg, wire.Wake):
            self.lease.on_wake(msg)
        elif isinstance(msg, wire.ReplayLogged):
            self.lease.replay(msg)
        elif isinstance(msg, (wire.EpochLease, wire.Begin)):
            if isinstance(msg, wire.EpochLease):
                self.lease.grant(msg)
            else:
                self.start_epoch(msg)

    def _serve_now(self, call: _Call) -> None:
        if call.epoch != self.epoch:
            self.net.errors.append(f"worker {self.index} served a call of epoch {call.epoch} in {self.epoch}")
        self._serve(call)

    def arrive(self) -> None:
        self.queue += 1
        self.lease.work_arrived()


COORD = -1


async def _simulate(seed: int, n: int, width: int, arrivals: int, marker_at_idle: bool) -> Net:
    rng = random.Random(seed)
    net = Net(rng)
    net.workers = [FakeWorker(net, i, n, seed) for i in range(n)]
    loop = asyncio.get_running_loop()
    net.t0 = loop.time()
    run = 7 + seed

    def from_coordinator(msg: Any) -> None:
        for w in net.workers:
            at = max(loop.time() + rng.uniform(0, 0.002), net.busy.get((COORD, w.index), 0.0) + 1e-6)
            net.busy[(COORD, w.index)] = at
            loop.call_at(at, w.receive, COORD, msg)

    from_coordinator(wire.Begin(1, 0.0))
    upto = width
    from_coordinator(wire.EpochLease(upto, None, run))
    for _ in range(arrivals):
        loop.call_later(rng.uniform(0, 0.15), net.workers[rng.randrange(n)].arrive)
    # the coordinator's part: extend the lease as the workers' reports show progress
    observed = 0
    deadline = loop.time() + 20.0
    marker_epoch = None
    while loop.time() < deadline:
        await asyncio.sleep(0.001)
        latest: dict[int, dict[int, wire.Report]] = {}
        for r in net.reports:
            latest.setdefault(r.epoch, {})[r.index] = r
        while observed + 1 in latest and execution_finished(
                n, {i: (r.sent, r.served) for i, r in latest[observed + 1].items()}):
            observed += 1
        late = loop.time() > 0.2 + net.t0  # (every arrival came by 0.15 s)
        if late and marker_epoch is None and marker_at_idle:
            # (the cluster is idle by now): a round's marker on a new lease's epoch
            marker_epoch = upto = upto + 1
            from_coordinator(wire.EpochLease(upto, 99, run))
        elif upto - observed < max(1, width // 2) and observed < 400:
            upto = observed + width
            from_coordinator(wire.EpochLease(upto, None, run))
        quiet = all(w.queue == 0 and not w.tasks for w in net.workers)
        if late and quiet and (marker_epoch is None or all(
                any(c[0] == marker_epoch for c in w.commits) for w in net.workers)):
            ends = {w.commits[-1][0] if w.commits else 0 for w in net.workers}
            if len(ends) == 1 and all(w.epoch == w.commits[-1][0] for w in net.workers if w.commits):
                break
    return net


def _check(net: Net, seed: int, marker_at_idle: bool) -> None:
    ws = net.workers
    why = f"seed {seed}"
    assert not net.errors, f"{net.errors[:3]} ({why})"
    first = ws[0].commits
    assert first, f"no epoch committed ({why})"
    for w in ws[1:]:  # every worker committed the same epochs with the same votes and markers
        assert w.commits == first, f"worker {w.index} committed differently from worker 0 ({why})"
    # ... the coordinator's Commit: the merge of each epoch's final reports, in worker order
    latest: dict[int, dict[int, wire.Report]] = {}
    for r in net.reports:
        latest.setdefault(r.epoch, {})[r.index] = r
    for epoch, conflicts, aborts, _marker in first:
        reps = [latest[epoch][i] for i in sorted(latest[epoch])]
        assert (conflicts, aborts) == merge_votes((r.conflicts, r.aborts) for r in reps), f"epoch {epoch} ({why})"
    # no work left behind: every arrival ran, and the cluster ended idle
    assert all(w.queue == 0 for w in ws), f"work left waiting: {[w.queue for w in ws]} ({why})"
    last = first[-1][0]
    final = [latest[last][i] for i in sorted(latest[last])]
    assert idle_after((r.pending for r in final), merge_votes((r.conflicts, r.aborts) for r in final)[0]), why
    markers = [(e, m) for e, _c, _a, m in first if m is not None]
    assert markers == ([(markers[0][0], 99)] if marker_at_idle else []), f"{markers} ({why})"
    # epochs only begin after an idle epoch when someone had a reason (work, a marker)
    assert all(w.begun == sorted(set(w.begun)) for w in ws), why


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 4), width=st.integers(1, 9),
       arrivals=st.integers(0, 40), marker_at_idle=st.booleans())
def test_leased_workers_commit_the_coordinators_epochs(seed: int, n: int, width: int, arrivals: int,
                                                       marker_at_idle: bool) -> None:
    net = asyncio.run(asyncio.wait_for(_simulate(seed, n, width, arrivals, marker_at_idle), 30))
    _check(net, seed, marker_at_idle)


def test_a_report_or_wake_of_another_run_is_not_taken_for_this_runs() -> None:
    async def go() -> None:
        net = Net(random.Random(1))
        net.workers = [FakeWorker(net, i, 2, 1) for i in range(2)]
        w = net.workers[0]
        w.start_epoch(wire.Begin(5, 0.0))
        w.lease.grant(wire.EpochLease(10, None, 42))
        # worker 1's report of epoch 5 from an earlier run (a restarted coordinator's
        # epochs may reuse numbers): epoch 5 must not commit on it
        w.lease.on_report(wire.Report(5, 1, 0, [], [], [0, 0], [0, 0], 0, 41))
        await asyncio.sleep(0.05)
        assert w.reported == 5 and not w.commits, "committed on another run's report"
        w.lease.on_report(wire.Report(5, 1, 0, [[5100, 1]], [], [0, 0], [0, 0], 0, 42))
        await asyncio.sleep(0.05)
        assert [(c[0], c[1]) for c in w.commits] == [(5, {5100: 1})]
        # a Wake of another run does not wake an idle worker; one of this run does
        assert w.lease.idle_at == -1 and w.epoch == 6  # (a conflict: not idle, epoch 6 began)
        w.lease.on_report(wire.Report(6, 1, 0, [], [], [0, 0], [0, 0], 0, 42))
        await asyncio.sleep(0.05)
        assert w.lease.idle_at == 6 and w.epoch == 6
        w.lease.on_wake(wire.Wake(1, 7, 41))
        await asyncio.sleep(0.01)
        assert w.epoch == 6, "woken by another run's Wake"
        w.lease.on_wake(wire.Wake(1, 7, 42))
        await asyncio.sleep(0.01)
        assert w.epoch == 7
        w.lease.end_lease()  # a recovery: nothing begins on its own, whatever arrives
        w.lease.on_report(wire.Report(7, 1, 0, [], [], [0, 0], [0, 0], 0, 42))
        w.lease.on_wake(wire.Wake(1, 8, 42))
        await asyncio.sleep(0.05)
        assert w.epoch == 7 and [c[0] for c in w.commits] == [5, 6]

    asyncio.run(go())


def test_a_busy_cluster_stops_at_its_leases_end_and_an_idle_one_runs_to_a_marker_ahead() -> None:
    async def go() -> None:
        net = Net(random.Random(3))
        net.workers = [FakeWorker(net, i, 2, 3) for i in range(2)]
        for w in net.workers:
            w.busy = True
        for w in net.workers:
            w.start_epoch(wire.Begin(1, 0.0))
            w.lease.grant(wire.EpochLease(3, None, 5))
        await asyncio.sleep(0.2)
        assert [w.epoch for w in net.workers] == [3, 3], "ran past the lease (or stopped short of it)"
        assert all(w.commits[-1][0] == 3 for w in net.workers)
        for w in net.workers:
            w.busy = False
            w.lease.grant(wire.EpochLease(6, 11, 5))
        await asyncio.sleep(0.2)
        # not busy any more: idle after epoch 4, but the marker on 6 makes them run to it
        assert [w.commits[-1][0] for w in net.workers] == [6, 6]
        assert all(w.commits[-1][3] == 11 for w in net.workers), "the marker goes on the lease's last epoch"
        assert [c[3] for c in net.workers[0].commits] == [None] * 5 + [11]
        assert not net.errors, net.errors[:3]

    asyncio.run(go())


async def _replay(seed: int, n: int, epochs: list[wire.LoggedEpoch], before: int) -> Net:
    """A recovery's leased replay of ``epochs`` on ``n`` fake workers, each of which had
    committed up to epoch ``before`` under an earlier lease; the coordinator sends each
    one ``ReplayLogged`` (at random times) and waits for every ``Replayed``."""
    rng = random.Random(seed)
    net = Net(rng)
    net.workers = [FakeWorker(net, i, n, seed) for i in range(n)]
    for w in net.workers:  # (the earlier run's state: a recovery ends its lease)
        w.lease.begun = w.lease.committed = before
        w.lease.end_lease()
        w.busy = rng.random() < 0.5  # (a replay runs whatever the reports say of idleness)
    loop = asyncio.get_running_loop()
    for w in net.workers:
        loop.call_later(rng.uniform(0, 0.01), w.receive, COORD, wire.ReplayLogged(0, 5 + seed, epochs))
    deadline = loop.time() + 20.0
    while len(net.to_coordinator) < n and loop.time() < deadline:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # (nothing else may follow)
    return net


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 4), k=st.integers(1, 60), before=st.integers(0, 200))
def test_a_leased_replay_commits_every_logged_epoch_with_one_message_each_way(
        seed: int, n: int, k: int, before: int) -> None:
    """A recovery replaying ``k`` logged epochs (numbered with gaps, some below the epochs
    committed before the crash) costs the coordinator one ``ReplayLogged`` to each worker
    and one ``Replayed`` from each — O(1), not a Begin and a Commit per epoch — and every
    worker begins each logged epoch as a replay with its logged ``now``, in order, and
    commits it with the votes the coordinator's barrier would have merged."""
    rng = random.Random(seed)
    numbers = sorted(rng.sample(range(1, 400), k))
    epochs = [wire.LoggedEpoch(e, 1000.0 + e / 7) for e in numbers]
    net = asyncio.run(asyncio.wait_for(_replay(seed, n, epochs, before), 30))
    why = f"seed {seed}"
    assert not net.errors, f"{net.errors[:3]} ({why})"
    assert sorted(net.to_coordinator, key=lambda m: m.index) == [
        wire.Replayed(0, i, numbers[-1]) for i in range(n)], why
    latest: dict[int, dict[int, wire.Report]] = {}
    for r in net.reports:
        latest.setdefault(r.epoch, {})[r.index] = r
    for w in net.workers:
        assert w.begun == numbers, f"worker {w.index} began {w.begun} ({why})"
        assert [c[0] for c in w.commits] == numbers, f"worker {w.index} ({why})"
        assert w.commits == net.workers[0].commits, why
        assert all(c[3] is None for c in w.commits), "a marker in a replay"
        assert not w.lease.active and not w.lease.replaying, "the replay's lease outlived it"
    for epoch, conflicts, aborts, _m in net.workers[0].commits:
        reps = [latest[epoch][i] for i in sorted(latest[epoch])]
        assert (conflicts, aborts) == merge_votes((r.conflicts, r.aborts) for r in reps), f"epoch {epoch} ({why})"


def test_a_replay_begins_each_epoch_as_a_replay_with_its_logged_now() -> None:
    async def go() -> list[wire.Begin]:
        net = Net(random.Random(2))
        net.workers = [FakeWorker(net, i, 2, 2) for i in range(2)]
        begins: list[wire.Begin] = []
        for w in net.workers:
            start = w.start_epoch

            def spy(b: wire.Begin, start: Any = start, w: FakeWorker = w) -> None:
                if w.index == 0:
                    begins.append(b)
                start(b)
            w.start_epoch = spy  # type: ignore[method-assign]
        for w in net.workers:
            w.receive(COORD, wire.ReplayLogged(3, 9, [wire.LoggedEpoch(4, 40.5), wire.LoggedEpoch(9, 90.5)]))
        await asyncio.sleep(0.1)
        return begins

    assert asyncio.run(go()) == [wire.Begin(4, 40.5, None, True), wire.Begin(9, 90.5, None, True)]


def test_a_peers_replay_report_that_comes_before_the_replay_is_kept() -> None:
    """A peer may begin the replay and report its first epoch before this worker gets its
    ``ReplayLogged``, and that epoch may lie below the last one this worker committed
    before the recovery: the report must not be taken for a late copy and dropped (the
    replay would wait for it for ever)."""
    async def go() -> None:
        net = Net(random.Random(4))
        net.workers = [FakeWorker(net, i, 2, 4) for i in range(2)]
        w = net.workers[0]
        w.start_epoch(wire.Begin(30, 0.0))
        w.lease.grant(wire.EpochLease(40, None, 1))
        w.lease.committed = 30  # (epoch 30 committed under that lease)
        w.lease.end_lease()  # the recovery
        w.lease.on_report(wire.Report(12, 1, 0, [], [], [0, 0], [0, 0], 0, 8))
        w.receive(COORD, wire.ReplayLogged(0, 8, [wire.LoggedEpoch(12, 1.0)]))
        await asyncio.sleep(0.1)
        assert [c[0] for c in w.commits] == [12]
        assert net.to_coordinator == [wire.Replayed(0, 0, 12)]

    asyncio.run(go())
