"""The ``path`` transport: the primary writes its stream into a directory the standby reads.

Nothing runs for the follower on the primary's side and the follower never talks to the
primary (the RubbleDB way): a :class:`PathSink` thread beside the :class:`Shipper` writes
each message into ``directory`` (a mount both machines share) and a :class:`PathSource`
reads it there. One sink and one follower per directory.

Directory layout::

    slot-0000 … slot-NNNN   body slots, created up front and reused by name
    edits/<n:020d>.msg      message n (written as ``.msg.tmp``, then renamed: published)
    tip                     the sink's stream and heartbeat          (sink writes)
    ack                     the follower's progress or restart request (follower writes)
    sink.lock               held by the running sink

Every file but the slots is one *record*: ``magic (4 bytes) | u32 crc32c(payload) |
u32 len(payload) | payload`` (little endian; crc32c of ``statestores.checksum``), the
payload one msgpack list:

* ``.msg`` (magic ``SFPM``): ``[epoch: str, n: int, msg: bin, slots: map]`` — ``msg`` is
  the edit or mark as :func:`~.wire.encode` writes it; ``slots`` maps each body-flagged
  file name to ``[slot: int, offset: int]``: its ``size`` bytes (the message's field) are
  at ``offset`` of ``slot-<slot:04d>``. The slots are written (and closed) before the
  message is renamed into place, so a published message's bodies are complete.
* ``tip`` (``SFPT``): ``[store: str, epoch: str, first: int, last: int, seq: int,
  mark: int]`` — the sink serves stream ``epoch``, which started at message ``first``;
  messages up to ``last`` are published; ``seq``/``mark`` is the shipper's newest
  :class:`~.wire.Tip` (``seq = -1``: none yet). Rewritten atomically.
* ``ack`` (``SFPA``): ``[epoch: str, n: int, seq: int, mark: int, origin: str,
  restart: bin | nil]`` — the follower installed message ``n`` of stream ``epoch`` and
  then stood at ``seq``/``mark``/``origin``; with ``restart`` (an encoded
  :class:`~.wire.Hello`, ``n = 0``) it asks for a new stream ``epoch`` from there.
  Rewritten atomically.

Safety. A slot is written only when no unacknowledged message names it, and at most
``slots`` messages are unacknowledged; the sink deletes acknowledged messages. A new
source whose follower stands where the ack says continues the stream; any other open —
older state (a restored replica, a crash between install and ack), or a retry after the
follower rejected a message — writes a restart request under a fresh epoch. The sink then
drops every unconsumed message (the follower reads only its new epoch, so their slots are
free), restarts
:meth:`Shipper.stream` from the request's hello (a base edit if needed) and announces the
epoch in ``tip``. A new sink on an existing directory adopts the ack's epoch and keeps
the published messages after it, numbering on, so a follower mid-stream goes on reading
(one still waiting for the stream starts at the first kept message); its own stream
starts where the follower will stand once it installed them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import struct
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack

from ..checksum import crc32c
from ..errors import LockedError
from ..fs import FileSystem
from . import wire
from .shipper import Delivery, Shipper
from .source import Received
from .wire import (
    MAX_MESSAGE_BYTES,
    EditMsg,
    Hello,
    MarkMsg,
    ProtocolError,
    ReplicationError,
    Tip,
    bodies_of,
)

__all__ = ["PathSink", "PathSource"]

log = logging.getLogger("statestores.replica")

_HEAD = struct.Struct("<4sII")
_MSG, _TIP, _ACK = b"SFPM", b"SFPT", b"SFPA"
_MAX_RECORD = 2 * MAX_MESSAGE_BYTES
_CHUNK = 1 << 20
_fs = FileSystem()


# ---------------------------------------------------------------------- records


def _pack(magic: bytes, fields: list[Any]) -> bytes:
    payload: bytes = msgpack.packb(fields, use_bin_type=True)
    return _HEAD.pack(magic, crc32c(payload), len(payload)) + payload


def _load(path: str, magic: bytes, shape: tuple[Any, ...]) -> list[Any] | None:
    """The fields of the record at ``path`` (``shape``: each one's type), None if there is
    no such file; :class:`ProtocolError` naming the file if it is not that record."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_RECORD + 1)
    except FileNotFoundError:
        return None
    got, crc, size = _HEAD.unpack_from(data) if len(data) >= _HEAD.size else (b"", 0, -1)
    payload = data[_HEAD.size:]
    if got != magic or size != len(payload) or crc32c(payload) != crc:
        raise ProtocolError(
            f"{path}: bad magic, length or crc32c (expected a {magic.decode()} record)"
        )
    try:
        fields = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise ProtocolError(f"{path}: the payload is not msgpack: {exc}") from None
    if (
        not isinstance(fields, list)
        or len(fields) != len(shape)
        or any(
            not isinstance(v, t) or (isinstance(v, bool) and t is int)
            for v, t in zip(fields, shape, strict=False)
        )
    ):
        raise ProtocolError(
            f"{path}: expected {len(shape)} fields of types {shape}, got {fields!r:.100}"
        )
    return fields


@dataclasses.dataclass(frozen=True)
class _Published:
    epoch: str
    n: int
    msg: EditMsg | MarkMsg
    slots: dict[str, tuple[int, int]]  # body name → (slot, offset)


@dataclasses.dataclass(frozen=True)
class _TipRec:
    store: str
    epoch: str
    first: int
    last: int
    seq: int  # -1: no heartbeat from the shipper yet on this epoch
    mark: int


@dataclasses.dataclass(frozen=True)
class _AckRec:
    epoch: str
    n: int
    seq: int
    mark: int
    origin: str
    restart: Hello | None = None


_FRESH = _AckRec("", 0, 0, -1, "")  # what a directory without an ack means


def _msg_path(directory: str, n: int) -> str:
    return os.path.join(directory, "edits", f"{n:020d}.msg")


def _slot_path(directory: str, slot: int) -> str:
    return os.path.join(directory, f"slot-{slot:04d}")


def _read_msg(path: str) -> _Published | None:
    fields = _load(path, _MSG, (str, int, bytes, dict))
    if fields is None:
        return None
    epoch, n, body, slots = fields
    msg = wire.decode(body)
    if not isinstance(msg, (EditMsg, MarkMsg)):
        raise ProtocolError(f"{path}: holds a {type(msg).__name__}, expected an edit or mark")
    where: dict[str, tuple[int, int]] = {}
    for name, _size in bodies_of(msg):
        at = slots.get(name)
        if not (
            isinstance(at, list) and len(at) == 2 and all(isinstance(v, int) and v >= 0 for v in at)
        ):
            raise ProtocolError(
                f"{path}: body {name!r} needs a [slot, offset] of ints >= 0, got {at!r:.40}"
            )
        where[name] = (at[0], at[1])
    return _Published(epoch, n, msg, where)


def _read_tip(directory: str) -> _TipRec | None:
    fields = _load(os.path.join(directory, "tip"), _TIP, (str, str, int, int, int, int))
    return None if fields is None else _TipRec(*fields)


def _read_ack(directory: str) -> _AckRec | None:
    path = os.path.join(directory, "ack")
    fields = _load(path, _ACK, (str, int, int, int, str, (bytes, type(None))))
    if fields is None:
        return None
    epoch, n, seq, mark, origin, restart = fields
    hello = wire.decode(restart) if restart is not None else None
    if hello is not None and not isinstance(hello, Hello):
        raise ProtocolError(
            f"{path}: a restart request must hold a hello, got {type(hello).__name__}"
        )
    return _AckRec(epoch, n, seq, mark, origin, hello)


def _write_ack(directory: str, ack: _AckRec) -> None:
    restart = wire.encode(ack.restart) if ack.restart is not None else None
    data = _pack(_ACK, [ack.epoch, ack.n, ack.seq, ack.mark, ack.origin, restart])
    _fs.write_file_atomic(os.path.join(directory, "ack"), data, sync=False)


def _copy(src: str, offset: int, size: int, fd: int, at: int) -> None:
    """``size`` bytes of ``src`` from ``offset`` to ``fd`` at ``at``; short: ProtocolError."""
    with open(src, "rb") as f:
        f.seek(offset)
        done = 0
        while done < size:
            chunk = f.read(min(_CHUNK, size - done))
            if not chunk:
                raise ProtocolError(
                    f"{src} ends {size - done} bytes short of a {size}-byte body at {offset}"
                )
            os.pwrite(fd, chunk, at + done)
            done += len(chunk)


# ---------------------------------------------------------------------- the primary's side


class _Switch(Exception):
    """The follower asked for another stream (``args[0]``: its ack) while the sink waited."""


class PathSink:
    """Writes ``shipper``'s stream into ``directory`` for one :class:`PathSource` (see the
    module docstring). ``slots``: body slot files, and the most unacknowledged messages;
    ``slot_bytes_hint``: bytes to reserve in each slot up front (and keep); ``sync``:
    fsync slots and messages before publishing (for mounts that need it)."""

    def __init__(
        self, shipper: Shipper, directory: str | os.PathLike[str], *, slots: int = 64,
        slot_bytes_hint: int | None = None, sync: bool = False, idle: float = 0.05,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 9999:
            raise ValueError(f"slots must be an int in [1, 9999], got {slots!r}")
        if slot_bytes_hint is not None and (
            not isinstance(slot_bytes_hint, int) or slot_bytes_hint < 0
        ):
            raise ValueError(
                f"slot_bytes_hint must be None or an int >= 0, got {slot_bytes_hint!r}"
            )
        self.shipper, self.slots, self.hint, self.sync, self.idle = (
            shipper, slots, slot_bytes_hint or 0, sync, idle,
        )
        self.directory = os.path.abspath(os.fspath(directory))
        os.makedirs(os.path.join(self.directory, "edits"), exist_ok=True)
        try:
            self._lock_fd = _fs.lock(os.path.join(self.directory, "sink.lock"))
        except LockedError:
            raise ReplicationError(
                f"{self.directory}: another PathSink is writing into it"
            ) from None
        for i in range(slots):  # up front, so a full disk shows now, not mid-stream
            with open(_slot_path(self.directory, i), "ab") as f:
                if self.hint and os.fstat(f.fileno()).st_size < self.hint:
                    os.posix_fallocate(f.fileno(), 0, self.hint)
        self._stop = threading.Event()
        self._published: dict[int, tuple[str, tuple[int, ...]]] = {}  # n → (epoch, slots it uses)
        self._epoch, self._acked, self._next, self._first, self._last = "", 0, 1, 1, 0
        self._hello = Hello(shipper.name, 0, -1)
        self._tip: _TipRec | None = None
        self.restarts = 0
        self.last_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"statestores-pathsink-{shipper.name}", daemon=True
        )
        self._thread.start()

    # -- the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
                return
            except (
                OSError,
                ReplicationError,
            ) as exc:  # e.g. the mount went away: retry from the ack
                self.last_error = exc
                log.warning(
                    "path sink %s: %s; restarting from the follower's ack", self.directory, exc
                )
                self._stop.wait(0.5)

    def _serve(self) -> None:
        self._recover()
        self._begin(_read_ack(self.directory) or _FRESH)
        while not self._stop.is_set():
            switch = self._follow(self.shipper.stream(self._hello, idle=self.idle))
            if switch is None:
                return
            self.restarts += 1
            self._begin(switch)

    def _follow(self, stream: Iterator[Delivery | Tip]) -> _AckRec | None:
        """Publish ``stream`` until it ends (None) or the follower asks for a new one (its ack)."""
        try:
            for item in stream:
                if self._stop.is_set():
                    return None
                if isinstance(item, Tip):
                    self._write_tip(item.seq, item.mark)
                elif not self._publish(item):
                    return None
                switch = self._absorb()
                if switch is not None:
                    return switch
            return None
        except _Switch as sw:
            return sw.args[0]  # type: ignore[no-any-return]
        finally:
            getattr(
                stream, "close", lambda: None
            )()  # the shipper releases the files it holds for us

    # -- state

    def _recover(self) -> None:
        """Learn what an earlier sink published (a killed one may have left temp files)."""
        self._published, top = {}, 0
        edits = os.path.join(self.directory, "edits")
        for name in os.listdir(edits):
            path = os.path.join(edits, name)
            try:
                pub = _read_msg(path) if name.endswith(".msg") else None
            except ProtocolError as exc:
                log.warning("path sink %s: dropping %s: %s", self.directory, name, exc)
                pub = None
            if pub is None or path != _msg_path(self.directory, pub.n):
                _fs.remove(path)  # a temp file, damage, or a stranger
                continue
            self._published[pub.n] = (pub.epoch, tuple({s for s, _o in pub.slots.values()}))
            top = max(top, pub.n)
        with contextlib.suppress(ProtocolError):
            tip = _read_tip(self.directory)
            top = max(top, tip.last, tip.first - 1) if tip else top
        self._next = top + 1

    def _begin(self, ack: _AckRec) -> None:
        """Serve stream ``ack.epoch`` from where ``ack`` stands; drop what that stream lacks."""
        for n, (epoch, _slots) in list(self._published.items()):
            if epoch != ack.epoch or n <= ack.n:
                self._drop(n)
        self._next = max(self._next, ack.n + 1)
        # A follower that has not read this stream yet starts at ``first``: the messages an
        # earlier sink published on it, if any, else the next. Announcing only the next would
        # strand those (never read, never acknowledged, their slots never freed: with every
        # slot taken the stream stalls for good).
        self._epoch, self._acked = ack.epoch, ack.n
        self._first = min(self._published, default=self._next)
        self._last = max(self._published, default=self._first - 1)
        # The stream goes on after what is published: from where the follower will stand
        # once it installed those messages (else the shipper would count files a message
        # it then skips as a duplicate brings as on the follower, and ship them bodiless).
        hello = ack.restart or Hello(self.shipper.name, ack.seq, ack.mark, (), ack.origin)
        for n in sorted(self._published):
            pub = _read_msg(_msg_path(self.directory, n))
            if pub is None:
                raise ReplicationError(
                    f"message {n} vanished from {self.directory} while this sink adopted it"
                )
            hello = wire.after(hello, pub.msg)
        self._hello = hello
        if self._hello.store != self.shipper.name:
            log.warning("path sink %s: the follower follows %r, this sink ships %r", self.directory,
                        self._hello.store, self.shipper.name)
        self._write_tip(-1, -1)

    def _drop(self, n: int) -> None:
        self._published.pop(n, None)
        _fs.remove(_msg_path(self.directory, n))

    def _absorb(self) -> _AckRec | None:
        """Free what the follower acknowledged; its ack if it asks for another stream."""
        try:
            ack = _read_ack(self.directory)
        except ProtocolError as exc:  # written atomically, so this is damage: wait for the next
            log.warning("path sink %s: %s", self.directory, exc)
            return None
        if ack is not None and ack.epoch != self._epoch:
            return ack
        if ack is not None and ack.n > self._acked:
            self._acked = ack.n
            for n in [n for n in self._published if n <= ack.n]:
                self._drop(n)
        return None

    def _free(self) -> list[int]:
        used = {s for _e, slots in self._published.values() for s in slots}
        return [i for i in range(self.slots) if i not in used]

    def _write_tip(self, seq: int, mark: int) -> None:
        tip = _TipRec(self.shipper.name, self._epoch, self._first, self._last, seq, mark)
        if tip != self._tip:
            data = _pack(_TIP, [tip.store, tip.epoch, tip.first, tip.last, tip.seq, tip.mark])
            _fs.write_file_atomic(os.path.join(self.directory, "tip"), data, sync=self.sync)
            self._tip = tip

    # -- publishing

    def _wait_room(self, needs_slot: bool) -> bool:
        """Until fewer than ``slots`` messages are unacknowledged (and a slot is free if
        ``needs_slot``): True; False if the sink is closing; :class:`_Switch` on a restart."""
        delay = 0.005
        while len(self._published) >= self.slots or (needs_slot and not self._free()):
            if self._stop.wait(delay):
                return False
            delay = min(delay * 2, 0.05)
            switch = self._absorb()
            if switch is not None:
                raise _Switch(switch)
        return True

    def _publish(self, d: Delivery) -> bool:
        """Bodies into free slots (several per slot if there are more bodies than free
        slots), then the message, published by its rename. False: the sink is closing."""
        bodies = bodies_of(d.msg)
        if not self._wait_room(bool(bodies)):
            return False
        free = self._free()[: len(bodies)]
        where: dict[str, list[int]] = {}
        ends = dict.fromkeys(free, 0)
        for j, (name, size) in enumerate(bodies):
            slot = free[j % len(free)]
            where[name] = [slot, ends[slot]]
            ends[slot] += size
        for slot, end in ends.items():
            fd = os.open(_slot_path(self.directory, slot), os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, max(end, self.hint))
                for name, size in bodies:
                    if where[name][0] == slot:
                        _copy(d.paths[name], 0, size, fd, where[name][1])
                if self.sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        n = self._next
        data = _pack(_MSG, [self._epoch, n, wire.encode(d.msg), where])
        _fs.write_file_atomic(_msg_path(self.directory, n), data, sync=self.sync)
        self._published[n] = (self._epoch, tuple(free))
        self._next, self._last = n + 1, n
        return True

    # -- lifecycle

    def close(self) -> None:
        """Stop writing (promptly); the directory keeps what was published for a next sink."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise ReplicationError(
                f"path sink {self.directory}: its thread did not stop within 10 s"
            )
        _fs.unlock(self._lock_fd)

    def __enter__(self) -> PathSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"PathSink({self.directory!r}, epoch={self._epoch!r}, next={self._next}, "
            f"acked={self._acked})"
        )


# ---------------------------------------------------------------------- the follower's side


class PathSource:
    """A follower's end: the stream a :class:`PathSink` writes into ``directory`` for
    store ``store``; polls every ``poll`` seconds while nothing is new."""

    def __init__(
        self, directory: str | os.PathLike[str], store: str, *, poll: float = 0.03
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.store, self.poll = store, poll
        self._closed = threading.Event()
        self._opened = False

    def _start(self, hello: Hello) -> tuple[str, int | None]:
        """The stream to read and the last message consumed (None: the tip will say)."""
        first, self._opened = not self._opened, True
        try:
            ack = _read_ack(self.directory) or _FRESH
        except ProtocolError as exc:  # damaged: the request below replaces it
            log.warning("path source %s: %s", self.directory, exc)
            first, ack = False, _FRESH
        if (
            first
            and ack.restart is None
            and (ack.seq, ack.mark, ack.origin) == (hello.have_seq, hello.have_mark, hello.origin)
        ):
            return ack.epoch, ack.n  # where the last follower left off
        # a retry (the follower rejected what came) or other state: ask for a new stream
        epoch = uuid.uuid4().hex
        _write_ack(
            self.directory, _AckRec(epoch, 0, hello.have_seq, hello.have_mark, hello.origin, hello)
        )
        return epoch, None

    def _tip(self, epoch: str, waiting: bool) -> _TipRec | None:
        """The tip of our stream; None while no sink has announced it (yet)."""
        tip = _read_tip(self.directory)
        if tip is None or (waiting and tip.epoch != epoch):
            return None  # no sink yet, or it has not seen our request
        if tip.store != self.store:
            raise ProtocolError(f"{self.directory} carries store {tip.store!r}, not {self.store!r}")
        if tip.epoch != epoch:
            raise ReplicationError(
                f"the sink at {self.directory} serves stream {tip.epoch}, not {epoch}"
            )
        return tip

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        if hello.store != self.store:
            raise ConnectionError(f"this source reads store {self.store!r}, not {hello.store!r}")
        if self._closed.is_set():
            return
        epoch, n = self._start(hello)
        # what the follower holds
        at = _AckRec(epoch, 0, hello.have_seq, hello.have_mark, hello.origin)
        while not self._closed.is_set():
            tip = self._tip(epoch, n is None)
            if tip is None:
                self._closed.wait(self.poll)
                continue
            n = tip.first - 1 if n is None else n
            pub = _read_msg(_msg_path(self.directory, n + 1))
            if pub is not None:
                if (pub.epoch, pub.n) != (epoch, n + 1):
                    raise ReplicationError(
                        f"message {n + 1} in {self.directory} belongs to stream {pub.epoch}, not "
                        f"{epoch}"
                    )
                yield Received(pub.msg, functools.partial(self._fetch, pub))
                n += 1  # the follower asks for the next: it installed this one
                now = wire.after(Hello(self.store, at.seq, at.mark, (), at.origin), pub.msg)
                at = _AckRec(epoch, n, now.have_seq, now.have_mark, now.origin)
                _write_ack(self.directory, at)
                continue
            if tip.last > n:
                raise ReplicationError(
                    f"message {n + 1} is missing from {self.directory} (the tip says {tip.last} "
                    "are published)"
                )
            if tip.seq >= 0:
                yield Tip(tip.seq, tip.mark)
            self._closed.wait(self.poll)

    def _fetch(self, pub: _Published, dests: dict[str, str] | None) -> None:
        """Copy each body the message flags from its slot to ``dests[name]``."""
        for name, size in bodies_of(pub.msg):
            if dests and name in dests:
                slot, offset = pub.slots[name]
                fd = os.open(dests[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    _copy(_slot_path(self.directory, slot), offset, size, fd, 0)
                finally:
                    os.close(fd)

    def close(self) -> None:
        self._closed.set()

    def __repr__(self) -> str:
        return f"PathSource({self.directory!r}, store={self.store!r})"
