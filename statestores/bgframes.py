"""The frames a store process and its background worker process exchange over their pipes:
a little-endian u64 length, then the body — a pickle of a task or a reply, or, tagged with
:data:`CREDENTIALS`, the JSON of the parent's ``remotes.credentials`` secrets.
"""

from __future__ import annotations

import os
import pickle
import struct

__all__ = ["FRAME", "CREDENTIALS", "PICKLE", "write_all", "read_exact", "recv_frame"]

FRAME = struct.Struct("<Q")
#: Starts a frame of credentials (JSON) instead of a task (a pickle starts with 0x80).
CREDENTIALS = b"\x00SFCRED1"
PICKLE = pickle.HIGHEST_PROTOCOL


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``; None at EOF before the first byte, EOFError at EOF after it."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            if got == 0:
                return None
            raise EOFError(f"pipe closed after {got} of {n} bytes")
        got += k
    return buf


def recv_frame(fd: int) -> bytearray | None:
    """The next frame's body; None at EOF between frames."""
    head = read_exact(fd, FRAME.size)
    if head is None:
        return None
    (size,) = FRAME.unpack(head)
    body = read_exact(fd, size)
    if body is None:
        raise EOFError("pipe closed before a frame's body")
    return body
