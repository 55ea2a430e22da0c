"""The epoch log: what each worker took into each epoch, durable in Kafka before replies leave.

Batch boundaries depend on timing, so re-executing from a snapshot's ingress offsets would
not reproduce the first execution. Each worker therefore writes one :class:`EpochRecord`
per epoch in which it ran anything — the epoch, its ``now``, its batch as ``(tid,
ingress partition, offset)``, and the ``now`` each re-run in it kept from its first run
(``ctx.now()`` is a transaction's first epoch's, on every run) — to the app's
single-partition epoch-log topic, with the idempotent ``acks=all`` producer. The write
starts when the batch is taken and overlaps execution; the worker's report to the
coordinator waits for the acknowledgement. Since a ``Commit`` needs every worker's report,
an epoch's replies leave only once every worker's record of it is durable. Replaying the
records of the epochs after a round, with the same tids and ``now``, reproduces the same
results (execution is deterministic given the batch).

An epoch in which a worker ran nothing has no record from it. Ordering: every record of
epoch ``e + 1`` follows every record of epoch ``e`` in the log (``Begin e+1`` comes after
``Commit e``, which comes after every worker's acknowledged record of ``e``).

Two kinds of roots need more than their ingress position: a root whose request carries a
journal of ``ctx.run`` outcomes (``sfaas.runtime.txn.effects``) has it logged, so a replay
sees exactly the outcomes its first execution saw; and a request the runtime made itself
(a timer firing, a post-commit action's cleanup: ``sfaas.runtime.txn.internal``), which
no ingress partition holds, is logged whole, at partition ``-1``; so is a request a client
sent straight to the worker (``worker.direct``), at offset ``-1`` of its key's partition:
the record is what makes it durable, and its reply leaves only after the epoch commits.

A second kind of record, :class:`CutRecord`, holds what a snapshot round's cut needs of
the direct requests and is not in the stores: the replies no client acknowledged yet
and the direct requests waiting to re-run. A worker writes it after the round's cut and
before its round report, so a recovery to that round, reading the log from the round's
position, finds it (``decode_record`` tells the two kinds apart).

Fences. A record handed to Kafka may land long after its writer gave up on it (its
delivery timed out, its process died or paused with the bytes in a socket), after a
recovery has read the log: that recovery neither replays its epoch nor knows its requests
were taken, and takes them again in a new epoch, and a later recovery would find both
records and run those requests twice. So every worker begins each recovery's reads by
writing a :class:`FenceRecord` through its own producer and reading the log at least up
to it (a stale leader's short end cannot hide a record before it), and every epoch record
names the offset of its writer's newest fence when it was sent. A record of worker ``w``
at offset ``o`` naming fence ``f`` is *void* — no recovery replays it — when a fence of
``w`` lies between ``f`` and ``o`` (:func:`live`): it was sent before that fence and
landed after it, so no recovery that read the log past the fence saw it, and none ever
will. Only a fence of the record's generation or a later one counts: a process that lost
its slot may still land a fence it handed to its producer before (cut from the brokers,
paused), after its successor's records, and no recovery that counts read up to it.

Encoding (``sfaas/runtime/FORMAT.md`` § "Epoch log"): ``b"SFEL" | version:u8 | msgpack([epoch,
worker, now, [[tid, partition, offset], ...], [[tid, now], ...], [[tid, {effect key: [ok,
value]}], ...], [[tid, operator, key, function, args], ...], generation, [[tid, request
record], ...], fence])``;
versions 1 (no last six elements), 2 (no last five), 3 (no last three), 4 (no direct
requests) and 5 (no fence, read as -1) still decode. A cut record: ``b"SFDC" | 1:u8 |
msgpack([round, epoch, worker, [[partition, reply record, age], ...], [[tid, partition,
now, journal, request record], ...]])``; a fence record: ``b"SFEF" | 1:u8 |
msgpack([worker, generation, attempt])``; a start record: ``b"SFCS" | 1:u8 | msgpack([at])``.
Kafka checksums the record.

Starts. A restarted coordinator must know whether the cluster ran before (then it recovers
to the newest round before any epoch; a new cluster starts at once). The log's end is no
answer: a stale leader answers one short, down to 0, and a used cluster taken for a new
one runs no recovery — requests in flight are never answered, or consumed again. So a
coordinator begins by writing a :class:`StartRecord` (``acks=all``: the partition's real
leader appends it) and reads the log up to it: the cluster ran before when anything but
start records lies before it (:func:`used_before`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

__all__ = ["AnyRecord", "CutRecord", "EpochLogError", "EpochRecord", "FenceRecord", "Logged",
           "StartRecord", "decode_record", "live", "used_before"]

_HEAD = struct.Struct("<4sB")
_MAGIC = b"SFEL"
_VERSION = 6
# 1: no re-runs' nows; 2: no journals and runtime requests; 3: no generation; 4: no direct
# requests; 5: no fence
_VERSIONS = (1, 2, 3, 4, 5, 6)


class EpochLogError(ValueError):
    """A record of the epoch log that does not decode (names the record and the fault)."""


class Logged(Protocol):
    """What the log needs of a batch's item: where it came from, the ``now`` it runs with,
    its journal of effect outcomes, and — for a request the runtime made (``partition``
    -1) — the request: ``(operator, key, function, args)``."""

    partition: int
    offset: int
    now: float
    journal: dict[str, Any]

    def runtime_request(self) -> tuple[str, str, str, list[Any]] | None: ...

    def direct_record(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One worker's batch of one epoch."""

    epoch: int
    worker: int
    now: float
    #: ``(tid, ingress partition, offset)`` in batch order (re-runs first, then new requests)
    batch: tuple[tuple[int, int, int], ...]
    #: ``(tid, now)`` of the batch's roots whose ``now`` is not the epoch's: re-runs, which
    #: keep their first run's
    kept_now: tuple[tuple[int, float], ...] = ()
    #: ``(tid, journal)`` of the roots that ran with effect outcomes
    journals: tuple[tuple[int, dict[str, Any]], ...] = ()
    #: ``(tid, operator, key, function, args)`` of the requests the runtime made
    runtime: tuple[tuple[int, str, str, str, list[Any]], ...] = ()
    #: the generation of the process that wrote it (``wire.Assign.generation``; 0: a record
    #: of version 3 or older)
    generation: int = 0
    #: ``(tid, request record)`` of the requests a client sent straight to the worker
    #: (``worker.direct``; at ingress offset -1 of their key's partition)
    direct: tuple[tuple[int, bytes], ...] = ()
    #: the log offset of the writer's newest :class:`FenceRecord` when it sent this record
    #: (-1: none, or a record of version 5 or older): see :func:`live`
    fence: int = -1

    @classmethod
    def of(
        cls, epoch: int, worker: int, now: float, batch: Sequence[tuple[int, Logged]],
        generation: int = 0, fence: int = -1,
    ) -> EpochRecord:
        """The record of ``batch`` (``(tid, item)``), begun at ``now``: re-runs keep their
        first run's ``now``, so theirs is recorded too."""
        runtime, direct = [], []
        for tid, it in batch:
            if it.offset >= 0:
                continue
            if it.partition < 0:
                req = it.runtime_request()
                assert req is not None, "an item without an ingress position is the runtime's"
                runtime.append((tid, *req))
            else:
                raw = it.direct_record()
                assert raw is not None, "an item at offset -1 of a partition is a direct one"
                direct.append((tid, raw))
        return cls(epoch, worker, now, tuple((tid, it.partition, it.offset) for tid, it in batch),
                   tuple((tid, it.now) for tid, it in batch if it.now != now),
                   tuple((tid, dict(it.journal)) for tid, it in batch if it.journal),
                   tuple(runtime), generation, tuple(direct), fence)

    def nows(self) -> list[float]:
        """The ``now`` each root of the batch ran with, in batch order: a re-run's its first
        run's, a new one's the epoch's."""
        kept = dict(self.kept_now)
        return [kept.get(tid, self.now) for tid, _, _ in self.batch]

    def encode(self) -> bytes:
        body: bytes = msgpack.packb(
            [self.epoch, self.worker, self.now, [list(b) for b in self.batch],
             [list(k) for k in self.kept_now], [list(j) for j in self.journals],
             [list(r) for r in self.runtime], self.generation, [list(d) for d in self.direct],
             self.fence],
            use_bin_type=True)
        return _HEAD.pack(_MAGIC, _VERSION) + body

    @classmethod
    def decode(cls, data: bytes, source: str = "epoch-log record") -> EpochRecord:
        if len(data) < _HEAD.size:
            raise EpochLogError(f"{source}: {len(data)} bytes, too short")
        magic, version = _HEAD.unpack_from(data)
        if magic != _MAGIC or version not in _VERSIONS:
            raise EpochLogError(f"{source}: header {magic!r} v{version}, "
                                f"expected {_MAGIC!r} v1 or v{_VERSION}")
        try:
            d: Any = msgpack.unpackb(data[_HEAD.size:], raw=False, strict_map_key=False)
            d = list(d) + [[]] * (7 - len(d)) if version < 3 else list(d)
            d = d + [0] if version < 4 else d
            d = d + [[]] if version < 5 else d
            d = d + [-1] if version < 6 else d
            epoch, worker, now, batch, kept, journals, runtime, generation, direct, fence = d
            if type(generation) is not int or generation < 0:
                raise ValueError(f"the generation must be an int >= 0, got {generation!r:.40}")
            if type(fence) is not int or fence < -1:
                raise ValueError(f"the fence must be an offset or -1, got {fence!r:.40}")
            rec = cls(int(epoch), int(worker), float(now),
                      tuple((int(t), int(p), int(o)) for t, p, o in batch),
                      tuple((int(t), float(n)) for t, n in kept),
                      tuple((int(t), _journal(j)) for t, j in journals),
                      tuple((int(t), str(op), str(k), str(f), list(a))
                            for t, op, k, f, a in runtime), generation,
                      tuple((int(t), _record(r)) for t, r in direct), fence)
        except Exception as exc:
            raise EpochLogError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        if rec.epoch < 1 or rec.worker < 0:
            raise EpochLogError(f"{source}: epoch {rec.epoch} / worker {rec.worker} out of range")
        tids = {t for t, _, _ in rec.batch}
        if not {t for t, _ in rec.kept_now} <= tids:
            raise EpochLogError(f"{source}: a re-run's now names a tid not in the batch")
        if not {t for t, _ in rec.journals} <= tids:
            raise EpochLogError(f"{source}: a journal names a tid not in the batch")
        if {t for t, *_ in rec.runtime} != {t for t, p, _ in rec.batch if p < 0}:
            raise EpochLogError(f"{source}: the runtime's requests do not match the batch's "
                                "entries at partition -1")
        if {t for t, _ in rec.direct} != {t for t, p, o in rec.batch if p >= 0 > o}:
            raise EpochLogError(f"{source}: the direct requests do not match the batch's "
                                "entries at offset -1")
        return rec

    def runtime_requests(self) -> dict[int, tuple[str, str, str, list[Any]]]:
        """tid → the request the runtime made, for the batch's entries at partition -1."""
        return {t: (op, k, f, a) for t, op, k, f, a in self.runtime}


def _record(r: Any) -> bytes:
    if type(r) is not bytes:
        raise ValueError(f"a direct request must be a request record (bytes), got {r!r:.80}")
    return r


def _journal(j: Any) -> dict[str, Any]:
    if type(j) is not dict or not all(type(k) is str and type(v) is list and len(v) == 2
                                      and type(v[0]) is bool for k, v in j.items()):
        raise ValueError(f"a journal must map effect keys to [ok, value], got {j!r:.80}")
    return j


def _body(data: bytes, magic: bytes, version: int, source: str) -> bytes:
    """The body of a record of kind ``magic``, version ``version``; the header checked."""
    if len(data) < _HEAD.size:
        raise EpochLogError(f"{source}: {len(data)} bytes, too short")
    got, v = _HEAD.unpack_from(data)
    if got != magic or v != version:
        raise EpochLogError(f"{source}: header {got!r} v{v}, expected {magic!r} v{version}")
    return data[_HEAD.size:]


_CUT_MAGIC = b"SFDC"
_CUT_VERSION = 1


@dataclass(frozen=True, slots=True)
class CutRecord:
    """What one worker's cut of snapshot round ``round`` (taken after epoch ``epoch``)
    holds of its direct requests (see the module docstring)."""

    round: int
    epoch: int
    worker: int
    #: ``(partition, reply record, age in seconds at the cut)`` of replies not yet
    #: acknowledged by their client
    replies: tuple[tuple[int, bytes, float], ...]
    #: ``(tid, partition, now, journal, request record)`` of direct requests waiting to
    #: re-run (or parked at an effect), which keep their tid, first ``now`` and journal
    retries: tuple[tuple[int, int, float, dict[str, Any], bytes], ...]

    def encode(self) -> bytes:
        body: bytes = msgpack.packb(
            [self.round, self.epoch, self.worker, [list(r) for r in self.replies],
             [list(r) for r in self.retries]], use_bin_type=True)
        return _HEAD.pack(_CUT_MAGIC, _CUT_VERSION) + body

    @classmethod
    def decode(cls, data: bytes, source: str = "epoch-log cut record") -> CutRecord:
        body = _body(data, _CUT_MAGIC, _CUT_VERSION, source)
        try:
            rnd, epoch, worker, replies, retries = msgpack.unpackb(
                body, raw=False, strict_map_key=False)
            rec = cls(int(rnd), int(epoch), int(worker),
                      tuple((int(p), _record(r), float(a)) for p, r, a in replies),
                      tuple((int(t), int(p), float(n), _journal(j), _record(r))
                            for t, p, n, j, r in retries))
        except Exception as exc:
            raise EpochLogError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        if rec.round < 1 or rec.worker < 0:
            raise EpochLogError(f"{source}: round {rec.round} / worker {rec.worker} out of range")
        return rec


_FENCE_MAGIC = b"SFEF"
_FENCE_VERSION = 1


@dataclass(frozen=True, slots=True)
class FenceRecord:
    """Worker ``worker`` (of generation ``generation``) begins recovery ``attempt`` here:
    its records sent before this one and landing after it are void (see :func:`live`)."""

    worker: int
    generation: int
    attempt: int

    def encode(self) -> bytes:
        body: bytes = msgpack.packb([self.worker, self.generation, self.attempt])
        return _HEAD.pack(_FENCE_MAGIC, _FENCE_VERSION) + body

    @classmethod
    def decode(cls, data: bytes, source: str = "epoch-log fence record") -> FenceRecord:
        body = _body(data, _FENCE_MAGIC, _FENCE_VERSION, source)
        try:
            worker, generation, attempt = msgpack.unpackb(body)
            if not all(type(x) is int and x >= 0 for x in (worker, generation, attempt)):
                raise ValueError(f"three ints >= 0 expected, got {[worker, generation, attempt]}")
        except Exception as exc:
            raise EpochLogError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        return cls(worker, generation, attempt)


_START_MAGIC = b"SFCS"
_START_VERSION = 1


@dataclass(frozen=True, slots=True)
class StartRecord:
    """A coordinator started here, at Unix time ``at``. Its offset bounds the startup's
    read: every record before it was in the log when the coordinator began, whatever a
    stale leader answers (see the module docstring, "Starts"). No recovery replays it."""

    at: float

    def encode(self) -> bytes:
        body: bytes = msgpack.packb([self.at])
        return _HEAD.pack(_START_MAGIC, _START_VERSION) + body

    @classmethod
    def decode(cls, data: bytes, source: str = "epoch-log start record") -> StartRecord:
        body = _body(data, _START_MAGIC, _START_VERSION, source)
        try:
            (at,) = msgpack.unpackb(body)
            if type(at) not in (int, float) or not at >= 0:
                raise ValueError(f"a time >= 0 expected, got {at!r:.40}")
        except Exception as exc:
            raise EpochLogError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        return cls(float(at))


AnyRecord = EpochRecord | CutRecord | FenceRecord | StartRecord


def decode_record(data: bytes, source: str = "epoch-log record") -> AnyRecord:
    """An epoch-log record of any kind (see the module docstring)."""
    if len(data) >= _HEAD.size and data[:4] == _CUT_MAGIC:
        return CutRecord.decode(data, source)
    if len(data) >= _HEAD.size and data[:4] == _FENCE_MAGIC:
        return FenceRecord.decode(data, source)
    if len(data) >= _HEAD.size and data[:4] == _START_MAGIC:
        return StartRecord.decode(data, source)
    return EpochRecord.decode(data, source)


def live(records: Sequence[tuple[int, AnyRecord]], start: int) -> list[tuple[int, AnyRecord]]:
    """The records of a read of the log from offset ``start`` (``(offset, record)`` in
    offset order) that count: the epoch records a fence voids, the fences themselves and
    the coordinators' start records left out (see the module docstring, "Fences").

    Worker ``w``'s epoch record at offset ``o`` is void when a fence of ``w`` lies between
    the fence the record names and ``o``: a fence read here, or one before ``start`` that
    a later record of ``w`` names (a record sent after a fence names it) — a fence of the
    record's generation or a later one. An earlier generation's fence voids nothing of a
    later one: its process lost the slot (a stopped or cut worker whose fence was still in
    its producer lands it after its successor's records), and what its recovery read was
    never the slot's history."""
    floors: dict[int, dict[int, int]] = {}  # worker → generation → its newest fence

    def fenced(worker: int, generation: int, at: int) -> None:
        gens = floors.setdefault(worker, {})
        gens[generation] = max(gens.get(generation, -1), at)

    for _, r in records:
        if isinstance(r, EpochRecord) and 0 <= r.fence < start:
            fenced(r.worker, r.generation, r.fence)
    out: list[tuple[int, AnyRecord]] = []
    for o, r in records:
        if isinstance(r, FenceRecord):
            fenced(r.worker, r.generation, o)
        elif isinstance(r, StartRecord):
            continue
        elif isinstance(r, CutRecord) or r.fence >= max(
                (at for gen, at in floors.get(r.worker, {}).items() if gen >= r.generation),
                default=-1):
            out.append((o, r))
    return out


#: How many records before its start record a coordinator reads (:func:`used_before`).
START_WINDOW = 64


def used_before(records: Sequence[tuple[int, bytes]], start: int, beginning: int = 0) -> bool:
    """Did a cluster run on the log before the start record at offset ``start``?
    ``records``: ``(offset, value)`` read from ``max(beginning, start - START_WINDOW)``
    (``beginning``: the log's first offset). Any record but a start record before
    ``start`` says yes — one that does not decode too (a foreign writer: never take a log
    that holds something for an empty one) — and so do offsets of the window without a
    record, and start records alone that do not reach offset 0 (a recovery of a cluster
    that never ran finds nothing to restore: the safe mistake)."""
    frm = max(beginning, start - START_WINDOW)
    before = [v for o, v in records if frm <= o < start]
    if len(before) < start - frm or any(not v.startswith(_START_MAGIC) for v in before):
        return True  # (offsets with no record: not ours to judge, so not empty)
    return frm > 0
