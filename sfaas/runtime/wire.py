"""The codec of every frame exchanged between coordinator, workers and clients.

The messages are small dataclasses declared by protocol, each protocol in its module of
``sfaas.runtime.protocols`` (``membership``, ``epochs``, ``lease``, ``rounds``, ``recovery``,
``standby``, ``rescale``, ``calls``); this module registers their tags, re-exports them
(``wire.Begin`` names the same class as ``protocols.epochs.Begin``), and encodes and
decodes them.

TCP frames (see :mod:`sfaas.runtime.channels`) carry a msgpack list of messages, each
encoded as ``[TAG, field, field, ...]``. Kafka records carry one request or reply, also
msgpack. The decoder checks tags, arities and the type of every field (from the dataclass
annotations; a field of rows, ``list[Row]`` with ``Row`` a ``NamedTuple``, must hold rows
of exactly ``Row``'s shape and decodes into ``Row``s), so a malformed frame raises
:class:`ProtocolError` — and a malformed request :class:`~sfaas.errors.BadRequest` —
instead of reaching the runtime; values nest at most ``codec.MAX_NESTING`` deep and a
request or call carries at most ``codec.MAX_ARGS`` arguments. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import reprlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgpack

from sfaas.errors import BadRequest, SfaasError
from sfaas.runtime.codec import MAX_ARGS, MAX_NESTING, too_deep
from sfaas.runtime.protocols.base import Message
from sfaas.runtime.protocols.calls import Call, EffectDone, Finished, Hello, Result
from sfaas.runtime.protocols.epochs import Aborted, Begin, Commit, Conflict, Report, Wakeup
from sfaas.runtime.protocols.ingress import Acked, Answer, Submit
from sfaas.runtime.protocols.lease import EpochLease, Wake
from sfaas.runtime.protocols.membership import (
    Alive,
    Assign,
    Heartbeat,
    Peer,
    Ready,
    Register,
    SlowRequest,
    Stop,
)
from sfaas.runtime.protocols.reads import Placement, Read, ReadReply, Where
from sfaas.runtime.protocols.recovery import (
    Diverged,
    LoggedEpoch,
    PeerBroken,
    Recover,
    Recovered,
    Replayed,
    ReplayLogged,
)
from sfaas.runtime.protocols.rescale import (
    Following,
    Hold,
    Move,
    Reassign,
    Release,
    Released,
    Scale,
    Scaled,
    Ship,
    Shipped,
    Source,
    StoreVersion,
)
from sfaas.runtime.protocols.rounds import Retry, Snapshotted, StoreCut
from sfaas.runtime.protocols.standby import Follow, Promote

__all__ = [
    "ProtocolError", "Message", "MESSAGES",
    # membership
    "Register", "Assign", "Ready", "Heartbeat", "Alive", "Stop", "Peer", "SlowRequest",
    # epochs, and leased epochs
    "Begin", "Report", "Commit", "Wakeup", "Conflict", "Aborted", "EpochLease", "Wake",
    # snapshot rounds, recovery, standbys
    "Snapshotted", "StoreCut", "Retry", "Recover", "Recovered", "LoggedEpoch", "Diverged", "Follow",
    "Promote", "ReplayLogged", "Replayed", "PeerBroken",
    # rescaling
    "Scale", "Scaled", "Ship", "Shipped", "Move", "Following", "Release", "Released",
    "Reassign", "Hold", "StoreVersion", "Source",
    # worker <-> worker
    "Hello", "Call", "Finished", "Result", "EffectDone",
    # direct state reads, direct ingress
    "Where", "Placement", "Read", "ReadReply", "Submit", "Answer", "Acked",
    # the codec
    "encode_frame", "encode_message", "join_frame", "decode_frame", "Request", "Reply",
    "reply_address", "MAX_RID", "FENCE",
]

#: Every message class, by protocol (each ``TAG`` unique).
MESSAGES: tuple[type[Message], ...] = (
    Register, Assign, Ready, Heartbeat, Alive, Stop,
    Begin, Report, Commit, Wakeup, EpochLease, Wake,
    Snapshotted, Recover, Recovered, Diverged, Follow, Promote, ReplayLogged, Replayed,
    PeerBroken,
    Scale, Scaled, Ship, Shipped, Move, Following, Release, Released, Reassign, Hold,
    Hello, Call, Finished, Result, EffectDone,
    Where, Placement, Read, ReadReply, Submit, Answer, Acked,
)

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


_TAGS: dict[int, type[Message]] = {}
for _cls in MESSAGES:
    assert _cls.TAG not in _TAGS, _cls
    _TAGS[_cls.TAG] = _cls
_NFIELDS = {tag: len(dataclasses.fields(cls)) for tag, cls in _TAGS.items()}
#: the fewest fields a message of each tag may have on the wire (``Message.OPTIONAL``)
_MIN_FIELDS = {tag: _NFIELDS[tag] - cls.OPTIONAL for tag, cls in _TAGS.items()}


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


def _is_bytes(v: Any) -> bool:
    return type(v) is bytes


def _is_value(v: Any) -> bool:
    return not too_deep(v, MAX_NESTING)


def _is_values(v: Any) -> bool:
    return type(v) is list and _is_value(v)


def _opt(check: _Check) -> _Check:
    return lambda v: v is None or check(v)


def _list_of(check: _Check) -> _Check:
    return lambda v: type(v) is list and all(map(check, v))


def _row(*checks: _Check) -> _Check:
    n = len(checks)
    return lambda v: type(v) is list and len(v) == n and all(
        c(x) for c, x in zip(checks, v, strict=True))


def _dict_of(key: _Check, value: _Check) -> _Check:
    return lambda v: type(v) is dict and all(key(k) and value(x) for k, x in v.items())


_SCALARS: dict[Any, _Check] = {
    int: _is_int, float: _is_float, str: _is_str, bool: _is_bool, bytes: _is_bytes,
    Any: _is_value,
}


def _is_row_type(tp: Any) -> bool:
    """Whether ``tp`` is a row class (a ``NamedTuple``)."""
    return isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields")


def _check_of(tp: Any, where: str) -> _Check:
    """The check of a value of type ``tp`` (a field's, or a row field's, annotation)."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return _opt(_check_of(next(a for a in args if a is not type(None)), where))
    if origin is list and args == (Any,):
        return _is_values
    if origin is list and _is_row_type(args[0]):
        hints = get_type_hints(args[0])
        return _list_of(_row(*(_check_of(hints[f], where) for f in args[0]._fields)))
    if origin is list:
        return _list_of(_check_of(args[0], where))
    if origin is dict:
        return _dict_of(_check_of(args[0], where), _check_of(args[1], where))
    # a new message with a new field type: say what to add, at import
    raise TypeError(f"wire: no decode check for {where}: {tp}; add one to _check_of")


def _field_checks(cls: type[Message]) -> list[tuple[str, _Check]]:
    hints = get_type_hints(cls)
    return [(f.name, _check_of(hints[f.name], f"{cls.__name__}.{f.name}"))
            for f in dataclasses.fields(cls)]


def _row_fields(cls: type[Message]) -> list[tuple[int, Callable[[Any], tuple[Any, ...]]]]:
    """``(position, row maker)`` of each field of rows: decoded rows become that row class."""
    hints = get_type_hints(cls)
    out = []
    for i, f in enumerate(dataclasses.fields(cls)):
        tp = hints[f.name]
        if get_origin(tp) is list and _is_row_type(get_args(tp)[0]):
            out.append((i, get_args(tp)[0]._make))
    return out


_CHECKS = {tag: _field_checks(cls) for tag, cls in _TAGS.items()}
_ROWS = {tag: _row_fields(cls) for tag, cls in _TAGS.items()}


def _check_message(msg: Message) -> None:
    """Checks across fields, after every field has its type."""
    if isinstance(msg, Result) and not msg.ok and not _row(_is_str, _is_str)(msg.value):
        raise ProtocolError(
            f"a failed Result carries [error_type, reason], got {_brief(msg.value)}")
    if isinstance(msg, Call) and len(msg.args) > MAX_ARGS:
        raise ProtocolError(f"Call of {_brief(msg.function)} has {len(msg.args)} arguments, "
                            f"more than {MAX_ARGS}")
    if isinstance(msg, Report) and len(msg.sent) != len(msg.served):
        raise ProtocolError("Report sent/served counters differ in length "
                            f"({len(msg.sent)}, {len(msg.served)})")
    if isinstance(msg, Call) and msg.traceparent is not None \
            and not _is_traceparent(msg.traceparent):
        raise ProtocolError("Call.traceparent must be a W3C traceparent (00-<32 hex>-<16 "
                            f"hex>-<2 hex>, at most {MAX_TRACEPARENT} characters), got "
                            f"{_brief(msg.traceparent)}")


# attrgetter per class (dataclasses.fields() is far too slow for the hot path), and whether
# the class has a single field (its getter then returns the value, not a tuple of values)
_GETTERS = {
    cls: (operator.attrgetter(*(f.name for f in dataclasses.fields(cls))),
          len(dataclasses.fields(cls)) == 1)
    for cls in _TAGS.values()
}


# of a class with optional last fields (``Message.OPTIONAL``): their names, last first, and
# the getter of the fields up to each of them (the message without the trailing None ones)
# (at least two fields stay: a getter of one returns the value, not a tuple)
_SHORTER = {
    cls: [(fields[i].name, operator.attrgetter(*(g.name for g in fields[:i])))
          for i in range(len(fields) - 1, len(fields) - 1 - cls.OPTIONAL, -1)]
    for cls in _TAGS.values() if cls.OPTIONAL
    for fields in [dataclasses.fields(cls)] if len(fields) - cls.OPTIONAL >= 2
}
assert set(_SHORTER) == {cls for cls in _TAGS.values() if cls.OPTIONAL}


def _to_list(msg: Message) -> list[Any]:
    get, single = _GETTERS[type(msg)]
    if msg.OPTIONAL:  # (the trailing optional fields that are None are left out)
        for name, shorter in _SHORTER[type(msg)]:
            if getattr(msg, name) is not None:
                break
            get = shorter
    values = get(msg)
    return [msg.TAG, values] if single else [msg.TAG, *values]


def encode_frame(messages: list[Message]) -> bytes:
    """One frame's payload holding ``messages``."""
    payload: bytes = msgpack.packb([_to_list(m) for m in messages], use_bin_type=True)
    return payload


def encode_message(message: Message) -> bytes:
    """One message packed on its own: :func:`join_frame` of such parts is the payload
    :func:`encode_frame` gives for the messages (a channel packs as it queues)."""
    part: bytes = msgpack.packb(_to_list(message), use_bin_type=True)
    return part


_ARRAY = msgpack.Packer()


def join_frame(parts: list[bytes]) -> bytes:
    """The frame payload of messages packed by :func:`encode_message`."""
    header: bytes = _ARRAY.pack_array_header(len(parts))
    return header + b"".join(parts)


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
        if not _MIN_FIELDS[item[0]] <= len(fields) <= _NFIELDS[item[0]]:
            optional = cls.OPTIONAL and f" (the last {cls.OPTIONAL} optional)"
            raise ProtocolError(f"{cls.__name__} needs {_NFIELDS[item[0]]} fields"
                                f"{optional or ''}, got {len(fields)}")
        for (name, check), value in zip(_CHECKS[item[0]], fields, strict=False):
            if not check(value):
                raise ProtocolError(
                    f"{cls.__name__}.{name} has the wrong type or shape: {_brief(value)}")
        for i, make in _ROWS[item[0]]:
            fields[i] = list(map(make, fields[i]))
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
    #: the caller's idempotency key (``Client.call(..., idempotency_key=…)``): a second
    #: request with the same (operator, key, function, idempotency key) gets the first's
    #: outcome without running (``sfaas.runtime.txn.internal``)
    idempotency_key: str | None = None
    #: the caller's W3C trace context (``traceparent``, ``sfaas.runtime.tracing``): the
    #: worker's span of this request joins the caller's trace
    traceparent: str | None = None

    def encode(self) -> bytes:
        """The record value (an eighth element only with an idempotency key or a trace
        context, a ninth only with a trace context)."""
        fields = [self.rid, self.operator, self.key, self.function, self.args,
                  self.reply_partition, self.sent_at]
        if self.idempotency_key is not None or self.traceparent is not None:
            fields.append(self.idempotency_key)
        if self.traceparent is not None:
            fields.append(self.traceparent)
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, data: bytes) -> Request:
        """Parse a record value; raises :class:`BadRequest` naming what is wrong."""
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise BadRequest(
                f"request record is not msgpack: {type(exc).__name__}: {exc}") from None
        if not isinstance(fields, list) or len(fields) not in (7, 8, 9):
            raise BadRequest(f"request record must be a 7- to 9-element list, got "
                             f"{_brief(fields)}")
        rid, op, key, fn, args, part, sent, idem, trace = (*fields, None, None)[:9]
        if type(rid) is not str or not 0 < len(rid) <= MAX_RID:
            raise BadRequest(
                f"request id must be a str of 1 to {MAX_RID} characters, got {_brief(rid)}")
        if type(part) is not int or part < 0:
            raise BadRequest(
                f"request {rid}: reply partition must be an int >= 0, got {_brief(part)}")
        for what, name in (("operator", op), ("key", key), ("function", fn)):
            if type(name) is not str:
                raise BadRequest(f"request {rid}: {what} must be a str, got {_brief(name)}")
        if type(args) is not list:
            raise BadRequest(f"request {rid}: args must be a list, got {type(args).__name__}")
        if len(args) > MAX_ARGS:
            raise BadRequest(f"request {rid}: {len(args)} arguments, more than the limit of "
                             f"{MAX_ARGS} (MAX_ARGS)")
        if too_deep(args, MAX_NESTING):
            raise BadRequest(f"request {rid}: arguments nest more than {MAX_NESTING} levels deep "
                             "(MAX_NESTING)")
        if sent is not None and not _is_float(sent):
            raise BadRequest(f"request {rid}: sent_at must be a number, got {_brief(sent)}")
        if idem is not None and (type(idem) is not str or not 0 < len(idem) <= MAX_RID):
            raise BadRequest(f"request {rid}: the idempotency key must be a str of 1 to "
                             f"{MAX_RID} characters, got {_brief(idem)}")
        if trace is not None and not _is_traceparent(trace):
            raise BadRequest(f"request {rid}: traceparent must be a W3C traceparent "
                             f"(00-<32 hex>-<16 hex>-<2 hex>), got {_brief(trace)}")
        return cls(rid, op, key, fn, args, part, float(sent or 0.0), idem, trace)


#: Longest ``traceparent`` a request may carry: version 00's is 55 characters; a later
#: version may append fields (the W3C rule), which a reader ignores.
MAX_TRACEPARENT = 256
_HEX = frozenset("0123456789abcdef")


def _is_traceparent(v: Any) -> bool:
    """Whether ``v`` is a W3C ``traceparent`` this codec passes on: version, trace id,
    parent id and flags in lower-case hex, separated by ``-``."""
    if type(v) is not str or not 55 <= len(v) <= MAX_TRACEPARENT:
        return False
    parts = v[:55].split("-")
    return [len(p) for p in parts] == [2, 32, 16, 2] and all(set(p) <= _HEX for p in parts) \
        and (len(v) == 55 or v[55] == "-")


#: The value of a fence record in the egress topic (FORMAT.md, "Requests and replies"): a
#: record a recovering worker writes in a transaction it aborts, to learn where the
#: partition's committed replies end (``worker.egress.Egress.fence``). A
#: ``read_committed`` reader never sees one; any other reader skips it.
FENCE = b""


@dataclass(slots=True)
class Reply:
    """A worker's reply on the egress topic: a result, or an error type and reason."""

    rid: str
    ok: bool
    value: Any
    error_type: str | None = None
    reason: str | None = None
    #: the traceback of the exception a function raised (setting ``reply_tracebacks``)
    traceback: str | None = None

    def encode(self) -> bytes:
        """The record value (a sixth element only when there is a traceback)."""
        fields = [self.rid, self.ok, self.value, self.error_type, self.reason]
        if self.traceback is not None:
            fields.append(self.traceback)
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, data: bytes) -> Reply:
        """Parse a record value; raises :class:`ProtocolError` if malformed."""
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise ProtocolError(f"reply record is not msgpack: {exc}") from None
        if not isinstance(fields, list) or len(fields) not in (5, 6):
            raise ProtocolError(f"reply record must be a 5- or 6-element list, got "
                                f"{_brief(fields)}")
        rid, ok, value, error_type, reason, tb = fields if len(fields) == 6 else (*fields, None)
        if not (tb is None or type(tb) is str):
            raise ProtocolError(f"reply {rid}: traceback must be str or nil, got {_brief(tb)}")
        if type(rid) is not str or type(ok) is not bool:
            raise ProtocolError(f"reply id/ok malformed: {_brief(rid)} {_brief(ok)}")
        if not (error_type is None or type(error_type) is str) \
                or not (reason is None or type(reason) is str):
            raise ProtocolError(f"reply {rid}: error type/reason must be str or nil, got "
                                f"{_brief(error_type)} {_brief(reason)}")
        if too_deep(value, MAX_NESTING):
            raise ProtocolError(f"reply {rid}: value nests more than {MAX_NESTING} levels deep")
        return cls(rid, ok, value, error_type, reason, tb)


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
