"""A simulated object store: :class:`SimObjectStore` (the MinIO server: objects by key) and
:class:`SimRemote`, a ``remotes.base.Remote`` on one prefix of it — in memory, with
seeded errors and latency. ``tests/sim/test_objects_contract.py`` runs the remotes'
contract (tests/remotes/test_contract.py) against it.

Objects are whole ``bytes`` under S3-like keys (``<prefix>/files/<name>``,
``<prefix>/manifests/<id:%020d>.manifest``, ``<prefix>/blobs/<name>``); a put replaces an
object atomically, as an S3 PUT does. Each write takes the next *stamp* (a counter, not the
wall clock), which ``gc`` compares as the other remotes compare modification times.

Faults, as ``remotes.minio.MinioRemote`` shows them to its callers — it retries each
request (``remotes._retry.retry_call`` under its ``RetryPolicy``) and raises
``RemoteError`` only once its retries are spent; the store makes the same tries:

* ``error`` (a probability, drawn from the seeded ``random.Random`` per *try*): the try
  fails (nothing changed) and the call backs off as ``RetryPolicy`` says (``delay``'s
  equal jitter, drawn from the same seeded source) and tries again; it fails with
  ``RemoteError`` only when every try failed — ``retry.attempts`` (6) tries, or fewer once
  the next backoff would pass ``retry.deadline`` (10 s) since the first. So a transient
  0.2 fails a call with p 0.2**6 (6.4e-5), and 1.0 after 6 tries and 3.9–7.8 s of backoff
  (counted in ``waited`` and against the deadline; passed through ``backoff_sleep``);
* ``latency`` (seconds, uniform in [low, high]): each try takes that long;
* :meth:`SimObjectStore.outage`: for a while every call keeps retrying and fails after the
  retry deadline (``RetryPolicy().deadline``, 10 s), or succeeds once the outage ends
  within it.

Time passes through ``sleep`` (default: none passes; under ``sfaas.sim.clock`` give
``VirtualClock.advance`` and ``clock=lambda: virtual_clock.now``: a call inside the loop
is a blocking call that took that long), a retry's backoff through ``backoff_sleep``
(default: none passes). Apart because the product makes its object-store calls in
threads (``asyncio.to_thread``), its processes going on while one backs off, but the
virtual loop runs them inline: a backoff given to ``VirtualClock.advance`` stops every
simulated process at once, and a round's seconds of backoff under 0.2 fence the whole
cluster (``heartbeat_timeout``, 2 s) as no real one is. ``sfaas.sim.cluster`` gives none:
there a retried call takes no virtual time.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from remotes._gc import plan_gc
from remotes._layout import (
    BLOBS,
    FILES,
    MANIFESTS,
    check_name,
    check_snapshot_id,
    manifest_name,
    parse_manifest_name,
)
from remotes._retry import RetryPolicy
from remotes.base import GcInfo, Remote
from remotes.errors import RemoteError, SnapshotNotFoundError
from remotes.manifest import Manifest

__all__ = ["ObjectFaults", "SimObjectStore", "SimRemote"]

#: stores alive in this process, by number: what a pickled SimRemote finds its store by
_STORES: weakref.WeakValueDictionary[int, SimObjectStore] = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()


@dataclass
class ObjectFaults:
    """What goes wrong with each call (see the module docstring)."""

    error: float = 0.0
    latency: tuple[float, float] = (0.0, 0.0)


class SimObjectStore:
    """The simulated server: every object of every prefix, one lock, one random source."""

    def __init__(self, rng: random.Random | None = None, faults: ObjectFaults | None = None,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] | None = None,
                 retry: RetryPolicy | None = None,
                 on_event: Callable[[str], None] | None = None,
                 backoff_sleep: Callable[[float], None] | None = None) -> None:
        self.rng = rng if rng is not None else random.Random(0)
        #: told of every object written or deleted (``"put KEY"``, ``"delete KEY"``)
        self.on_event = on_event
        self.faults = faults if faults is not None else ObjectFaults()
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.lock = threading.RLock()
        self._sleep = sleep
        self._backoff_sleep = backoff_sleep
        self._clock = clock
        self.retry = retry if retry is not None else RetryPolicy()
        #: seconds of latency, outage and backoff the calls took so far
        self.waited = 0.0
        self.down_until = float("-inf")
        self._stamp = 0
        #: calls made, their tries, and the tries that failed (``faults.error``)
        self.calls = 0
        self.tries = 0
        self.failed_tries = 0
        self.number = next(_NUMBERS)
        _STORES[self.number] = self

    def remote(self, prefix: str) -> SimRemote:
        """A remote on ``prefix`` (a bucket + prefix of MinIO)."""
        return SimRemote(self, prefix)

    def outage(self, seconds: float) -> None:
        """Every call fails (after the retry deadline) for ``seconds`` from now (needs
        ``clock``)."""
        if self._clock is None:
            raise RuntimeError("SimObjectStore.outage needs a clock (SimObjectStore(clock=...))")
        self.down_until = max(self.down_until, self._clock() + seconds)

    def stamp(self) -> int:
        self._stamp += 1
        return self._stamp

    def _wait(self, seconds: float) -> None:
        self.waited += seconds
        if self._sleep is not None and seconds > 0:
            self._sleep(seconds)

    def backoff(self, failed: int) -> float:
        """The pause before the next try after ``failed`` tries failed:
        ``RetryPolicy.delay``'s equal jitter, drawn from the seeded source (the policy's
        own draws from the unseeded ``random`` module)."""
        d = min(self.retry.max_delay, self.retry.base_delay * 2.0 ** (failed - 1))
        with self.lock:
            return d / 2 + self.rng.uniform(0, d / 2)

    def call(self, op: str, key: str) -> None:
        """One call's faults, before it acts: its tries as ``remotes._retry.retry_call``
        makes them — each its latency, an outage, a drawn error — with the policy's backoff
        between them; ``RemoteError`` once every try failed."""
        policy = self.retry
        spent = 0.0  # (since the first try began: retry_call's elapsed)
        tries = 0
        with self.lock:
            self.calls += 1
        while True:
            tries += 1
            with self.lock:
                self.tries += 1
                low, high = self.faults.latency
                latency = self.rng.uniform(low, high) if high > 0 else 0.0
                fails = self.faults.error > 0 and self.rng.random() < self.faults.error
            self._wait(latency)
            spent += latency
            if self._clock is not None and self._clock() < self.down_until:
                left = self.down_until - self._clock()
                if spent + left > policy.deadline:
                    self._wait(max(0.0, policy.deadline - spent))
                    raise RemoteError(f"sim://{key}: {op} failed after {policy.deadline:.1f}s "
                                      "of tries: simulated outage")
                self._wait(left)
                spent += left
            if not fails:
                return
            with self.lock:
                self.failed_tries += 1
            pause = self.backoff(tries) if tries < policy.attempts else 0.0
            if tries >= policy.attempts or spent + pause > policy.deadline:
                raise RemoteError(f"sim://{key}: {op} failed after {tries} tries in "
                                  f"{spent:.1f}s: simulated error")
            self.waited += pause
            if self._backoff_sleep is not None:
                self._backoff_sleep(pause)
            spent += pause


class SimRemote(Remote):
    """A ``Remote`` on ``prefix`` of a :class:`SimObjectStore`. Thread-safe; pickles (in
    this process) to a remote on the same store and prefix."""

    def __init__(self, store: SimObjectStore, prefix: str) -> None:
        self._store = store
        self.prefix = prefix.strip("/")

    def __reduce__(self) -> tuple[Callable[[int, str], SimRemote], tuple[int, str]]:
        return (_attach, (self._store.number, self.prefix))

    def __repr__(self) -> str:
        return f"SimRemote({self.prefix!r})"

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}/{kind}/{name}"

    def _list(self, kind: str) -> dict[str, tuple[bytes, int]]:
        head = f"{self.prefix}/{kind}/"
        with self._store.lock:
            return {k[len(head):]: v for k, v in self._store.objects.items() if k.startswith(head)}

    def _put(self, key: str, data: bytes) -> None:
        with self._store.lock:
            self._store.objects[key] = (data, self._store.stamp())
        if self._store.on_event is not None:
            self._store.on_event(f"put {key}")

    def _get(self, key: str) -> bytes | None:
        with self._store.lock:
            found = self._store.objects.get(key)
        return None if found is None else found[0]

    def _delete(self, key: str) -> None:
        with self._store.lock:
            gone = self._store.objects.pop(key, None)
        if gone is not None and self._store.on_event is not None:
            self._store.on_event(f"delete {key}")

    # -- files --
    def put_file(self, name: str, path: str | os.PathLike[str]) -> int:
        key = self._key(FILES, check_name(name))
        data = Path(path).read_bytes()
        self._store.call("put file", key)
        self._put(key, data)
        return len(data)

    def get_file(self, name: str, path: str | os.PathLike[str]) -> int:
        key = self._key(FILES, check_name(name))
        self._store.call("get file", key)
        data = self._get(key)
        if data is None:
            raise RemoteError(f"sim://{key}: no file {name!r}")
        dst = Path(path)
        tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex}.part")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        return len(data)

    def list_files(self) -> dict[str, int]:
        self._store.call("list files", self._key(FILES, ""))
        return {n: len(d) for n, (d, _) in self._list(FILES).items()}

    def delete_file(self, name: str) -> None:
        key = self._key(FILES, check_name(name))
        self._store.call("delete file", key)
        self._delete(key)

    # -- manifests --
    def write_manifest(self, manifest: Manifest) -> None:
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a remotes.Manifest, got {type(manifest).__name__}")
        key = self._key(MANIFESTS, manifest_name(manifest.snapshot_id))
        self._store.call("write manifest", key)
        self._put(key, manifest.encode())

    def read_manifest(self, snapshot_id: int) -> Manifest:
        key = self._key(MANIFESTS, manifest_name(snapshot_id))
        self._store.call("read manifest", key)
        data = self._get(key)
        if data is None:
            raise SnapshotNotFoundError(f"sim://{key}: no snapshot {snapshot_id}")
        m = Manifest.decode(data, source=f"sim://{key}")
        if m.snapshot_id != snapshot_id:
            raise RemoteError(f"sim://{key}: holds the manifest of snapshot {m.snapshot_id}")
        return m

    def list_snapshots(self) -> list[int]:
        self._store.call("list manifests", self._key(MANIFESTS, ""))
        return sorted(i for i in map(parse_manifest_name, self._list(MANIFESTS)) if i is not None)

    def delete_snapshot(self, snapshot_id: int) -> None:
        key = self._key(MANIFESTS, manifest_name(check_snapshot_id(snapshot_id)))
        self._store.call("delete manifest", key)
        self._delete(key)

    # -- blobs --
    def put_blob(self, name: str, data: bytes) -> None:
        key = self._key(BLOBS, check_name(name))
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob {name!r}: data must be bytes, got {type(data).__name__}")
        self._store.call("put blob", key)
        self._put(key, bytes(data))

    def get_blob(self, name: str) -> bytes | None:
        key = self._key(BLOBS, check_name(name))
        self._store.call("get blob", key)
        return self._get(key)

    def delete_blob(self, name: str) -> None:
        key = self._key(BLOBS, check_name(name))
        self._store.call("delete blob", key)
        self._delete(key)

    # -- lifecycle --
    def gc(self, keep: int) -> GcInfo:
        """As the other remotes' (``remotes._gc.plan_gc``), write stamps for mtimes."""
        with self._store.lock:
            manifests = {parse_manifest_name(n): s for n, (_, s) in self._list(MANIFESTS).items()}
            files = [(n, len(d), float(s)) for n, (d, s) in self._list(FILES).items()]
            plan = plan_gc(self.list_snapshots(), keep, self.read_manifest, files,
                           lambda sid: float(manifests[sid]))
            for sid in plan.drop_snapshots:
                self.delete_snapshot(sid)
            for name in plan.drop_files:
                self.delete_file(name)
        return GcInfo(plan.drop_snapshots, len(plan.drop_files), sum(plan.drop_files.values()))

    def destroy(self) -> None:
        """Delete every object under the prefix (no fault: a test's cleanup)."""
        head = f"{self.prefix}/"
        with self._store.lock:
            for key in [k for k in self._store.objects if k.startswith(head)]:
                del self._store.objects[key]


def _attach(number: int, prefix: str) -> SimRemote:
    store = _STORES.get(number)
    if store is None:
        raise RemoteError(f"SimRemote({prefix!r}): its store is not in this process (an "
                          "in-memory store is not shared between processes)")
    return SimRemote(store, prefix)
