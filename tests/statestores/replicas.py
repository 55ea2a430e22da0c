"""What the replica tests share: a source whose stream misbehaves on a schedule, and small
store helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import remotes
import statestores
from statestores.replica import (
    SHIPPED_KINDS,
    LocalSource,
    Received,
    Shipper,
)
from statestores.replica.wire import Hello, Tip

SECRET = b"test-cluster-secret"
FAULTS = ("none", "drop", "dup", "corrupt", "truncate", "disconnect", "swap")


class FaultySource:
    """A LocalSource whose stream misbehaves on a fixed schedule of faults (one per message)."""

    def __init__(self, shipper: Shipper, schedule: list[str]) -> None:
        self.inner = LocalSource(shipper)
        self.store = shipper.name
        self.schedule = list(schedule)
        self.injected: list[str] = []

    def _fault(self) -> str:
        return self.schedule.pop(0) if self.schedule else "none"

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        it = self.inner.open(hello)
        for item in it:
            if isinstance(item, Tip):
                yield item
                continue
            fault = self._fault()
            if fault != "none":
                self.injected.append(fault)
            if fault == "drop":
                continue
            if fault == "disconnect":
                raise ConnectionError("injected disconnect")
            if fault == "dup":
                yield item
                yield item
                continue
            if fault == "swap":
                later = next(it, None)
                if later is not None:
                    yield later  # a Tip or the next message, then the held one
                yield item
                continue
            if fault in ("corrupt", "truncate"):
                yield Received(item.msg, _damaging(item.fetch, fault))
                continue
            yield item

    def close(self) -> None:
        self.inner.close()


def _damaging(fetch: Any, how: str) -> Any:
    def damaged(dests: dict[str, str] | None) -> None:
        fetch(dests)
        for path in (dests or {}).values():
            data = bytearray(Path(path).read_bytes())
            if how == "truncate" or not data:
                Path(path).write_bytes(bytes(data[: len(data) // 2]))
            else:
                data[len(data) // 2] ^= 0x5A
                Path(path).write_bytes(bytes(data))
            return  # one damaged body is enough

    return damaged


def _immutable(store: statestores.Store) -> dict[str, bytes]:
    _seq, files = store.version()
    return {e.name: Path(store.directory, e.name).read_bytes() for e in files if e.kind in SHIPPED_KINDS}


def _fill(db: statestores.Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        db[b"key%05d" % i] = b"value%d" % i


def _store_dir(tmp_path: Path) -> Path:
    d = tmp_path / "a-store"
    statestores.open("appendlog", d).close()
    return d


class DownRemote(remotes.PathRemote):
    """A snapshot remote that cannot be reached (MinIO refusing connections)."""

    def latest_snapshot(self) -> int | None:
        raise ConnectionRefusedError(111, "Connection refused")


class DeadSource:
    """A lost primary's replication server: every connection is refused."""

    store = "accounts-p0"

    def open(self, hello: Hello) -> Iterator[Tip]:
        raise ConnectionRefusedError(111, "Connection refused")

    def close(self) -> None:
        pass
