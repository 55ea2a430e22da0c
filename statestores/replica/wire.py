"""The replication messages and their one codec (``FORMAT.md`` § "Replication messages").

A follower opens a stream with :class:`Hello`; the primary's shipper answers with
:class:`EditMsg` and :class:`MarkMsg` messages in the store's own order, each followed
by the bodies of the files it flags ``body``. Every message is one msgpack list whose
first element names its type; :func:`decode` checks every field and raises
:class:`ProtocolError` naming what was wrong, never returning a half-valid message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import StoreError
from ..version import KINDS, FileEntry

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ReplicationError",
    "ProtocolError",
    "ShippedFile",
    "Hello",
    "EditMsg",
    "MarkMsg",
    "Ack",
    "Tip",
    "Message",
    "encode",
    "decode",
    "files_of",
    "bodies_of",
    "after",
]

#: Largest encoded message (a base edit of a store with ~100,000 files fits).
MAX_MESSAGE_BYTES = 16 << 20


class ReplicationError(StoreError):
    """A replica could not follow its source (the message says why)."""


class ProtocolError(ReplicationError):
    """A peer sent bytes that are not a valid replication message."""


@dataclass(frozen=True)
class ShippedFile:
    """One file of an edit or mark: its entry, size and crc32c; ``body``: its bytes follow."""

    entry: FileEntry
    size: int
    crc: int
    body: bool = True


@dataclass(frozen=True)
class Hello:
    """A follower (re)opening a stream: what it holds, so the shipper sends only the rest."""

    store: str
    have_seq: int
    have_mark: int  # the newest snapshot id it holds, -1 for none
    have_files: tuple[str, ...] = ()
    origin: str = ""  # the shipper lineage it followed ("" for none)
    #: a base edit brings only the live files, not the newest snapshot's (a replica that
    #: will be promoted to a later snapshot, e.g. a partition moving in a rescale)
    live_only: bool = False


@dataclass(frozen=True)
class EditMsg:
    """Version edit ``seq``: removed names first, then ``added`` (only files a replica
    stores: runs, segments, hints, dumps). ``base``: the version is exactly ``added``."""

    seq: int
    added: tuple[ShippedFile, ...] = ()
    removed: tuple[str, ...] = ()
    base: bool = False
    origin: str = ""  # on a base edit: the shipper's lineage, for resuming later


@dataclass(frozen=True)
class MarkMsg:
    """Snapshot ``snapshot_id`` holds exactly ``files``; every edit up to ``seq`` precedes it."""

    snapshot_id: int
    seq: int
    files: tuple[ShippedFile, ...] = ()


@dataclass(frozen=True)
class Ack:
    """The follower installed everything up to edit ``seq`` and mark ``mark``."""

    seq: int
    mark: int


@dataclass(frozen=True)
class Tip:
    """A heartbeat: the shipper has sent everything up to edit ``seq`` and mark ``mark``
    (a follower that holds less lost a message and reopens the stream)."""

    seq: int
    mark: int


Message = Hello | EditMsg | MarkMsg | Ack | Tip

def files_of(msg: EditMsg | MarkMsg) -> tuple[ShippedFile, ...]:
    """The files an edit adds or a mark names."""
    return msg.added if isinstance(msg, EditMsg) else msg.files


def bodies_of(msg: EditMsg | MarkMsg) -> list[tuple[str, int]]:
    """``(name, size)`` of the bodies that follow ``msg``, in order."""
    return [(f.entry.name, f.size) for f in files_of(msg) if f.body]


def after(hello: Hello, msg: EditMsg | MarkMsg) -> Hello:
    """Where a follower standing at ``hello`` stands once it installed ``msg``, as its
    ``Follower._apply`` does: a duplicate (an edit at or below its version, a base of its
    own lineage there, a mark it holds) changes nothing. ``have_files`` follows the
    installed messages; a transport that cannot know them passes ``()``, which claims less."""
    have = set(hello.have_files)
    if isinstance(msg, MarkMsg):
        if msg.snapshot_id <= hello.have_mark:
            return hello
        have.update(f.entry.name for f in msg.files)
        return dataclasses.replace(hello, have_mark=msg.snapshot_id, have_files=tuple(sorted(have)))
    if msg.seq <= hello.have_seq and (not msg.base or msg.origin == hello.origin):
        return hello
    if msg.base:
        return dataclasses.replace(hello, have_seq=msg.seq, origin=msg.origin,
                                   have_files=tuple(sorted(f.entry.name for f in msg.added)))
    have.difference_update(msg.removed)
    have.update(f.entry.name for f in msg.added)
    return dataclasses.replace(hello, have_seq=msg.seq, have_files=tuple(sorted(have)))


_TAGS = {Hello: "hello", EditMsg: "edit", MarkMsg: "mark", Ack: "ack", Tip: "tip"}


def _file(f: ShippedFile) -> list[Any]:
    return [f.entry.name, f.entry.kind, f.entry.level, f.size, f.crc, f.body]


def encode(msg: Message) -> bytes:
    """``msg`` as bytes (a msgpack list: type tag, then the fields in declaration order)."""
    if isinstance(msg, Hello):
        body: list[Any] = [
            msg.store, msg.have_seq, msg.have_mark, list(msg.have_files), msg.origin, msg.live_only,
        ]
    elif isinstance(msg, EditMsg):
        body = [msg.seq, [_file(f) for f in msg.added], list(msg.removed), msg.base, msg.origin]
    elif isinstance(msg, MarkMsg):
        body = [msg.snapshot_id, msg.seq, [_file(f) for f in msg.files]]
    elif isinstance(msg, (Ack, Tip)):
        body = [msg.seq, msg.mark]
    else:
        raise TypeError(f"not a replication message: {type(msg).__name__}")
    return msgpack.packb([_TAGS[type(msg)], *body], use_bin_type=True)  # type: ignore[no-any-return]


def _int(v: Any, what: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or v >= 1 << 63:
        raise ProtocolError(f"{what} must be an int >= {lo}, got {v!r:.40}")
    return v


def _name(v: Any, what: str) -> str:
    if (
        not isinstance(v, str)
        or not v
        or "/" in v
        or "\\" in v
        or v in (".", "..")
        or len(v) > 255
        or "\0" in v
    ):
        raise ProtocolError(f"{what} must be a plain file name, got {v!r:.60}")
    return v


def _origin(v: Any, what: str) -> str:
    if not isinstance(v, str) or len(v) > 64:
        raise ProtocolError(f"{what} must be a str of at most 64 characters, got {v!r:.40}")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise ProtocolError(f"{what} must be a list, got {type(v).__name__}")
    return v


def _files(v: Any, what: str) -> tuple[ShippedFile, ...]:
    out = []
    for i, f in enumerate(_list(v, what)):
        f = _list(f, f"{what}[{i}]")
        if len(f) != 6 or f[1] not in KINDS or not isinstance(f[5], bool):
            raise ProtocolError(
                f"{what}[{i}] must be [name, kind, level, size, crc, body], got {f!r:.80}"
            )
        entry = FileEntry(_name(f[0], f"{what}[{i}] name"), f[1], _int(f[2], f"{what}[{i}] level"))
        out.append(
            ShippedFile(
                entry, _int(f[3], f"{what}[{i}] size"), _int(f[4], f"{what}[{i}] crc"), f[5]
            )
        )
    return tuple(out)


def decode(data: bytes) -> Message:
    """Inverse of :func:`encode`; :class:`ProtocolError` for anything else."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            f"message of {len(data)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"
        )
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise ProtocolError(f"message is not msgpack: {exc}") from None
    raw = _list(raw, "message")
    if not raw or not isinstance(raw[0], str):
        raise ProtocolError(f"message must start with its type tag, got {raw[:1]!r:.40}")
    tag, body = raw[0], raw[1:]
    shapes = {"hello": 6, "edit": 5, "mark": 3, "ack": 2, "tip": 2}
    if tag not in shapes:
        raise ProtocolError(f"unknown message type {tag!r:.40}; expected one of {sorted(shapes)}")
    if len(body) != shapes[tag]:
        raise ProtocolError(f"{tag} message has {len(body)} fields, expected {shapes[tag]}")
    if tag == "hello":
        store = body[0]
        if not isinstance(store, str) or not store or len(store) > 255:
            raise ProtocolError(f"hello store must be a non-empty str, got {store!r:.40}")
        files = tuple(_name(n, "hello have_files") for n in _list(body[3], "hello have_files"))
        origin = _origin(body[4], "hello origin")
        if not isinstance(body[5], bool):
            raise ProtocolError(f"hello live_only must be a bool, got {body[5]!r:.20}")
        return Hello(
            store, _int(body[1], "hello have_seq"), _int(body[2], "hello have_mark", -1), files,
            origin, body[5],
        )
    if tag == "edit":
        if not isinstance(body[3], bool):
            raise ProtocolError(f"edit base must be a bool, got {body[3]!r:.20}")
        removed = tuple(_name(n, "edit removed") for n in _list(body[2], "edit removed"))
        origin = _origin(body[4], "edit origin")
        return EditMsg(
            _int(body[0], "edit seq"), _files(body[1], "edit added"), removed, body[3], origin
        )
    if tag == "mark":
        return MarkMsg(
            _int(body[0], "mark snapshot_id"), _int(body[1], "mark seq"),
            _files(body[2], "mark files"),
        )
    cls = Ack if tag == "ack" else Tip
    return cls(_int(body[0], f"{tag} seq"), _int(body[1], f"{tag} mark", -1))
