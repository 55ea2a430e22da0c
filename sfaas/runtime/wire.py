"""Every frame exchanged between coordinator, workers and clients, as small dataclasses.

TCP frames (see :mod:`sfaas.runtime.channels`) carry a msgpack list of messages, each encoded as
``[TAG, field, field, ...]``. Kafka records carry one request or reply, also msgpack. The
decoder checks tags, arities and the type of every field (from the dataclass
annotations, plus the exact shape of list rows such as ``[tid, blocker]``), so a
malformed frame raises :class:`ProtocolError` — and a malformed request
:class:`~sfaas.errors.BadRequest` — instead of reaching the runtime; values nest at most
``codec.MAX_NESTING`` deep and a request or call carries at most ``codec.MAX_ARGS``
arguments. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from sfaas.errors import BadRequest, SfaasError
from sfaas.runtime.codec import MAX_ARGS, MAX_NESTING, too_deep

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
    "reply_address",
    "MAX_RID",
]

#: Longest request id a request record may carry (clients use ~40 characters).
MAX_RID = 256

_brief_repr = reprlib.Repr()
_brief_repr.maxlevel = 3
_brief_repr.maxstring = 40
_brief_repr.maxother = 40


def _brief(value: Any) -> str:
    """A short repr of hostile input (bounded in length and depth: never recurses deeply)."""
    return _brief_repr.repr(value)


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
    :mod:`sfaas.runtime.partitioning`)."""

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
    """Worker → coordinator (and, under a ``Lease``, → every peer): my view of epoch ``epoch`` (sent when my roots finished, and
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
    run: int = 0  # the leased run it belongs to (``Lease.run``); 0: not leased


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
class Lease(Message):
    """Coordinator → workers: begin and commit epochs up to ``upto`` yourselves (see
    ``worker.protocols.lease``): each worker sends its Reports to its peers too, commits an epoch once
    every peer's report is in and the counters show no call in flight, and begins the next
    unless the reports say the cluster is idle. With ``marker`` set, epoch ``upto``
    commits with that snapshot round's marker. Leases only grow within a ``run`` (the
    coordinator's random id of a leased run, which every leased Report and Wake carries: a
    message from an earlier run — before a recovery, or a restarted coordinator — is stale)."""

    TAG: ClassVar[int] = 6
    upto: int
    marker: int | None
    run: int


@dataclass(slots=True)
class Wake(Message):
    """Worker → peers, under a lease: I begin epoch ``epoch`` after an idle commit (work
    arrived, or a round's marker lies ahead); begin it too."""

    TAG: ClassVar[int] = 7
    index: int
    epoch: int
    run: int


@dataclass(slots=True)
class Wakeup(Message):
    """Worker → coordinator: I have work though I last reported none."""

    TAG: ClassVar[int] = 9
    index: int


@dataclass(slots=True)
class Heartbeat(Message):
    """Worker → coordinator: still alive (with counters for ``sfaas ps``). ``latency``: the
    worker's request-latency histogram so far (counts per ``sfaas.runtime.metrics.LATENCY_BOUNDS``
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
    requests waiting to re-run at the cut, as ``[tid, partition, offset, now]`` (``now``:
    their first run's ``ctx.now()``, which re-runs keep). ``epoch_log``:
    one past this worker's newest epoch-log record at the cut (records of later epochs
    come after it; see ``sfaas.runtime.epochlog``). ``error``:
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
    retries: list[list[Any]]
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


# -- rescaling (coordinator.protocols.rescale, worker.protocols.rescale) -------------------------------------------


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
    above it (``skip``) and its waiting re-runs (``retries``: ``[tid, partition, offset, now]``)
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
    retries: list[list[Any]]


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
    #: a call of the cross-worker fallback phase (``worker.protocols.fallback``), not of the
    #: epoch's execution: served once the receiver's phase began, outside the counters
    fallback: bool = False


@dataclass(slots=True)
class Finished(Message):
    """Worker → every peer: the fallback phase's re-run of ``tid`` (a root of ``src``) is
    over; apply its writes if ``committed``, then let the higher tids waiting for it go on."""

    TAG: ClassVar[int] = 30
    epoch: int
    src: int
    tid: int
    committed: bool
    recovery: int


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


# -- field checks (what decode_frame accepts) ---------------------------------------------------

_Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_float(v: Any) -> bool:
    return type(v) is int or (type(v) is float and math.isfinite(v))


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_value(v: Any) -> bool:
    return not too_deep(v, MAX_NESTING)


def _opt(check: _Check) -> _Check:
    return lambda v: v is None or check(v)


def _list_of(check: _Check) -> _Check:
    return lambda v: type(v) is list and all(map(check, v))


def _row(*checks: _Check) -> _Check:
    n = len(checks)
    return lambda v: type(v) is list and len(v) == n and all(c(x) for c, x in zip(checks, v, strict=True))


def _dict_of(key: _Check, value: _Check) -> _Check:
    return lambda v: type(v) is dict and all(key(k) and value(x) for k, x in v.items())


#: field annotation → check (every annotation a message uses must be here)
_BY_ANNOTATION: dict[str, _Check] = {
    "int": _is_int,
    "float": _is_float,
    "str": _is_str,
    "bool": _is_bool,
    "Any": _is_value,
    "int | None": _opt(_is_int),
    "list[int]": _list_of(_is_int),
    "list[Any]": lambda v: type(v) is list and _is_value(v),
    "list[list[int]]": _list_of(_list_of(_is_int)),
    "list[list[Any]]": lambda v: type(v) is list and all(type(x) is list for x in v) and _is_value(v),
    "dict[int, int]": _dict_of(_is_int, _is_int),
    "dict[int, list[int]]": _dict_of(_is_int, _list_of(_is_int)),
}
#: exact shapes of list rows, where the annotation says only ``list[list[...]]``
_ROWS: dict[tuple[str, str], _Check] = {
    ("Assign", "peers"): _list_of(_row(_is_str, _is_int)),
    ("Recover", "peers"): _list_of(_row(_is_str, _is_int)),
    ("Report", "conflicts"): _list_of(_row(_is_int, _is_int)),
    ("Report", "aborts"): _list_of(_row(_is_int, _is_str, _is_str)),
    ("Commit", "conflicts"): _list_of(_row(_is_int, _is_int)),
    ("Commit", "aborts"): _list_of(_row(_is_int, _is_str, _is_str)),
    ("Snapshotted", "stores"): _list_of(_row(_is_str, _is_int, _is_int, _is_int, _is_int)),
    ("Snapshotted", "retries"): _list_of(_row(_is_int, _is_int, _is_int, _is_float)),
    ("Recovered", "epochs"): _list_of(_row(_is_int, _is_float)),
    ("Shipped", "seqs"): _list_of(_row(_is_str, _is_int, _is_int)),
    ("Move", "sources"): _list_of(_row(_is_str, _is_int, _list_of(_is_int))),
    ("Move", "seqs"): _list_of(_row(_is_str, _is_int, _is_int)),
    ("Reassign", "peers"): _list_of(_row(_is_str, _is_int)),
    ("Reassign", "retries"): _list_of(_row(_is_int, _is_int, _is_int, _is_float)),
}


def _field_checks(cls: type[Message]) -> list[tuple[str, _Check]]:
    out = []
    for f in dataclasses.fields(cls):
        check = _ROWS.get((cls.__name__, f.name)) or _BY_ANNOTATION.get(str(f.type))
        if check is None:  # a new message with a new field type: say what to add, at import
            raise TypeError(f"wire: no decode check for {cls.__name__}.{f.name}: {f.type}; add one to _BY_ANNOTATION")
        out.append((f.name, check))
    return out


_CHECKS = {tag: _field_checks(cls) for tag, cls in _TAGS.items()}


def _check_message(msg: Message) -> None:
    """Checks across fields, after every field has its type."""
    if isinstance(msg, Result) and not msg.ok and not _row(_is_str, _is_str)(msg.value):
        raise ProtocolError(f"a failed Result carries [error_type, reason], got {_brief(msg.value)}")
    if isinstance(msg, Call) and len(msg.args) > MAX_ARGS:
        raise ProtocolError(f"Call of {_brief(msg.function)} has {len(msg.args)} arguments, more than {MAX_ARGS}")
    if isinstance(msg, Report) and len(msg.sent) != len(msg.served):
        raise ProtocolError(f"Report sent/served counters differ in length ({len(msg.sent)}, {len(msg.served)})")
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


def encode_message(message: Message) -> bytes:
    """One message packed on its own: :func:`join_frame` of such parts is the payload
    :func:`encode_frame` gives for the messages (a channel packs as it queues)."""
    return msgpack.packb(_to_list(message), use_bin_type=True)  # type: ignore[no-any-return]


_ARRAY = msgpack.Packer()


def join_frame(parts: list[bytes]) -> bytes:
    """The frame payload of messages packed by :func:`encode_message`."""
    return _ARRAY.pack_array_header(len(parts)) + b"".join(parts)


def decode_frame(payload: bytes) -> list[Message]:
    """Inverse of :func:`encode_frame`; raises :class:`ProtocolError` on anything unexpected."""
    try:
        items = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(items, list):
        raise ProtocolError(f"frame must be a list of messages, got {type(items).__name__}")
    out: list[Message] = []
    for item in items:
        if not isinstance(item, list) or not item or type(item[0]) is not int:
            raise ProtocolError(f"message must be [tag, fields...], got {_brief(item)}")
        cls = _TAGS.get(item[0])
        if cls is None:
            raise ProtocolError(f"unknown message tag {item[0]}")
        fields = item[1:]
        if len(fields) != _NFIELDS[item[0]]:
            raise ProtocolError(f"{cls.__name__} needs {_NFIELDS[item[0]]} fields, got {len(fields)}")
        for (name, check), value in zip(_CHECKS[item[0]], fields, strict=True):
            if not check(value):
                raise ProtocolError(f"{cls.__name__}.{name} has the wrong type or shape: {_brief(value)}")
        msg = cls(*fields)
        _check_message(msg)
        out.append(msg)
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
            raise BadRequest(f"request record is not msgpack: {type(exc).__name__}: {exc}") from None
        if not isinstance(fields, list) or len(fields) != 7:
            raise BadRequest(f"request record must be a 7-element list, got {_brief(fields)}")
        rid, op, key, fn, args, part, sent = fields
        if type(rid) is not str or not 0 < len(rid) <= MAX_RID:
            raise BadRequest(f"request id must be a str of 1 to {MAX_RID} characters, got {_brief(rid)}")
        if type(part) is not int or part < 0:
            raise BadRequest(f"request {rid}: reply partition must be an int >= 0, got {_brief(part)}")
        for what, name in (("operator", op), ("key", key), ("function", fn)):
            if type(name) is not str:
                raise BadRequest(f"request {rid}: {what} must be a str, got {_brief(name)}")
        if type(args) is not list:
            raise BadRequest(f"request {rid}: args must be a list, got {type(args).__name__}")
        if len(args) > MAX_ARGS:
            raise BadRequest(f"request {rid}: {len(args)} arguments, more than the limit of {MAX_ARGS} (MAX_ARGS)")
        if too_deep(args, MAX_NESTING):
            raise BadRequest(f"request {rid}: arguments nest more than {MAX_NESTING} levels deep (MAX_NESTING)")
        if sent is not None and not _is_float(sent):
            raise BadRequest(f"request {rid}: sent_at must be a number, got {_brief(sent)}")
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
            raise ProtocolError(f"reply record must be a 5-element list, got {_brief(fields)}")
        rid, ok, value, error_type, reason = fields
        if type(rid) is not str or type(ok) is not bool:
            raise ProtocolError(f"reply id/ok malformed: {_brief(rid)} {_brief(ok)}")
        if not (error_type is None or type(error_type) is str) or not (reason is None or type(reason) is str):
            raise ProtocolError(f"reply {rid}: error type/reason must be str or nil, got {_brief(error_type)} {_brief(reason)}")
        if too_deep(value, MAX_NESTING):
            raise ProtocolError(f"reply {rid}: value nests more than {MAX_NESTING} levels deep")
        return cls(rid, ok, value, error_type, reason)


def reply_address(data: bytes) -> tuple[str, int] | None:
    """``(request id, reply partition)`` of a request record that :meth:`Request.decode`
    refused, when it names them well enough to answer it with an error reply; else None."""
    try:
        fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        return None
    if not isinstance(fields, list) or len(fields) < 6:
        return None
    rid, part = fields[0], fields[5]
    if type(rid) is not str or not 0 < len(rid) <= MAX_RID or type(part) is not int or part < 0:
        return None
    return rid, part
