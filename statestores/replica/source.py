"""What a follower reads from: the one interface every transport implements.

``source.open(hello)`` starts a stream for a follower standing at ``hello`` and returns
an iterator of :class:`Received` messages and, while nothing happens, :class:`Tip`
heartbeats (the shipper's newest edit and mark: a follower holding less lost a message).
For each message the follower calls ``received.fetch(dests)`` exactly once, before asking
for the next: it writes the bodies the message flags ``body``, in order, to
``dests[name]`` (``dests=None``: read and discard them). A transport that loses its peer
raises :class:`ConnectionError`; the follower then opens the stream again from where it
stands.

:class:`LocalSource` reads a :class:`~statestores.replica.Shipper` of this process (tests,
and a replica on the same machine); ``tcp``, ``path`` and ``rdma`` reach other machines.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .shipper import Shipper
from .wire import EditMsg, Hello, MarkMsg, Tip

__all__ = ["Received", "Source", "LocalSource", "copier"]

Fetch = Callable[[dict[str, str] | None], None]


@dataclass(frozen=True)
class Received:
    """One message and the call that writes its bodies (see the module docstring)."""

    msg: EditMsg | MarkMsg
    fetch: Fetch


class Source(Protocol):
    """A stream of a shipper's messages for one follower (see the module docstring)."""

    def open(self, hello: Hello) -> Iterator[Received | Tip]: ...

    def close(self) -> None: ...


class LocalSource:
    """A :class:`Shipper` in this process; bodies are copied from its staging directory."""

    def __init__(self, shipper: Shipper) -> None:
        self.shipper = shipper
        self.store = shipper.name
        self._closed = False

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        if hello.store != self.shipper.name:
            raise ConnectionError(
                f"this source ships store {self.shipper.name!r}, not {hello.store!r}"
            )
        for d in self.shipper.stream(hello, idle=0.05):
            if self._closed:
                return
            if isinstance(d, Tip):
                yield d
                continue
            yield Received(d.msg, copier(d.paths))
            if isinstance(d.msg, MarkMsg):  # asked for the next: the mark is installed
                self.shipper.note_ack(d.msg.snapshot_id)

    def close(self) -> None:
        self._closed = True


def copier(paths: dict[str, str]) -> Callable[[dict[str, str] | None], None]:
    """A delivery's ``fetch`` when its bodies are files here (``paths``: name → path): each
    asked for is copied to its destination."""
    def fetch(dests: dict[str, str] | None) -> None:
        for name, dst in (dests or {}).items():
            shutil.copyfile(paths[name], dst)
    return fetch
