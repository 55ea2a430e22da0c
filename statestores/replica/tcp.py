"""The ``tcp`` transport: a shipper serves followers over authenticated TCP connections.

Connection (``FORMAT.md`` § "Replication over TCP"): the server sends ``b"SFRP"``, a
version byte and a 32-byte nonce; the follower answers with its own nonce and
``HMAC-SHA256(secret, b"follower" | server nonce | follower nonce)``; the server proves
itself with ``HMAC-SHA256(secret, b"shipper" | follower nonce | server nonce)``. Nothing
else is read before the proof checks out, and nothing is ever unpickled. Then frames —
``u32 length | message`` (``wire.py``), at most :data:`~.wire.MAX_MESSAGE_BYTES` — flow:
the follower's :class:`~.wire.Hello`, the shipper's messages, each followed by its file
bodies as raw bytes (``os.sendfile`` from the staged links), and the follower's
:class:`~.wire.Ack` after each message it installed. The shipper keeps at most
``window_bytes`` of bodies unacknowledged. A follower that reconnects says where it
stands in its ``Hello``, so the stream resumes there.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import hmac
import logging
import os
import secrets as _secrets
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Self

from .shipper import Delivery, Shipper
from .source import Received
from .wire import (
    MAX_MESSAGE_BYTES,
    Ack,
    EditMsg,
    Hello,
    MarkMsg,
    ProtocolError,
    Tip,
    bodies_of,
    decode,
    encode,
)

__all__ = ["TcpServer", "TcpSource", "ShipServer", "connect", "DEFAULT_WINDOW"]

log = logging.getLogger("statestores.replica")

_MAGIC = b"SFRP"
_VERSION = 1
_LEN = struct.Struct("<I")
_NONCE = 32
#: Bytes of file bodies a shipper sends before the follower acknowledges them.
DEFAULT_WINDOW = 64 << 20
_CHUNK = 1 << 20


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


def _check_secret(secret: object) -> bytes:
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes) or len(secret) < 8:
        raise ValueError("secret must be bytes or str of at least 8 bytes (the cluster secret)")
    return secret


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k
    return bytes(buf)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_frame(sock: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
    return _recv_exact(sock, n)


class ShipServer(abc.ABC):
    """What every replication server shares: the listener, a thread per connection, the
    proof of the cluster secret (``_prove``), ``close``. Subclasses serve a connection."""

    MAGIC = _MAGIC
    THREAD = "statestores-ship"

    def __init__(
        self, shippers: Mapping[str, Shipper] | Callable[[str], Shipper | None],
        secret: bytes | str, *, host: str, port: int, handshake_timeout: float,
    ) -> None:
        self._secret = _check_secret(secret)
        self._lookup = shippers.get if isinstance(shippers, Mapping) else shippers
        self.handshake_timeout = handshake_timeout
        self._listener = socket.create_server((host, port))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0
        self._thread = threading.Thread(
            target=self._accept, name=f"{self.THREAD}-{self.address[1]}", daemon=True
        )
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _addr = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name=f"{self.THREAD}-conn", daemon=True
            ).start()

    def _prove(self, conn: socket.socket) -> bool:
        """The server's half of the handshake; False (and counted) if the peer lacks the secret."""
        conn.settimeout(self.handshake_timeout)
        ns = _secrets.token_bytes(_NONCE)
        conn.sendall(self.MAGIC + bytes([_VERSION]) + ns)
        answer = _recv_exact(conn, _NONCE + 32)
        nc, mac = answer[:_NONCE], answer[_NONCE:]
        if not hmac.compare_digest(mac, _mac(self._secret, b"follower", ns, nc)):
            self.refused += 1
            log.warning("refused a follower from %s: wrong secret", conn.getpeername()[0])
            return False
        conn.sendall(_mac(self._secret, b"shipper", nc, ns))
        return True

    @abc.abstractmethod
    def _serve(self, conn: socket.socket) -> None:
        """Serve one follower's connection (the subclass's protocol), then close it."""

    def close(self) -> None:
        """Stop accepting and end every connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(host: str, port: int, secret: bytes, magic: bytes, timeout: float,
            opened: Callable[[socket.socket], None] | None = None) -> socket.socket:
    """The follower's half of the handshake with a :class:`ShipServer` speaking ``magic``.
    ``opened``: handed the socket before the handshake, so that another thread may shut it
    down meanwhile (a stopped server's kernel accepts the connection, then nothing comes)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        if opened is not None:
            opened(sock)
        head = _recv_exact(sock, len(magic) + 1 + _NONCE)
        if head[: len(magic)] != magic or head[len(magic)] != _VERSION:
            raise ProtocolError(
                f"{host}:{port} is not a {magic.decode()} replication server (version {_VERSION})"
            )
        ns = head[len(magic) + 1:]
        nc = _secrets.token_bytes(_NONCE)
        sock.sendall(nc + _mac(secret, b"follower", ns, nc))
        try:
            proof = _recv_exact(sock, 32)
        except ConnectionError:
            raise ConnectionError(
                f"{host}:{port} closed the connection in the handshake (is the secret right?)"
            ) from None
        if not hmac.compare_digest(proof, _mac(secret, b"shipper", nc, ns)):
            raise ConnectionError(f"{host}:{port} did not prove it knows the secret")
    except BaseException:
        sock.close()
        raise
    return sock


class TcpServer(ShipServer):
    """Serves the shippers ``shippers`` names (a mapping, or a function name → Shipper or
    None) to followers that know ``secret``. ``port=0`` picks a free port (see ``address``)."""

    def __init__(
        self, shippers: Mapping[str, Shipper] | Callable[[str], Shipper | None],
        secret: bytes | str, *, host: str = "127.0.0.1", port: int = 0,
        window_bytes: int = DEFAULT_WINDOW, handshake_timeout: float = 5.0,
    ) -> None:
        if window_bytes < 1:
            raise ValueError(f"window_bytes must be >= 1, got {window_bytes}")
        self.window = window_bytes
        super().__init__(
            shippers, secret, host=host, port=port, handshake_timeout=handshake_timeout
        )

    def _handshake(self, conn: socket.socket) -> Hello | None:
        if not self._prove(conn):
            return None
        hello = decode(_recv_frame(conn))
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected a hello, got {type(hello).__name__}")
        return hello

    def _serve(self, conn: socket.socket) -> None:
        try:
            hello = self._handshake(conn)
            if hello is None:
                return
            shipper = self._lookup(hello.store)
            if shipper is None:
                log.warning(
                    "a follower asked for store %r, which this server does not ship", hello.store
                )
                return
            conn.settimeout(30.0)  # a follower silent this long (no ack, window full) is gone
            self._stream(conn, shipper, hello)
        except (OSError, ProtocolError) as exc:
            if not self._closed.is_set():
                log.info("replication connection ended: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _stream(self, conn: socket.socket, shipper: Shipper, hello: Hello) -> None:
        inflight: deque[int] = deque()  # body bytes of each message not yet acknowledged
        pending = 0
        for d in shipper.stream(hello):
            if self._closed.is_set():
                return
            if isinstance(d, Tip):
                _send_frame(conn, encode(d))
                pending -= self._read_acks(conn, inflight, shipper, block=False)
                continue
            size = _body_bytes(d)
            while inflight and pending + size > self.window:
                pending -= self._read_acks(conn, inflight, shipper, block=True)
            _send_frame(conn, encode(d.msg))
            _send_bodies(conn, d)
            inflight.append(size)
            pending += size
            if isinstance(d.msg, MarkMsg):
                # a round waits for this ack, and a follower told to stop there closes the
                # stream right after sending it: read it now, before anything else is sent
                # (a send after its close could reset the connection with the ack unread)
                while inflight:
                    pending -= self._read_acks(conn, inflight, shipper, block=True)
            else:
                pending -= self._read_acks(conn, inflight, shipper, block=False)

    def _read_acks(
        self, conn: socket.socket, inflight: deque[int], shipper: Shipper, *, block: bool
    ) -> int:
        """Consume the acks that arrived (at least one if ``block``); the bytes they free."""
        freed = 0
        while inflight:
            if not block:
                conn.setblocking(False)
                try:
                    head = conn.recv(_LEN.size, socket.MSG_PEEK)
                except BlockingIOError:
                    return freed
                finally:
                    conn.settimeout(30.0)
                if not head:
                    raise ConnectionError("the follower closed the connection")
                if len(head) < _LEN.size:
                    return freed  # the rest of the frame is on its way
            ack = decode(_recv_frame(conn))
            if not isinstance(ack, Ack):
                raise ProtocolError(f"expected an ack, got {type(ack).__name__}")
            shipper.note_ack(ack.mark)
            freed += inflight.popleft()
            block = False
        return freed

    def __repr__(self) -> str:
        return f"TcpServer({self.address[0]}:{self.address[1]})"


def _body_bytes(d: Delivery) -> int:
    return sum(size for _n, size in bodies_of(d.msg))


def _send_bodies(conn: socket.socket, d: Delivery) -> None:
    for name, size in bodies_of(d.msg):
        with open(d.paths[name], "rb") as f:
            if size:
                sent = conn.sendfile(f, 0, size)
                if sent != size:
                    raise ConnectionError(
                        f"sent {sent} of {size} bytes of {name}: the staged file is shorter"
                    )


class TcpSource:
    """A follower's end: the store ``store`` served by the :class:`TcpServer` at ``host:port``."""

    def __init__(
        self, host: str, port: int, store: str, secret: bytes | str, *, timeout: float = 10.0
    ) -> None:
        self.host = host
        self.port = port
        self.store = store
        self._secret = _check_secret(secret)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._closed = False

    def _connect(self) -> socket.socket:
        return connect(self.host, self.port, self._secret, _MAGIC, self.timeout, self._opened)

    def _opened(self, sock: socket.socket) -> None:
        """(the follow thread) Closable from now on, the handshake included: a promotion
        stops following at once, even while a paused primary never answers it."""
        self._sock = sock
        if self._closed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        if self._closed:
            return
        sock = self._connect()
        self._sock = sock
        try:
            _send_frame(sock, encode(hello))
            while not self._closed:
                msg = decode(_recv_frame(sock))
                if isinstance(msg, Tip):
                    yield msg
                    continue
                if not isinstance(msg, (EditMsg, MarkMsg)):
                    raise ProtocolError(f"expected an edit, mark or tip, got {type(msg).__name__}")
                fetched: list[bool] = []

                def fetch(
                    dests: dict[str, str] | None, msg: EditMsg | MarkMsg = msg,
                    fetched: list[bool] = fetched,
                ) -> None:
                    fetched.append(True)
                    _receive_bodies(sock, msg, dests)

                yield Received(msg, fetch)
                if not fetched:
                    _receive_bodies(sock, msg, None)  # stay in step with the byte stream
                _send_frame(
                    sock, encode(Ack(msg.seq, msg.snapshot_id if isinstance(msg, MarkMsg) else -1))
                )
        except OSError as exc:
            if self._closed:
                return
            raise ConnectionError(
                f"replication stream from {self.host}:{self.port}: {exc}"
            ) from exc
        finally:
            self._sock = None
            sock.close()

    def close(self) -> None:
        self._closed = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __repr__(self) -> str:
        return f"TcpSource({self.host}:{self.port}, store={self.store!r})"


def _receive_bodies(
    sock: socket.socket, msg: EditMsg | MarkMsg, dests: dict[str, str] | None
) -> None:
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    for name, size in bodies_of(msg):
        fd = (
            os.open(dests[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if dests and name in dests
            else None
        )
        try:
            left = size
            while left:
                k = sock.recv_into(view, min(left, _CHUNK))
                if k == 0:
                    raise ConnectionError("the shipper closed the connection mid-file")
                done = 0
                while fd is not None and done < k:
                    done += os.write(fd, view[done:k])
                left -= k
        finally:
            if fd is not None:
                os.close(fd)
