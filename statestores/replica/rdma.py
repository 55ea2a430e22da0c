"""The ``rdma`` transport: control over authenticated TCP, file bodies by one-sided RDMA WRITE.

Needs an RDMA device (``/sys/class/infiniband``) and pyverbs (Debian's
``python3-pyverbs``; not on PyPI); :func:`check_device` says which is missing, and the
``tcp`` transport (:class:`~.tcp.TcpServer`/:class:`~.tcp.TcpSource`) needs neither.

Connection: tcp.py's handshake (its HMAC-SHA256 proofs over both nonces), with the magic
``b"SFRD"``. Then frames ``u32 length | kind (1 byte) | body``:

* ``W`` — a replication message (``wire.py``): the follower's :class:`~.wire.Hello` and
  :class:`~.wire.Ack` after each message it installed; the shipper's edits, marks, tips.
* ``Q`` — queue pair info, a msgpack list. Follower (after its hello):
  ``[qp_num, psn, lid, gid, addr, rkey, length]``, the region it registered for remote
  writes; shipper: ``[qp_num, psn, lid, gid]``. Both then move their RC QP to RTS.
* ``R`` — follower: its QP is ready to receive (empty body).
* ``D`` — shipper: ``u32 offset | u32 length``: the next ``length`` bytes of the current
  message's bodies (concatenated in message order) are in the region at ``offset``.
* ``C`` — follower: it copied out the oldest ``D``'s bytes (a credit; empty body).

The region is used as two halves: the shipper writes a half only while it holds a credit
(two at the start), so it never overwrites bytes the follower has not copied out. Each
message's bodies start a new chunk; the follower checks size and crc32c as always.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets as _secrets
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack

from .shipper import Delivery, Shipper
from .source import Received
from .tcp import ShipServer, _check_secret, _recv_frame, _send_frame, connect
from .wire import (
    Ack,
    EditMsg,
    Hello,
    MarkMsg,
    ProtocolError,
    ReplicationError,
    Tip,
    bodies_of,
    decode,
    encode,
)

__all__ = ["RdmaServer", "RdmaSource", "check_device", "SYSFS"]

log = logging.getLogger("statestores.replica")

#: Where the kernel lists RDMA devices.
SYSFS = "/sys/class/infiniband"
_TCP = "use the tcp transport: statestores.replica.TcpServer/TcpSource"
_MAGIC = b"SFRD"
_CHUNK = struct.Struct("<II")
_WINDOW = 64  # messages the shipper sends before it waits for acks
_REGION = 8 << 20


def check_device(device: str | None = None) -> str:
    """The RDMA device to use (``device``, else the first one); :class:`ReplicationError`
    naming what is missing (the device, or pyverbs) and the ``tcp`` alternative."""
    try:
        found = sorted(os.listdir(SYSFS))
    except OSError:
        found = []
    if not found:
        raise ReplicationError(
            f"no RDMA device: {SYSFS} is empty or missing (pyverbs, from Debian's "
            f"python3-pyverbs, drives one); {_TCP}"
        )
    if device is not None and device not in found:
        raise ReplicationError(
            f"no RDMA device named {device!r} in {SYSFS} (found: {', '.join(found)}); {_TCP}"
        )
    try:
        import pyverbs.device  # noqa: F401
    except ImportError as exc:
        raise ReplicationError(
            f"pyverbs cannot be imported ({exc}), so RDMA device {found[0]!r} cannot be used: "
            f"install Debian's python3-pyverbs (it is not on PyPI), or {_TCP}"
        ) from None
    return device or found[0]


def _send(sock: socket.socket, kind: bytes, body: bytes = b"") -> None:
    _send_frame(sock, kind + body)


def _recv(sock: socket.socket, *kinds: bytes) -> tuple[bytes, bytes]:
    frame = _recv_frame(sock)
    kind, body = frame[:1], frame[1:]
    if kind not in kinds:
        raise ProtocolError(f"expected a frame of kind {b'/'.join(kinds).decode()}, got {kind!r}")
    return kind, body


def _ints(body: bytes, n: int, what: str) -> list[Any]:
    """A ``Q`` frame: ``n`` fields, all ints but the gid (a str) in 4th place."""
    try:
        v = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise ProtocolError(f"{what} is not msgpack: {exc}") from None
    if (
        not isinstance(v, list)
        or len(v) != n
        or not isinstance(v[3], str)
        or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 0
            for i, x in enumerate(v)
            if i != 3
        )
    ):
        raise ProtocolError(
            f"{what} must be [qp_num, psn, lid, gid{', addr, rkey, length' if n == 7 else ''}], "
            f"got {v!r:.80}"
        )
    return v


class _Endpoint:
    """One connection's verbs objects: device context, PD, CQ, one MR and an RC QP."""

    def __init__(
        self, device: str, ib_port: int, gid_index: int, mr_bytes: int, remote_write: bool
    ) -> None:
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.e, self.port, self.gid_index = e, ib_port, gid_index
        self._objs: list[Any] = []
        try:
            self.ctx = self._keep(Context(name=device))
            self.pd = self._keep(PD(self.ctx))
            self.cq = self._keep(CQ(self.ctx, 16, None, None, 0))
            access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_WRITE if remote_write else 0)
            self.mr = self._keep(MR(self.pd, mr_bytes, access))
            cap = QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=1)
            attr = QPAttr(port_num=ib_port)
            attr.qp_access_flags = access
            self.qp = self._keep(QP(self.pd, init, attr))  # an RC QP comes back in INIT
            port = self.ctx.query_port(ib_port)
            self.lid, self.mtu = port.lid, port.active_mtu
            self.gid = self.ctx.query_gid(ib_port, gid_index).gid
            self.psn = _secrets.randbelow(1 << 24)
        except BaseException:
            self.close()
            raise

    def _keep(self, obj: Any) -> Any:
        self._objs.append(obj)
        return obj

    def info(self) -> list[Any]:
        return [self.qp.qp_num, self.psn, self.lid, self.gid]

    def connect(self, qp_num: int, psn: int, lid: int, gid: str) -> None:
        """Move the QP to RTS, connected to the peer's QP (RoCE needs the GID route)."""
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        attr = QPAttr(port_num=self.port)
        attr.path_mtu = self.mtu
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = qp_num, psn, self.psn
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        route = GlobalRoute(dgid=GID(gid), sgid_index=self.gid_index)
        attr.ah_attr = AHAttr(port_num=self.port, is_global=1, gr=route, dlid=lid)
        self.qp.to_rts(attr)

    def write(self, length: int, addr: int, rkey: int, timeout: float) -> None:
        """RDMA WRITE the MR's first ``length`` bytes to the peer's ``addr``; wait until done."""
        from pyverbs.wr import SGE, SendWR

        e = self.e
        wr = SendWR(
            wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
            sg=[SGE(self.mr.buf, length, self.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED,
        )
        wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr, None)
        deadline, spins = time.monotonic() + timeout, 0
        while True:
            n, wcs = self.cq.poll(1)
            if n:
                if wcs[0].status != e.IBV_WC_SUCCESS:
                    raise ConnectionError(
                        f"RDMA write of {length} bytes failed with completion status "
                        f"{wcs[0].status}"
                    )
                return
            if time.monotonic() > deadline:
                raise ConnectionError(
                    f"RDMA write of {length} bytes did not complete within {timeout} s"
                )
            spins += 1
            if spins > 200:  # a write takes microseconds; past that, stop spinning
                time.sleep(0.0005)

    def close(self) -> None:
        for obj in reversed(self._objs):  # QP, MR, CQ, PD, then the context
            with contextlib.suppress(Exception):
                obj.close()
        self._objs.clear()


def _pyverbs_error() -> type[BaseException]:
    from pyverbs.pyverbs_error import PyverbsError

    return PyverbsError  # type: ignore[no-any-return]


class RdmaServer(ShipServer):
    """Serves the shippers ``shippers`` names (a mapping, or a function name → Shipper or
    None) to followers that know ``secret``; bodies go by RDMA WRITE through ``device``
    (default: the first). ``port=0`` picks a free port (see ``address``)."""

    MAGIC = _MAGIC
    THREAD = "statestores-rdma"

    def __init__(
        self, shippers: Mapping[str, Shipper] | Callable[[str], Shipper | None],
        secret: bytes | str, *, device: str | None = None, host: str = "127.0.0.1", port: int = 0,
        ib_port: int = 1, gid_index: int = 0, handshake_timeout: float = 5.0, timeout: float = 30.0,
    ) -> None:
        # before any socket: a clear error, not a half-started server
        self.device = check_device(device)
        self.ib_port, self.gid_index, self.timeout = ib_port, gid_index, timeout
        super().__init__(
            shippers, secret, host=host, port=port, handshake_timeout=handshake_timeout
        )

    def _handshake(self, conn: socket.socket) -> Hello | None:
        if not self._prove(conn):
            return None
        hello = decode(_recv(conn, b"W")[1])
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected a hello, got {type(hello).__name__}")
        return hello

    def _serve(self, conn: socket.socket) -> None:
        ep: _Endpoint | None = None
        try:
            hello = self._handshake(conn)
            if hello is None:
                return
            peer = _ints(_recv(conn, b"Q")[1], 7, "the follower's queue pair info")
            if not 2 <= peer[6] <= 1 << 31:
                raise ProtocolError(
                    f"the follower's region must hold 2 bytes to 2 GiB, got {peer[6]}"
                )
            shipper = self._lookup(hello.store)
            if shipper is None:
                log.warning(
                    "an rdma follower asked for store %r, which this server does not ship",
                    hello.store,
                )
                return
            conn.settimeout(self.timeout)
            ep = _Endpoint(
                self.device, self.ib_port, self.gid_index, max(1, peer[6] // 2), remote_write=False
            )
            _send(conn, b"Q", msgpack.packb(ep.info()))
            ep.connect(*peer[:4])
            _recv(conn, b"R")
            self._stream(conn, ep, shipper, hello, peer[4], peer[5], peer[6])
        except (OSError, ReplicationError, _pyverbs_error()) as exc:
            if not self._closed.is_set():
                log.info("rdma replication connection ended: %s", exc)
        finally:
            if ep is not None:
                ep.close()
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _stream(self, conn: socket.socket, ep: _Endpoint, shipper: Shipper, hello: Hello,
                addr: int, rkey: int, length: int) -> None:
        half = length // 2
        state = {"credits": 2, "unacked": 0, "turn": 0}
        for d in shipper.stream(hello):
            if self._closed.is_set():
                return
            if isinstance(d, Tip):
                _send(conn, b"W", encode(d))
            else:
                while state["unacked"] >= _WINDOW:
                    self._read_one(conn, state)
                _send(conn, b"W", encode(d.msg))
                for size in _chunks(ep, d, half):
                    while state["credits"] == 0:
                        self._read_one(conn, state)
                    at = state["turn"] * half
                    ep.write(size, addr + at, rkey, self.timeout)
                    _send(conn, b"D", _CHUNK.pack(at, size))
                    state["credits"] -= 1
                    state["turn"] ^= 1
                state["unacked"] += 1
            while select.select([conn], [], [], 0)[0]:
                self._read_one(conn, state)

    def _read_one(self, conn: socket.socket, state: dict[str, int]) -> None:
        """One frame from the follower: a credit (``C``) or an ack (``W``)."""
        kind, body = _recv(conn, b"C", b"W")
        if kind == b"C":
            if state["credits"] >= 2:
                raise ProtocolError("the follower returned a credit it did not hold")
            state["credits"] += 1
            return
        ack = decode(body)
        if not isinstance(ack, Ack) or state["unacked"] == 0:
            raise ProtocolError(f"expected a credit or an ack of a message sent, got {ack!r:.60}")
        state["unacked"] -= 1

    def __repr__(self) -> str:
        return f"RdmaServer({self.address[0]}:{self.address[1]}, device={self.device!r})"


def _chunks(ep: _Endpoint, d: Delivery, half: int) -> Iterator[int]:
    """Fill the MR with the message's bodies in order; yield each full (or last) chunk's
    size. The caller writes it out before resuming, so the MR is free again."""
    pos = 0
    for name, size in bodies_of(d.msg):
        with open(d.paths[name], "rb") as f:
            left = size
            while left:
                data = f.read(min(left, half - pos))
                if not data:
                    raise ReplicationError(f"staged {name} ends {left} bytes short of its {size}")
                ep.mr.write(data, len(data), pos)
                pos += len(data)
                left -= len(data)
                if pos == half:
                    yield pos
                    pos = 0
    if pos:
        yield pos


class RdmaSource:
    """A follower's end: the store ``store`` served by the :class:`RdmaServer` at
    ``host:port``; it registers ``region_bytes`` on ``device`` for the shipper to write."""

    def __init__(
        self, host: str, port: int, store: str, secret: bytes | str, *, device: str | None = None,
        region_bytes: int = _REGION, ib_port: int = 1, gid_index: int = 0, timeout: float = 10.0,
    ) -> None:
        self.device = check_device(device)
        if not isinstance(region_bytes, int) or not 2 <= region_bytes <= 1 << 31:
            raise ValueError(f"region_bytes must be an int in [2, 2**31], got {region_bytes!r}")
        self.host, self.port, self.store = host, port, store
        self._secret = _check_secret(secret)
        self.region, self.ib_port, self.gid_index, self.timeout = (
            region_bytes, ib_port, gid_index, timeout,
        )
        self._sock: socket.socket | None = None
        self._closed = False

    def _connect(self) -> socket.socket:
        return connect(self.host, self.port, self._secret, _MAGIC, self.timeout)

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        if self._closed:
            return
        verbs_error = _pyverbs_error()
        sock = self._connect()
        self._sock = sock
        ep: _Endpoint | None = None
        try:
            ep = _Endpoint(
                self.device, self.ib_port, self.gid_index, self.region, remote_write=True
            )
            _send(sock, b"W", encode(hello))
            _send(sock, b"Q", msgpack.packb([*ep.info(), ep.mr.buf, ep.mr.rkey, self.region]))
            ep.connect(*_ints(_recv(sock, b"Q")[1], 4, "the shipper's queue pair info"))
            _send(sock, b"R")
            yield from self._messages(sock, ep)
        except (OSError, verbs_error) as exc:
            if self._closed:
                return
            raise ConnectionError(
                f"rdma replication stream from {self.host}:{self.port}: {exc}"
            ) from exc
        finally:
            self._sock = None
            sock.close()
            if ep is not None:
                ep.close()

    def _messages(self, sock: socket.socket, ep: _Endpoint) -> Iterator[Received | Tip]:
        while not self._closed:
            msg = decode(_recv(sock, b"W")[1])
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
                _receive(sock, ep, self.region, msg, dests)

            yield Received(msg, fetch)
            if not fetched:
                _receive(sock, ep, self.region, msg, None)  # stay in step: return the credits
            _send(
                sock, b"W",
                encode(Ack(msg.seq, msg.snapshot_id if isinstance(msg, MarkMsg) else -1)),
            )

    def close(self) -> None:
        self._closed = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __repr__(self) -> str:
        return f"RdmaSource({self.host}:{self.port}, store={self.store!r}, device={self.device!r})"


def _receive(sock: socket.socket, ep: _Endpoint, region: int, msg: EditMsg | MarkMsg,
             dests: dict[str, str] | None) -> None:
    """Copy the message's bodies out of the region, chunk by chunk, returning each credit."""
    at = size = pos = 0
    for name, left in bodies_of(msg):
        fd = (
            os.open(dests[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if dests and name in dests
            else None
        )
        try:
            while left:
                if pos == size:
                    body = _recv(sock, b"D")[1]
                    if len(body) != _CHUNK.size:
                        raise ProtocolError(
                            f"a chunk frame holds {len(body)} bytes, expected {_CHUNK.size}"
                        )
                    (at, size), pos = _CHUNK.unpack(body), 0
                    if size == 0 or at + size > region:
                        raise ProtocolError(
                            f"chunk [{at}, {at + size}) is empty or outside the "
                            f"{region}-byte region"
                        )
                k = min(left, size - pos)
                data = ep.mr.read(k, at + pos)
                while fd is not None and data:
                    data = data[os.write(fd, data):]
                pos, left = pos + k, left - k
                if pos == size:
                    _send(sock, b"C")
        finally:
            if fd is not None:
                os.close(fd)
