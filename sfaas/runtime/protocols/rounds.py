"""Snapshot rounds: the global manifest of one consistent cut, and where rounds are kept.

A round ``n`` rides an epoch's commit (``Commit.marker = n``): at that point no transaction
is in flight, so every store's ``snapshot(n)`` plus each worker's replay positions form a
consistent cut. When every worker reported (:class:`Snapshotted`), the coordinator
publishes a :class:`RoundManifest` — write-then-publish: the round's blob first, then the
index that makes it visible. Layout in the app's rounds remote
(``sfaas.runtime.state.rounds_remote``):

* ``blobs/round-<n:012d>`` — one encoded :class:`RoundManifest`;
* ``blobs/index`` — the complete rounds still retained, ascending (an encoded :class:`RoundIndex`).

Encoding of both (FORMAT.md § "Snapshot rounds"), the framing of store manifests
(``remotes.manifest.frame``): ``magic:4 | version:u8 | crc32c:u32 |
msgpack(body)``, the crc over the msgpack bytes; magic ``SFRM`` (round) / ``SFRI`` (index).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from remotes import Remote
from remotes.manifest import frame, unframe
from sfaas.runtime import ports
from sfaas.runtime.protocols.base import Message

log = logging.getLogger("sfaas.runtime.protocols.rounds")

__all__ = [
    "StoreCut", "Retry", "Snapshotted", "RoundManifest", "RoundIndex", "RoundError", "Rounds",
    "publish_round", "collect_garbage", "collect_store_garbage", "INDEX_BLOB",
]

_VERSION = 1
INDEX_BLOB = "index"


class RoundError(ValueError):
    """Bytes that are not a valid round manifest or index (names the blob and the fault)."""


def _encode(magic: bytes, body: Any) -> bytes:
    return frame(magic, _VERSION, body)


def _decode(magic: bytes, data: bytes, source: str, what: str) -> Any:
    return unframe(data, magic=magic, version=_VERSION, what=what, source=source, error=RoundError)


def _int_map(value: Any, what: str) -> dict[int, int]:
    if not isinstance(value, dict) or not all(
        isinstance(k, int) and isinstance(v, int) for k, v in value.items()
    ):
        raise RoundError(f"{what} must map ints to ints, got {value!r:.80}")
    return dict(value)


def _skip_map(value: Any) -> dict[int, list[int]]:
    if not isinstance(value, dict) or not all(
        isinstance(k, int) and isinstance(v, list) and all(isinstance(o, int) for o in v)
        for k, v in value.items()
    ):
        raise RoundError(f"skip must map ints to lists of ints, got {value!r:.80}")
    return {k: list(v) for k, v in value.items()}


class StoreCut(NamedTuple):
    """One store's part of a round: its snapshot (id = the round) and what it cost (a row
    of :class:`Snapshotted` and of the round manifest)."""

    operator: str
    partition: int
    bytes_uploaded: int
    files: int
    total_bytes: int
    #: the engine that wrote it (empty in rounds written before it was recorded)
    engine: str = ""


class Retry(NamedTuple):
    """A request waiting to re-run at a round's cut: the tid it keeps, where it came from,
    its first run's ``ctx.now()``, which every re-run keeps, and its journal of ``ctx.run``
    outcomes (effect key → ``[ok, value]``; ``sfaas.runtime.txn.effects``)."""

    tid: int
    partition: int
    offset: int
    now: float
    journal: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


@dataclass(slots=True)
class Snapshotted(Message):
    """Worker → coordinator: my part of snapshot round ``round`` (sent once its uploads
    ended).

    ``stores``: one row per store (each store's snapshot id is the round). ``ingress``: per
    owned partition, the first offset whose request is *not* in the snapshot's state
    (replay starts there); ``skip``: per partition, the offsets above that one whose
    requests *are* in the state (they completed while an earlier request waited to re-run;
    replay skips them). ``egress``: per egress partition, an offset at or before the first
    reply produced after the cut (a de-duplicating scan starts there). ``retries``: the
    conflict-aborted requests waiting to re-run at the cut. ``epoch_log``: one past this
    worker's newest epoch-log record at the cut (records of later epochs come after it;
    see ``sfaas.runtime.epochlog``). ``error``: empty, or why this worker's part failed
    (the round then fails; the next one retries).
    """

    TAG: ClassVar[int] = 12
    round: int
    index: int
    epoch: int
    stores: list[StoreCut]
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    egress: dict[int, int]
    retries: list[Retry]
    epoch_log: int
    error: str


@dataclass(frozen=True)
class RoundManifest:
    """A complete snapshot round: every store's snapshot plus what replay needs.

    ``ingress``: per ingress partition, the first offset not in the state; ``skip``: per
    partition, offsets above it whose requests are in the state; ``egress``: per
    egress partition, where a de-duplicating scan of replies starts; ``retries``:
    ``(tid, partition, offset, now)`` of requests waiting to re-run at the cut (their tids
    keep their priority on replay, and ``now`` is their first run's ``ctx.now()``);
    ``epoch_log``: the epoch-log offset from which the records of epochs after ``epoch``
    are found. ``workers`` and ``owners`` (``owners[p]``: the
    index owning partition ``p``; empty: round robin) are the membership and partition map
    the epochs after the round run under — a rescale switches at a round, so its round
    names the new ones.
    """

    round: int
    epoch: int
    workers: int
    partitions: int
    stores: tuple[StoreCut, ...]
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    egress: dict[int, int]
    retries: tuple[tuple[int, int, int, float, dict[str, Any]], ...] = ()
    epoch_log: int = 0
    started: float = 0.0
    created: float = field(default_factory=lambda: ports.current().clock.time())
    owners: tuple[int, ...] = ()

    @property
    def bytes_uploaded(self) -> int:
        return sum(s.bytes_uploaded for s in self.stores)

    @property
    def total_bytes(self) -> int:
        return sum(s.total_bytes for s in self.stores)

    @property
    def files(self) -> int:
        return sum(s.files for s in self.stores)

    def encode(self) -> bytes:
        return _encode(b"SFRM", {
            "round": self.round, "epoch": self.epoch, "workers": self.workers,
            "partitions": self.partitions,
            "stores": [[s.operator, s.partition, s.bytes_uploaded, s.files, s.total_bytes,
                        s.engine] for s in self.stores],
            "ingress": self.ingress, "skip": self.skip, "egress": self.egress,
            "retries": [list(r) for r in self.retries], "epoch_log": self.epoch_log,
            "started": self.started, "created": self.created, "owners": list(self.owners),
        })

    @classmethod
    def decode(cls, data: bytes, source: str = "round manifest") -> RoundManifest:
        d = _decode(b"SFRM", data, source, "round manifest")
        try:
            # (rows of five: a round written before the engine was recorded)
            stores = tuple(StoreCut(str(o), int(p), int(b), int(f), int(t), str(e[0] if e else ""))
                           for o, p, b, f, t, *e in d["stores"])
            # (a manifest written before re-runs kept their now has rows of three: the
            # round's start is the closest now it knows of; before journals, of four)
            retries = tuple(
                (int(r[0]), int(r[1]), int(r[2]), float(r[3] if len(r) >= 4 else d["started"]),
                 _journal(r[4] if len(r) == 5 else {}))
                for r in d["retries"] if len(r) in (3, 4, 5))
            if len(retries) != len(d["retries"]):
                raise RoundError("a retries row is not [tid, partition, offset, now, journal]")
            m = cls(int(d["round"]), int(d["epoch"]), int(d["workers"]), int(d["partitions"]),
                    stores, _int_map(d["ingress"], "ingress"), _skip_map(d["skip"]),
                    _int_map(d["egress"], "egress"), retries,
                    int(d["epoch_log"]), float(d["started"]), float(d["created"]),
                    tuple(int(o) for o in d.get("owners", ())))
            if m.owners and (len(m.owners) != m.partitions
                             or not all(0 <= o < m.workers for o in m.owners)):
                raise RoundError(f"owners must name one of {m.workers} workers for each of "
                                 f"{m.partitions} partitions, got {list(m.owners)!r:.80}")
        except RoundError as exc:
            raise RoundError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise RoundError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        return m


@dataclass(frozen=True)
class RoundIndex:
    """The complete rounds still retained, ascending."""

    rounds: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return _encode(b"SFRI", list(self.rounds))

    @classmethod
    def decode(cls, data: bytes, source: str = "round index") -> RoundIndex:
        body = _decode(b"SFRI", data, source, "round index")
        if not isinstance(body, list) or not all(isinstance(r, int) and r >= 1 for r in body) \
                or body != sorted(set(body)):
            raise RoundError(
                f"{source}: expected ascending distinct round ids >= 1, got {body!r:.80}")
        return cls(tuple(body))


def round_blob(round_id: int) -> str:
    return f"round-{round_id:012d}"


class Rounds:
    """The published rounds of one app (blocking calls: run them off the event loop)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def index(self) -> RoundIndex:
        data = self.remote.get_blob(INDEX_BLOB)
        if data is None:
            return RoundIndex()
        return RoundIndex.decode(data, f"{self.remote!r} blob {INDEX_BLOB!r}")

    def ids(self) -> list[int]:
        """Ids of the complete rounds retained, ascending."""
        return list(self.index().rounds)

    def read(self, round_id: int) -> RoundManifest:
        data = self.remote.get_blob(round_blob(round_id))
        if data is None:
            raise RoundError(f"round {round_id} is listed but its manifest "
                             f"{round_blob(round_id)!r} is missing")
        return RoundManifest.decode(data, f"{self.remote!r} blob {round_blob(round_id)!r}")

    def latest(self) -> RoundManifest | None:
        ids = self.ids()
        return self.read(ids[-1]) if ids else None

    def publish(self, manifest: RoundManifest, retain: int, known: Sequence[int] | None = None,
                stale: Iterable[int] = ()) -> tuple[list[int], list[int]]:
        """Write the round, then the index naming it (the publish step); returns
        ``(retained, dropped)`` round ids. The dropped rounds' blobs are deleted last.

        ``known``: the index as this writer last wrote or read it, when it is the index's
        only writer (the coordinator): the index is then not read again. ``None`` reads it.
        ``stale``: rounds whose blobs a publish that failed midway may have left (listed
        or not); those not retained now are deleted with the dropped ones.
        """
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        self.remote.put_blob(round_blob(manifest.round), manifest.encode())
        ids = sorted(set(self.ids() if known is None else known) | {manifest.round})
        retained, dropped = ids[-retain:], ids[:-retain]
        self.remote.put_blob(INDEX_BLOB, RoundIndex(tuple(retained)).encode())
        dropped = sorted(set(dropped) | (set(stale) - set(retained)))
        for r in dropped:
            self.remote.delete_blob(round_blob(r))
        return retained, dropped


def publish_round(
    remote: Remote, manifest: RoundManifest, retain: int, known: Sequence[int] | None = None,
    stale: Iterable[int] = (),
) -> tuple[list[int], list[int]]:
    """:meth:`Rounds.publish` as a top-level function with picklable arguments (the
    coordinator runs it in a background process, like :func:`collect_store_garbage`)."""
    return Rounds(remote).publish(manifest, retain, known, stale)


def collect_garbage(
    stores: Iterable[tuple[str, int]], remote_of: Callable[[str, int], Remote], retained: list[int],
    pause: float = 0.0,
) -> tuple[int, int]:
    """Delete the store snapshots no retained round needs, then their unreferenced files.

    A store snapshot older than the newest retained round and not retained itself is
    unpublished (rounds that failed midway leave such snapshots), all of a store's in one
    request; snapshots newer than the newest retained round may belong to a round in flight
    and stay. Files are deleted by :meth:`Remote.gc`, which keeps files newer than the
    newest manifest (an upload in flight). ``pause``: seconds to sleep between two stores,
    so the requests (and the object store's CPU they cost) spread out instead of landing
    on the cores the epochs run on at once. Returns ``(snapshots dropped, bytes deleted)``.
    """
    if not retained:
        return 0, 0
    keep, newest = set(retained), max(retained)
    dropped = freed = 0
    for i, (op, p) in enumerate(stores):
        if i and pause > 0:
            time.sleep(pause)
        remote = remote_of(op, p)
        try:
            ids = remote.list_snapshots()
            drop = [sid for sid in ids if sid < newest and sid not in keep]
            if drop:
                remote.delete_snapshots(drop)
                dropped += len(drop)
            left = len(ids) - len(drop)
            if left:
                freed += remote.gc(keep=left).bytes_deleted
        finally:
            remote.close()
    return dropped, freed


def collect_store_garbage(
    remotes: Sequence[tuple[str, int, Remote]], retained: list[int], pause: float = 0.0,
) -> tuple[int, int]:
    """:func:`collect_garbage` over ``(operator, partition, remote)`` triples: a top-level
    function with picklable arguments, so the coordinator can run it in a background
    process (``statestores.background``, lane ``upload``)."""
    by_store = {(op, p): r for op, p, r in remotes}
    return collect_garbage(list(by_store), lambda op, p: by_store[(op, p)], retained, pause)


def _journal(j: Any) -> dict[str, Any]:
    if type(j) is not dict or not all(type(k) is str and type(v) is list and len(v) == 2
                                      for k, v in j.items()):
        raise RoundError(f"a journal must map effect keys to [ok, value], got {j!r:.80}")
    return j
