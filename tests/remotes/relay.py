"""A TCP forwarder in front of a real MinIO, for the remotes' failure tests."""

from __future__ import annotations

import socket
import threading
import time

__all__ = ["Proxy", "free_port"]


def free_port() -> int:
    """Outside the ephemeral range (see ``launcher.cluster.free_port``)."""
    from launcher.cluster import free_port as pick

    return pick("127.0.0.1")


class Proxy:
    """A TCP forwarder to MinIO that can start late and answer the first requests with
    ``503 SlowDown`` (what S3 sends when it throttles); ``delay``: seconds before each
    chunk of an answer; ``silent``: it takes connections and never answers (a node that
    holds a request, as a distributed MinIO node does when a peer died under it)."""

    def __init__(self, target_port: int, *, slowdowns: int = 0, delay: float = 0.0,
                 silent: bool = False) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.slowdowns = slowdowns
        self.delay = delay
        self.silent = silent
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def start(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        self._sock = sock
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # (wakes the accepting thread)
            except OSError:
                pass
            self._sock.close()
        for conn in self._held:
            conn.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        if self.silent:
            self._held.append(conn)  # (never read, never answered, closed by stop)
            return
        with self._lock:
            throttle = self.slowdowns > 0
            if throttle:
                self.slowdowns -= 1
        if throttle:
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate.</Message></Error>"
            )
            conn.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))

        def pump(src: socket.socket, dst: socket.socket, delay: float = 0.0) -> None:
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    time.sleep(delay)
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(upstream, conn, self.delay), daemon=True).start()
        pump(conn, upstream)
