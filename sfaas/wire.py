"""Every frame exchanged between coordinator, workers and clients, as small dataclasses.

TCP frames (see :mod:`sfaas.channels`) carry a msgpack list of messages, each encoded as
``[TAG, field, field, ...]``. Kafka records carry one request or reply, also msgpack. The
decoder checks tags and arities, so a malformed frame raises :class:`ProtocolError`
instead of reaching the runtime; nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from .errors import BadRequest, SfaasError

__all__ = [
    "ProtocolError",
    "Message",
    "Register",
    "Assign",
    "Ready",
    "Begin",
    "Report",
    "Commit",
    "Wakeup",
    "Heartbeat",
    "Stop",
    "Snapshotted",
    "Follow",
    "Promote",
    "Recover",
    "Recovered",
    "Scale",
    "Scaled",
    "Ship",
    "Shipped",
    "Move",
    "Following",
    "Release",
    "Released",
    "Reassign",
    "Hold",
    "Hello",
    "Call",
    "Result",
    "encode_frame",
    "decode_frame",
    "Request",
    "Reply",
]


class ProtocolError(SfaasError):
    """A frame or record did not decode into a known message."""


@dataclass(slots=True)
class Message:
    """Base of all TCP messages; subclasses set a unique ``TAG``."""

    TAG: ClassVar[int] = 0


# -- coordinator <-> worker ------------------------------------------------------------------


@dataclass(slots=True)
class Register(Message):
    """Worker → coordinator: I am ``name``, my peers reach me at ``host:port``; ``index``:
    the slot I held before (re-registering with a restarted coordinator, or a promoted
    standby taking its primary's slot), or -1. ``standby_of``: I ask to be a standby of that
    slot (-1: any role). ``repl_port``: where standbys follow my stores (0: not shipping)."""

    TAG: ClassVar[int] = 1
    name: str
    host: str
    port: int
    pid: int
    index: int = -1
    standby_of: int = -1
    repl_port: int = 0


@dataclass(slots=True)
class Assign(Message):
    """Coordinator → worker: your index, the membership, the topics and partition count.
    ``owners``: the partition map (``owners[p]`` = index owning partition ``p``; see
    :mod:`sfaas.partitioning`)."""

    TAG: ClassVar[int] = 2
    index: int
    n_workers: int
    peers: list[list[Any]]  # [host, port] per worker index
    partitions: int
    ingress_topic: str
    egress_topic: str
    group: str
    owners: list[int]


@dataclass(slots=True)
class Ready(Message):
    """Worker → coordinator: peers connected, Kafka ready."""

    TAG: ClassVar[int] = 3
    index: int


@dataclass(slots=True)
class Begin(Message):
    """Coordinator → workers: run epoch ``epoch``.

    ``marker``: unused on Begin (rounds ride ``Commit.marker``). ``replay``: re-run the
    epoch from the epoch log (each worker's batch as logged) during a recovery.
    """

    TAG: ClassVar[int] = 4
    epoch: int
    now: float
    marker: int | None = None
    replay: bool = False


@dataclass(slots=True)
class Report(Message):
    """Worker → coordinator: my view of epoch ``epoch`` (sent when my roots finished, and
    again after every call I served later, *before* its result goes back).

    ``sent[j]``/``served[j]`` count calls this worker sent to / finished serving for worker
    ``j`` this epoch. The epoch's execution is over when every worker reported and, for all
    pairs, ``sent_i[j] == served_j[i]``: then no call is in flight anywhere, and the latest
    reports hold every conflict. This saves the round trip of a separate vote phase.
    """

    TAG: ClassVar[int] = 5
    epoch: int
    index: int
    roots: int  # root transactions this worker ran this epoch
    conflicts: list[list[int]]  # [tid, blocker]
    aborts: list[list[Any]]  # [tid, error_type, reason]
    sent: list[int]
    served: list[int]
    pending: int  # requests waiting for a later epoch


@dataclass(slots=True)
class Commit(Message):
    """Coordinator → workers: the union of the reports' conflicts and aborts; commit the rest.

    ``idle``: no worker reported waiting work (the next epoch starts on a Wakeup).
    """

    TAG: ClassVar[int] = 8
    epoch: int
    conflicts: list[list[int]]  # [tid, blocker]
    aborts: list[list[Any]]
    idle: bool
    marker: int | None = None


@dataclass(slots=True)
class Wakeup(Message):
    """Worker → coordinator: I have work though I last reported none."""

    TAG: ClassVar[int] = 9
    index: int


@dataclass(slots=True)
class Heartbeat(Message):
    """Worker → coordinator: still alive (with counters for ``sfaas ps``). ``latency``: the
    worker's request-latency histogram so far (counts per ``sfaas.metrics.LATENCY_BOUNDS``
    bucket, the last above them all) for the coordinator's status page."""

    TAG: ClassVar[int] = 10
    index: int
    committed: int
    latency: list[int] = dataclasses.field(default_factory=list)


@dataclass(slots=True)
class Stop(Message):
    """Coordinator → worker: shut down cleanly."""

    TAG: ClassVar[int] = 11
    reason: str


@dataclass(slots=True)
class Snapshotted(Message):
    """Worker → coordinator: my part of snapshot round ``round`` (sent once its uploads ended).

    ``stores``: ``[operator, partition, bytes uploaded, files, bytes of the snapshot]`` per
    store (each store's snapshot id is the round). ``ingress``: per owned partition, the
    first offset whose request is *not* in the snapshot's state (replay starts there);
    ``skip``: per partition, the offsets above that one whose requests *are* in the state
    (they completed while an earlier request waited to re-run; replay skips them).
    ``egress``: per egress partition, an offset at or before the first reply produced after
    the cut (a de-duplicating scan starts there). ``retries``: the conflict-aborted
    requests waiting to re-run at the cut, as ``[tid, partition, offset]``. ``epoch_log``:
    one past this worker's newest epoch-log record at the cut (records of later epochs
    come after it; see ``sfaas.epochlog``). ``error``:
    empty, or why this worker's part failed (the round then fails; the next one retries).
    """

    TAG: ClassVar[int] = 12
    round: int
    index: int
    epoch: int
    stores: list[list[Any]]
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    egress: dict[int, int]
    retries: list[list[int]]
    epoch_log: int
    error: str


@dataclass(slots=True)
class Follow(Message):
    """Coordinator → a standby: follow the stores of worker ``index`` (of ``n_workers``,
    ``partitions`` partitions), shipped from ``host:port``. Sent again when that primary
    was replaced (a new address)."""

    TAG: ClassVar[int] = 15
    index: int
    n_workers: int
    partitions: int
    host: str
    port: int


@dataclass(slots=True)
class Promote(Message):
    """Coordinator → a standby: worker ``index`` died; become it. ``round``: the newest
    complete snapshot round (its files are local: the recovery restores without a download)."""

    TAG: ClassVar[int] = 16
    index: int
    round: int


@dataclass(slots=True)
class Recover(Message):
    """Coordinator → every worker: roll back to snapshot round ``round`` (0: the empty
    state before any round) and prepare to replay the epoch log after it.

    ``peers``: the current membership (a replaced worker has a new address). ``attempt``
    numbers recoveries, so a report of an abandoned one is recognised.
    """

    TAG: ClassVar[int] = 13
    attempt: int
    round: int
    peers: list[list[Any]]
    #: the partition map to recover under (it changes with a rescale)
    owners: list[int]


@dataclass(slots=True)
class Recovered(Message):
    """Worker → coordinator: rolled back for recovery ``attempt``; ``epochs``: the logged
    epochs after the round as ``[epoch, now]`` (to replay in order); ``error``: empty or
    why this worker could not recover (the coordinator then retries)."""

    TAG: ClassVar[int] = 14
    attempt: int
    index: int
    epochs: list[list[Any]]
    error: str


# -- rescaling (coordinator.rescale, worker.moving) -------------------------------------------


@dataclass(slots=True)
class Scale(Message):
    """Operator (``sfaas scale``) → coordinator, as the first message on a channel: run
    ``workers`` workers. Answered with :class:`Scaled` once done (or refused)."""

    TAG: ClassVar[int] = 17
    workers: int


@dataclass(slots=True)
class Scaled(Message):
    """Coordinator → operator: the rescale ended (``ok``) or why not (``detail``)."""

    TAG: ClassVar[int] = 18
    ok: bool
    detail: str


@dataclass(slots=True)
class Ship(Message):
    """Coordinator → a worker: ship the stores of ``partitions`` (they are moving away);
    answered with :class:`Shipped`."""

    TAG: ClassVar[int] = 19
    partitions: list[int]


@dataclass(slots=True)
class Shipped(Message):
    """Worker → coordinator: shipping; ``seqs`` = ``[operator, partition, version]`` of each
    store now (a receiver is caught up once its follower holds that version)."""

    TAG: ClassVar[int] = 23
    index: int
    seqs: list[list[Any]]


@dataclass(slots=True)
class Move(Message):
    """Coordinator → a receiving worker: follow the stores of the partitions moving to you.
    ``sources``: ``[host, repl_port, [partitions]]`` per shipping worker; ``seqs`` as in
    :class:`Shipped`. ``index``: the receiver's slot after the move (a joining worker's
    first message). Answered with :class:`Following` once caught up."""

    TAG: ClassVar[int] = 24
    index: int
    n_workers: int
    sources: list[list[Any]]
    seqs: list[list[Any]]


@dataclass(slots=True)
class Following(Message):
    """Receiver → coordinator: caught up with every moving store (``error``: why not)."""

    TAG: ClassVar[int] = 25
    index: int
    error: str


@dataclass(slots=True)
class Release(Message):
    """Coordinator → every worker, at an epoch boundary right after snapshot round
    ``round`` completed: close the stores and ingress of every partition ``owners`` no
    longer gives you. Answered with :class:`Released`."""

    TAG: ClassVar[int] = 26
    round: int
    owners: list[int]


@dataclass(slots=True)
class Released(Message):
    """Worker → coordinator: the partitions moving away are closed here."""

    TAG: ClassVar[int] = 27
    index: int
    error: str


@dataclass(slots=True)
class Reassign(Message):
    """Coordinator → every worker of the new membership: take over at round ``round``.

    Your slot is ``index`` of ``n_workers`` at ``peers``, the map is ``owners``. For each
    partition you gain, the round's ingress watermark (``ingress``), the completed offsets
    above it (``skip``) and its waiting re-runs (``retries``: ``[tid, partition, offset]``)
    say where its requests resume. Answered with ``Ready``.
    """

    TAG: ClassVar[int] = 28
    round: int
    index: int
    n_workers: int
    peers: list[list[Any]]
    owners: list[int]
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    retries: list[list[int]]


@dataclass(slots=True)
class Hold(Message):
    """Coordinator → receiving workers: round ``round`` is the switch's; stop following
    the moving stores once they hold it (what the old owners write or merge after it will
    not be needed)."""

    TAG: ClassVar[int] = 29
    round: int


# -- worker <-> worker -------------------------------------------------------------------------


@dataclass(slots=True)
class Hello(Message):
    """First message on a peer channel: the sender's worker index."""

    TAG: ClassVar[int] = 20
    index: int


@dataclass(slots=True)
class Call(Message):
    """Run ``operator.function(key, *args)`` for transaction ``tid`` and answer with a Result.

    ``recovery``: how many recoveries the sender went through; a call made before a
    recovery the receiver already went through is stale (its epoch is being replayed) and
    is dropped.
    """

    TAG: ClassVar[int] = 21
    epoch: int
    src: int
    call_id: int
    tid: int
    now: float
    operator: str
    key: str
    function: str
    args: list[Any]
    depth: int
    recovery: int = 0


@dataclass(slots=True)
class Result(Message):
    """The outcome of a Call: ``ok`` and the value, or ``[error_type, reason]``."""

    TAG: ClassVar[int] = 22
    call_id: int
    ok: bool
    value: Any


_TAGS: dict[int, type[Message]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, Message) and _cls is not Message:
        assert _cls.TAG not in _TAGS, _cls
        _TAGS[_cls.TAG] = _cls
_NFIELDS = {tag: len(dataclasses.fields(cls)) for tag, cls in _TAGS.items()}
# attrgetter per class: dataclasses.fields() is far too slow for the hot path
_GETTERS = {
    cls: operator.attrgetter(*(f.name for f in dataclasses.fields(cls))) for cls in _TAGS.values()
}


def _to_list(msg: Message) -> list[Any]:
    values = _GETTERS[type(msg)](msg)
    if type(values) is not tuple:  # a single field
        return [msg.TAG, values]
    return [msg.TAG, *values]


def encode_frame(messages: list[Message]) -> bytes:
    """One frame's payload holding ``messages``."""
    return msgpack.packb([_to_list(m) for m in messages], use_bin_type=True)  # type: ignore[no-any-return]


def decode_frame(payload: bytes) -> list[Message]:
    """Inverse of :func:`encode_frame`; raises :class:`ProtocolError` on anything unexpected."""
    try:
        items = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from None
    if not isinstance(items, list):
        raise ProtocolError(f"frame must be a list of messages, got {type(items).__name__}")
    out: list[Message] = []
    for item in items:
        if not isinstance(item, list) or not item or not isinstance(item[0], int):
            raise ProtocolError(f"message must be [tag, fields...], got {item!r:.80}")
        cls = _TAGS.get(item[0])
        if cls is None:
            raise ProtocolError(f"unknown message tag {item[0]}")
        fields = item[1:]
        if len(fields) != _NFIELDS[item[0]]:
            raise ProtocolError(f"{cls.__name__} needs {_NFIELDS[item[0]]} fields, got {len(fields)}")
        out.append(cls(*fields))
    return out


# -- Kafka records ---------------------------------------------------------------------------


@dataclass(slots=True)
class Request:
    """A client request on the ingress topic."""

    rid: str
    operator: str
    key: str
    function: str
    args: list[Any]
    reply_partition: int
    sent_at: float

    def encode(self) -> bytes:
        """The record value."""
        return msgpack.packb(  # type: ignore[no-any-return]
            [self.rid, self.operator, self.key, self.function, self.args, self.reply_partition, self.sent_at],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes) -> Request:
        """Parse a record value; raises :class:`BadRequest` naming what is wrong."""
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise BadRequest(f"request record is not msgpack: {exc}") from None
        if not isinstance(fields, list) or len(fields) != 7:
            raise BadRequest(f"request record must be a 7-element list, got {fields!r:.80}")
        rid, op, key, fn, args, part, sent = fields
        if not isinstance(rid, str) or not isinstance(part, int):
            raise BadRequest(f"request id/reply partition malformed: {rid!r:.40} {part!r:.20}")
        if not isinstance(args, list):
            raise BadRequest(f"request {rid}: args must be a list, got {type(args).__name__}")
        return cls(rid, op, key, fn, args, part, float(sent or 0.0))


@dataclass(slots=True)
class Reply:
    """A worker's reply on the egress topic: a result, or an error type and reason."""

    rid: str
    ok: bool
    value: Any
    error_type: str | None = None
    reason: str | None = None

    def encode(self) -> bytes:
        """The record value."""
        return msgpack.packb(  # type: ignore[no-any-return]
            [self.rid, self.ok, self.value, self.error_type, self.reason], use_bin_type=True
        )

    @classmethod
    def decode(cls, data: bytes) -> Reply:
        """Parse a record value; raises :class:`ProtocolError` if malformed."""
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise ProtocolError(f"reply record is not msgpack: {exc}") from None
        if not isinstance(fields, list) or len(fields) != 5:
            raise ProtocolError(f"reply record must be a 5-element list, got {fields!r:.80}")
        return cls(*fields)
