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

Encoding (``sfaas/runtime/FORMAT.md`` § "Epoch log"): ``b"SFEL" | version:u8 | msgpack([epoch,
worker, now, [[tid, partition, offset], ...], [[tid, now], ...]])``; version 1 (no last
element) still decodes. Kafka checksums the record.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

__all__ = ["EpochRecord", "EpochLogError", "Logged"]

_HEAD = struct.Struct("<4sB")
_MAGIC = b"SFEL"
_VERSION = 2
_VERSIONS = (1, 2)  # 1: no re-runs' nows (written before they were logged)


class EpochLogError(ValueError):
    """A record of the epoch log that does not decode (names the record and the fault)."""


class Logged(Protocol):
    """What the log needs of a batch's item: where it came from and the ``now`` it runs with."""

    partition: int
    offset: int
    now: float


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

    @classmethod
    def of(
        cls, epoch: int, worker: int, now: float, batch: Sequence[tuple[int, Logged]]
    ) -> EpochRecord:
        """The record of ``batch`` (``(tid, item)``), begun at ``now``: re-runs keep their
        first run's ``now``, so theirs is recorded too."""
        return cls(epoch, worker, now, tuple((tid, it.partition, it.offset) for tid, it in batch),
                   tuple((tid, it.now) for tid, it in batch if it.now != now))

    def nows(self) -> list[float]:
        """The ``now`` each root of the batch ran with, in batch order: a re-run's its first
        run's, a new one's the epoch's."""
        kept = dict(self.kept_now)
        return [kept.get(tid, self.now) for tid, _, _ in self.batch]

    def encode(self) -> bytes:
        body: bytes = msgpack.packb(
            [self.epoch, self.worker, self.now, [list(b) for b in self.batch],
             [list(k) for k in self.kept_now]], use_bin_type=True)
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
            d: Any = msgpack.unpackb(data[_HEAD.size:], raw=False)
            epoch, worker, now, batch, kept = d if version == 2 else (*d, [])
            rec = cls(int(epoch), int(worker), float(now),
                      tuple((int(t), int(p), int(o)) for t, p, o in batch),
                      tuple((int(t), float(n)) for t, n in kept))
        except Exception as exc:
            raise EpochLogError(f"{source}: malformed body ({type(exc).__name__}: {exc})") from None
        if rec.epoch < 1 or rec.worker < 0:
            raise EpochLogError(f"{source}: epoch {rec.epoch} / worker {rec.worker} out of range")
        if not {t for t, _ in rec.kept_now} <= {t for t, _, _ in rec.batch}:
            raise EpochLogError(f"{source}: a re-run's now names a tid not in the batch")
        return rec
