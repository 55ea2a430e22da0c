"""What the fuzz suites drive: a small app, a worker and a coordinator built without
sockets or Kafka (their real handlers, fed through :class:`FakeChannel`), and strategies
for valid messages and records to mutate."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from hypothesis import strategies as st

from sfaas import App, Context
from sfaas.errors import ChannelClosed
from sfaas.runtime import wire
from sfaas.runtime.partitioning import default_owners
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import open_partition_stores
from worker.service import Worker

from .strategies import values

app = App("fuzzapp")
kv = app.operator("kv", store="memonly")


@kv.function
async def put(ctx: Context, value: Any) -> Any:
    ctx.put(value)
    return value


@kv.function
async def get(ctx: Context) -> Any:
    return ctx.get()


@kv.function
async def add(ctx: Context, amount: int) -> int:
    new = int(ctx.get(default=0)) + int(amount)
    ctx.put(new)
    return new


@kv.function
async def relay(ctx: Context, key: str, value: Any) -> Any:
    """Writes ``value`` under another key, wherever it lives (a call to another worker)."""
    return await ctx.call("kv", key, "put", value)


OPERATORS = ["kv", "nope", ""]
FUNCTIONS = ["put", "get", "add", "relay", "missing"]
SECRET = "fuzz-secret-0123456789"
N_WORKERS = 2
PARTITIONS = 4


class FakeChannel:
    """A :class:`sfaas.runtime.channels.Channel` stand-in: ``recv`` decodes queued frames (as the
    real one does, raising ``ProtocolError``), ``send`` records what was sent."""

    def __init__(self, frames: list[bytes] | None = None, peer: str = "fuzz-peer") -> None:
        self.frames = collections.deque(frames or [])
        self.sent: list[wire.Message] = []
        self.peer = peer
        self.closed = False

    async def recv(self) -> list[wire.Message]:
        await asyncio.sleep(0)
        if not self.frames:
            self.closed = True
            raise ChannelClosed(f"channel to {self.peer} closed: end of fuzz input")
        return wire.decode_frame(self.frames.popleft())

    def send(self, msg: wire.Message) -> None:
        if self.closed:
            raise ChannelClosed(f"channel to {self.peer} is closed")
        self.sent.append(msg)

    async def drain(self) -> None:
        await asyncio.sleep(0)

    async def wait_room(self) -> None:
        if self.closed:
            raise ChannelClosed(f"channel to {self.peer} is closed")

    def close(self) -> None:
        self.closed = True


def settings(home: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {"secret": SECRET, "snapshot_interval": 0, "home": home, "workers": N_WORKERS,
                            "partitions": PARTITIONS, "store": "memonly"}
    base.update(kw)
    return Settings.load(base, env={})


def bare_worker(home: str, index: int = 0, **kw: Any) -> Worker:
    """Worker ``index`` of ``N_WORKERS``, assigned and with open (memonly) stores, its peer
    and coordinator channels fakes: what ``Worker.run`` sets up before the epoch loop
    (``kw``: settings)."""
    w = Worker(settings(home, **kw), app, f"fuzz-{index}")
    w.state.adopt(wire.Assign(index, N_WORKERS, [["127.0.0.1", 1 + i] for i in range(N_WORKERS)], PARTITIONS,
                              "fuzz.in", "fuzz.out", "fuzz.group", default_owners(PARTITIONS, N_WORKERS)))
    w.start_engine(open_partition_stores(app, f"{home}/data", w.state.mine(), PARTITIONS))
    w.links.channels = {j: FakeChannel(peer=f"worker-{j}") for j in range(N_WORKERS) if j != index}
    w.uplink.channel = FakeChannel(peer="coordinator")
    w.calls.sent = [0] * N_WORKERS
    w.calls.served = [0] * N_WORKERS
    w.state.egress_partitions = PARTITIONS
    return w


# -- valid messages, field by field ------------------------------------------------------------

_small = st.integers(0, 5)
_int = st.one_of(_small, st.integers(-(2**63), 2**63 - 1))
_float = st.floats(allow_nan=False, allow_infinity=False)
_str = st.one_of(st.sampled_from(OPERATORS + FUNCTIONS + ["k1", "k2", "abc"]), st.text(max_size=12))

_BY_ANNOTATION: dict[str, st.SearchStrategy[Any]] = {
    "int": _int, "float": _float, "str": _str, "bool": st.booleans(), "Any": values(),
    "bytes": st.binary(max_size=64), "list[str]": st.lists(_str, max_size=3),
    "int | None": st.one_of(st.none(), _int), "list[int]": st.lists(_small, max_size=3),
    "bool | None": st.one_of(st.none(), st.booleans()),
    "bytes | None": st.one_of(st.none(), st.binary(max_size=64)),
    # (mostly absent or valid — a Call's trace context — and one in ten any string: the
    # inputs that reach the handler's work must stay a steady share, tests.fuzz.outcomes)
    "str | None": st.integers(0, 9).flatmap(lambda n: _str if n == 0 else st.none() if n < 6 else st.just(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")),
    "list[Any]": st.lists(values(6), max_size=4), "list[list[int]]": st.lists(st.lists(_int, max_size=3), max_size=3),
    "list[list[Any]]": st.lists(st.lists(values(4), max_size=3), max_size=3),
    "dict[int, int]": st.dictionaries(_small, _int, max_size=3),
    "dict[int, list[int]]": st.dictionaries(_small, st.lists(_int, max_size=3), max_size=3),
    "dict[str, Any]": st.dictionaries(_str, st.tuples(st.booleans(), values(3)).map(list),
                                      max_size=3),
}
# fields of rows (``list[Row]``): the rows of the fields without an entry in _ROWS below
_BY_ANNOTATION.update({
    f"list[{row}]": _BY_ANNOTATION["list[list[Any]]"] for row in ("Peer", "StoreVersion", "Source")
})
_ROWS: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("Assign", "peers"): st.lists(st.tuples(_str, _int, _int).map(list), max_size=3),
    ("Recover", "peers"): st.lists(st.tuples(_str, _int, _int).map(list), max_size=3),
    ("Report", "conflicts"): st.lists(st.tuples(_int, _int).map(list), max_size=3),
    ("Report", "aborts"): st.lists(st.tuples(_int, _str, _str).map(list), max_size=3),
    ("Commit", "conflicts"): st.lists(st.tuples(_int, _int).map(list), max_size=3),
    ("Commit", "aborts"): st.lists(st.tuples(_int, _str, _str).map(list), max_size=3),
    ("Snapshotted", "stores"): st.lists(st.tuples(_str, _int, _int, _int, _int).map(list), max_size=3),
    ("Snapshotted", "retries"): st.lists(st.tuples(_int, _int, _int, _float, st.just({})).map(list), max_size=3),
    ("Reassign", "retries"): st.lists(st.tuples(_int, _int, _int, _float, st.just({})).map(list), max_size=3),
    ("Recovered", "epochs"): st.lists(st.tuples(_int, _float).map(list), max_size=3),
    ("ReplayLogged", "epochs"): st.lists(st.tuples(_int, _float).map(list), max_size=3),
    ("Heartbeat", "slow"): st.lists(st.tuples(_str, _str, _str, _float, _int, _float, _float,
                                              _float, _float, _float, _int, st.booleans(), _int,
                                              _str).map(list), max_size=2),
    ("Call", "args"): st.lists(values(4), max_size=3),
    ("Call", "operator"): st.sampled_from(OPERATORS),
    ("Call", "function"): st.sampled_from(FUNCTIONS),
    ("Call", "src"): st.sampled_from([1] * 12 + [0, 2, 3, -1]),
    ("Call", "epoch"): st.one_of(st.integers(0, 3), st.integers(0, 3), _int),
    ("Call", "recovery"): st.one_of(st.just(0), st.just(0), _int),
    ("Call", "depth"): st.one_of(st.integers(0, 3), _int),
    ("Result", "value"): st.one_of(values(), st.tuples(_str, _str).map(list)),
    ("Report", "sent"): st.lists(_small, min_size=N_WORKERS, max_size=N_WORKERS),
    ("Report", "served"): st.lists(_small, min_size=N_WORKERS, max_size=N_WORKERS),
}


def message_fields(cls: type[wire.Message]) -> st.SearchStrategy[list[Any]]:
    """Plausible field values of ``cls`` (mostly valid; some deliberately out of range)."""
    import dataclasses

    parts = [_ROWS[(cls.__name__, f.name)] if (cls.__name__, f.name) in _ROWS else _BY_ANNOTATION[str(f.type)]
             for f in dataclasses.fields(cls)]
    return st.tuples(*parts).map(list)


MESSAGE_CLASSES = sorted({cls for cls in wire._TAGS.values()}, key=lambda c: c.TAG)


_RESULT = st.one_of(st.tuples(_int, st.just(True), values()),
                    st.tuples(_int, st.just(False), st.tuples(_str, _str).map(list))).map(lambda f: wire.Result(*f))


def message_of(classes: list[type[wire.Message]]) -> st.SearchStrategy[wire.Message]:
    def one(cls: type[wire.Message]) -> st.SearchStrategy[wire.Message]:
        if cls is wire.Result:
            return _RESULT
        return message_fields(cls).map(lambda f: cls(*f))

    return st.sampled_from(classes).flatmap(one)


def frames_of(classes: list[type[wire.Message]]) -> st.SearchStrategy[bytes]:
    """Valid frames (one to four messages of ``classes``)."""
    return st.lists(message_of(classes), min_size=1, max_size=4).map(wire.encode_frame)


@st.composite
def raw_message_lists(draw: st.DrawFn, classes: list[type[wire.Message]]) -> list[Any]:
    """A frame's message list, the way the decoder sees it: ``[[tag, field, ...], ...]``."""
    from .strategies import wrong_fields

    out = []
    for _ in range(draw(st.integers(1, 3))):
        cls = draw(st.sampled_from(classes))
        fields = draw(st.one_of(message_fields(cls), wrong_fields(message_fields(cls))))
        out.append([cls.TAG, *fields])
    return out


def bare_coordinator(home: str) -> Any:
    """A coordinator with worker 0 registered and ready and slot 1 lost (so a registrant
    takes it), at epoch 3, with snapshot round 1 in flight: what ``Coordinator.run`` sets
    up before its epoch loop, minus sockets and Kafka. Rounds publish to a directory."""
    import time

    from coordinator.protocols.rounds import _InFlight
    from coordinator.service import Coordinator
    from coordinator.state import Member
    from remotes import PathRemote
    from sfaas.runtime.protocols.rounds import Rounds

    c = Coordinator(settings(home, snapshot_interval=1.0, snapshot_retain=2), app.name)
    c.state.configure(PARTITIONS, N_WORKERS, [])
    rounds = c.rounds
    rounds._rounds_remote = lambda: PathRemote(f"{home}/rounds")
    rounds._store_remote = lambda op, p: PathRemote(f"{home}/stores/{op}/p{p}")
    rounds._rounds = Rounds(PathRemote(f"{home}/rounds"))
    rounds._next_id = 2
    rounds._inflight = _InFlight(1, 3, time.time(), rounds._clock.monotonic())
    m0 = Member(0, "w0", "127.0.0.1", 1, 1, FakeChannel(peer="w0"))  # type: ignore[arg-type]
    m0.ready.set()
    m1 = Member(1, "w1", "127.0.0.1", 2, 2, FakeChannel(peer="w1"),  # type: ignore[arg-type]
                alive=False)
    c.state.add_member(m0)
    c.state.add_member(m1)  # every slot taken: the cluster formed
    c.state.reach_epoch(3)
    return c


class EchoPeer(FakeChannel):
    """Worker 1 as worker 0 sees it: answers every call at once with its first argument."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(peer="worker-1")
        self.worker = worker

    def send(self, msg: wire.Message) -> None:
        super().send(msg)
        if isinstance(msg, wire.Call):
            value = msg.args[0] if msg.args else None
            asyncio.get_running_loop().call_soon(self._answer, msg.call_id, value)

    def _answer(self, call_id: int, value: Any) -> None:
        fut = self.worker.calls._calls.get(call_id)
        if fut is not None and not fut.done():
            fut.set_result((True, value))


async def run_epochs(w: Worker, first: int = 1, limit: int = 20) -> int:
    """Drive ``w`` like a coordinator would (Begin, its Report, Commit) until its queue and
    re-runs are empty; returns the epochs run."""
    from sfaas.runtime.txn.loop import merge_votes

    loop = w.state.loop
    assert loop is not None
    coord: FakeChannel = w.uplink.channel
    epoch = first
    for epoch in range(first, first + limit):
        if not loop.pending:
            return epoch - first
        coord.sent.clear()
        begin = wire.Begin(epoch, 1000.0 + epoch)
        t0 = w.epochs.begin(begin)  # what a Begin from the coordinator does
        if t0 is not None:
            await w.epochs.execute(begin, t0)
        reports = [m for m in coord.sent if isinstance(m, wire.Report)]
        conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports[-1:])
        await w.commits.commit(wire.Commit(epoch, [wire.Conflict(t, b) for t, b in conflicts.items()],
                                          [wire.Aborted(t, e, r) for t, (e, r) in aborts.items()],
                                      False, None))
    raise AssertionError(f"work left after {limit} epochs")
