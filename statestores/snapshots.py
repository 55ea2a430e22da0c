"""Snapshot and restore orchestration, shared by every engine.

A snapshot is a set of file names plus the version's entries. :func:`freeze` asks the
engine to make its state immutable files *cheaply* — an engine may hand in-memory
regions to its maintainer thread and return futures for files still being written —
pins those names, and queues :func:`upload` on the store's uploader thread, which waits
for the files, uploads only those the remote lacks, and publishes the manifest last.

A restore pins the snapshot's files (so nothing deletes them while it downloads), fetches
the missing or damaged ones, waits for background work to stop (without holding the
store lock), and asks the engine to become exactly that version.

A restore waits for the queued uploads first. A caller that gives up the newer snapshots
before it restores an older one (a runtime's rollback: their round will never complete) says
so with :func:`abandon_uploads`, and the restore then does not wait them out (a remote
coming back from an outage kept them retrying with backoff for seconds): each one's future
fails at once with :class:`SnapshotAbandoned`; one that has not started never starts, one
that is running finishes or fails on the uploader thread as before — its files, then its
manifest, last — but publishes no mark to the store's subscribers and keeps none of its
files pinned.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from remotes.base import Remote
from remotes.manifest import FileInfo, Manifest

from . import background
from .checksum import file_crc
from .errors import (
    BackgroundBusy,
    BackgroundDied,
    CorruptionError,
    RemoteError,
    SnapshotNotFoundError,
    StoreError,
)
from .fs import FileSystem
from .snapshot_info import Frozen, RestoreInfo, SnapshotAbandoned, SnapshotInfo
from .version import FileEntry, decode_entries, encode_entries, seq_of

__all__ = [
    "Frozen", "SnapshotInfo", "RestoreInfo", "SnapshotAbandoned", "SnapshotState",
    "SnapshotHost", "abandon_uploads", "adopt", "file_crc", "freeze", "restore",
    "restore_empty", "restores", "ship",
    "trust", "wait_uploads",
]

log = logging.getLogger("statestores")


#: The longest ``delay`` :func:`freeze` accepts (seconds): the files stay pinned meanwhile.
MAX_UPLOAD_DELAY = 60.0
#: Uploaded snapshots whose files a store keeps on disk after merges replaced them, the
#: newest: the runtime rolls back to its newest complete round, which is a store's newest
#: snapshot or, when the round after it failed (a worker lost mid-round), the one before.
#: Rolling back to either then downloads nothing (a survivor of a lost worker downloaded
#: 11 of 22 files of a 50M-key store without it).
KEEP_LOCAL = 2


class Upload:
    """One queued upload: its snapshot id, the uploader thread's future (``done``: ends
    when the thread is through with it), the caller's (``outcome``), and whether a restore
    abandoned it (:func:`abandon_uploads`)."""

    __slots__ = ("snapshot_id", "done", "outcome", "abandoned")

    def __init__(self, snapshot_id: int) -> None:
        self.snapshot_id = snapshot_id
        self.done: concurrent.futures.Future[SnapshotInfo] | None = None
        self.outcome: concurrent.futures.Future[SnapshotInfo] = concurrent.futures.Future()
        self.abandoned = threading.Event()

    def abandon(self, target: int) -> None:
        """(store lock held) A rollback to snapshot ``target`` replaces the state this
        upload froze: it publishes nothing, and its caller learns so now."""
        self.abandoned.set()
        _settle(self.outcome, None, SnapshotAbandoned(
            f"snapshot {self.snapshot_id}'s upload was abandoned: the store is rolled back to "
            f"snapshot {target}"))

    def settled(self, done: concurrent.futures.Future[SnapshotInfo]) -> None:
        """(uploader thread) ``done`` ended: hand its outcome to the caller, unless the
        upload was abandoned meanwhile."""
        exc = done.exception()
        _settle(self.outcome, None if exc is not None else done.result(), exc)


def _settle(fut: concurrent.futures.Future[SnapshotInfo], result: SnapshotInfo | None,
            exc: BaseException | None) -> None:
    """Complete ``fut`` unless it already is (an upload's outcome is decided once: by the
    uploader, or by a restore abandoning it, whichever comes first)."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except concurrent.futures.InvalidStateError:
        pass


@dataclass
class SnapshotState:
    """What a store remembers of its snapshots (a part every store holds; this module is
    the only one that reads or writes it, on the caller's and the uploader's thread)."""

    #: the id of the newest snapshot taken or restored; a new one must be greater
    last_id: int | None = None
    #: where uploads run, in call order: a thread, or the event loop in the background's
    #: ``loop`` mode (made by the first snapshot, :func:`statestores.background.serial`)
    uploader: background.Serial | None = None
    #: uploads queued and not yet waited for (:func:`wait_uploads`), in queue order
    pending: list[Upload] = field(default_factory=list)
    #: rollbacks so far (:func:`restores`): a snapshot taken before one was rolled back
    restores: int = 0
    #: the file names of the newest uploaded snapshots, oldest first, kept pinned so a
    #: rollback to one of them needs no download (:data:`KEEP_LOCAL`; the uploader owns it)
    kept: deque[tuple[str, ...]] = field(default_factory=deque)
    #: cache of ``remote.list_files()``: name → size; None: ask the remote
    remote_files: dict[str, int] | None = None
    #: name → FileInfo of files the remote holds, known without reading them
    file_infos: dict[str, FileInfo] | None = None
    #: name → (size, crc32c) of files checked against their crc when they arrived here
    #: (a promoted replica's): a restore trusts them instead of reading them again
    verified: dict[str, tuple[int, int]] = field(default_factory=dict)


class SnapshotHost(Protocol):
    """What this module needs of a store: the friendship it is granted, declared.

    :class:`~statestores.base.Store` implements it; the methods marked *lock held* expect
    the caller to hold :attr:`lock`.
    """

    @property
    def directory(self) -> str: ...
    @property
    def fs(self) -> FileSystem: ...
    @property
    def engine(self) -> str: ...
    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def snapshot_state(self) -> SnapshotState: ...
    @property
    def local_background(self) -> bool: ...

    def check_open(self) -> None:
        """Raise :class:`StoreClosedError` if the store is closed."""

    def file_path(self, name: str) -> str:
        """The path of the store's file ``name``."""

    def freeze_files(self) -> Frozen:
        """(lock held) Name the files that hold all state written so far (engine hook)."""

    def pin_files(self, names: Iterable[str]) -> None:
        """Keep ``names`` on disk until :meth:`unpin_files`."""

    def unpin_files(self, names: Iterable[str]) -> None:
        """Release a pin of each of ``names``; delete those nothing needs any more."""

    def publish_snapshot(self, snapshot_id: int, entries: Iterable[FileEntry]) -> None:
        """Tell the store's subscribers that snapshot ``snapshot_id`` is complete."""

    def pause_for_restore(self) -> None:
        """Start no merge, drop the one in flight, wait until background work is idle."""

    def resume_after_restore(self) -> None:
        """Undo :meth:`pause_for_restore`."""

    def install_snapshot(
        self, entries: list[FileEntry], replaced: frozenset[str], seq_floor: int
    ) -> None:
        """(lock held) Become exactly ``entries``, numbering new files above ``seq_floor``."""

    def stands_at(self, names: Iterable[str], seq_floor: int) -> bool:
        """(lock held) Whether the store, opened on ``names`` and not written since, stands
        there; if so, new files are numbered above ``seq_floor`` from now on."""


def _check_id(snapshot_id: object, what: str) -> int:
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
        raise TypeError(
            f"{what} must be an int, got {type(snapshot_id).__name__} {snapshot_id!r:.40}"
        )
    if snapshot_id < 0:
        raise ValueError(f"{what} must be >= 0, got {snapshot_id}")
    return snapshot_id


def freeze(
    store: SnapshotHost, remote: Remote, snapshot_id: int, delay: float = 0.0
) -> concurrent.futures.Future[SnapshotInfo]:
    """Freeze ``store`` now (cheap: the engine hands work to its maintainer) and queue the
    upload, which starts ``delay`` seconds from now at the earliest."""
    _check_id(snapshot_id, "snapshot_id")
    if (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not 0 <= delay <= MAX_UPLOAD_DELAY
    ):
        raise ValueError(
            f"delay must be a number of seconds in [0, {MAX_UPLOAD_DELAY}], got {delay!r:.40}"
        )
    t0 = time.perf_counter()
    state = store.snapshot_state
    with store.lock:
        store.check_open()
        if state.last_id is not None and snapshot_id <= state.last_id:
            raise ValueError(
                f"snapshot_id {snapshot_id} must be greater than the last snapshot id "
                f"{state.last_id} of this store"
            )
        frozen = store.freeze_files()
        store.pin_files(frozen.names)
        state.last_id = snapshot_id
        if state.uploader is None:
            state.uploader = background.serial("statestores-upload")
        job = Upload(snapshot_id)
        start_at = background.monotonic() + delay
        # (submitted under the lock, so a restore sees every queued upload in ``pending``)
        job.done = state.uploader.submit(
            upload, store, remote, snapshot_id, frozen, time.perf_counter() - t0,
            start_at, job, not_before=start_at,
        )
        job.done.add_done_callback(job.settled)
        state.pending = [u for u in state.pending if not _ended(u)] + [job]
    return job.outcome


def _ended(job: Upload) -> bool:
    return job.done is not None and job.done.done()


def _known_infos(store: SnapshotHost, remote: Remote) -> dict[str, FileInfo]:
    """Checksums of files the remote holds, known without reading them: from earlier
    uploads and downloads of this store object, seeded once from the remote's latest manifest."""
    infos = store.snapshot_state.file_infos
    if infos is None:
        infos = {}
        latest = remote.latest_snapshot()
        if latest is not None:
            try:
                infos.update(remote.read_manifest(latest).files)
            except (RemoteError, ValueError) as exc:
                log.warning("reading manifest %s of %s failed: %s", latest, store.directory, exc)
        store.snapshot_state.file_infos = infos
    return infos


def ship(
    fs: FileSystem | None, remote: Remote, snapshot_id: int, engine: str,
    files: list[tuple[str, str, FileInfo | None, int | None]], meta: dict[str, Any],
) -> tuple[dict[str, FileInfo], list[str], int, int]:
    """Checksum and upload what the remote lacks, then publish the manifest (runs in the
    ``upload`` background process, see :func:`upload`).

    ``files``: ``(name, local path, known info or None, size the remote holds or None)``.
    Returns the manifest's file infos, the names uploaded, bytes sent and bytes read.
    """
    fs = fs if fs is not None else FileSystem()
    infos: dict[str, FileInfo] = {}
    shipped: list[str] = []
    sent = read = 0
    for name, path, info, remote_size in files:
        if info is None or remote_size != info.size:
            size, crc = file_crc(fs, path)
            read += size
            info = FileInfo(size, crc)
            if remote_size != size:
                sent += remote.put_file(name, path)
                read += size
                shipped.append(name)
        infos[name] = info
    remote.write_manifest(Manifest(snapshot_id, engine, infos, meta))
    return infos, shipped, sent, read


def upload(store: SnapshotHost, remote: Remote, snapshot_id: int, frozen: Frozen, freeze_s: float,
           start_at: float = 0.0, job: Upload | None = None) -> SnapshotInfo:
    """(uploader thread) Wait for the frozen files, upload what the remote lacks, publish.

    The checksums, uploads and the manifest run in the ``upload`` background process when
    both the remote and the file system reach the same storage from there (a MinIO or path
    remote, the real file system): the transfers' CPU then never competes with the store's
    own process for its GIL, and runs at the background processes' lower priority. This
    thread only waits for it. It starts at ``start_at`` (``background.monotonic()``) at the
    earliest.

    ``job`` abandoned (:meth:`Upload.abandon`): the upload stops before its transfers if
    they have not begun; after them it publishes no mark and keeps none of its files.
    """
    abandoned = job.abandoned if job is not None else threading.Event()
    wait = start_at - background.monotonic()
    if wait > 0:
        background.wait(abandoned, wait)
    t0 = time.perf_counter()
    names = frozen.names
    state = store.snapshot_state
    uploaded = False
    try:
        for f in frozen.pending:
            background.wait_until(f.done, f.result)
            f.result()  # a failed background write fails the snapshot
        if abandoned.is_set():
            raise SnapshotAbandoned(f"snapshot {snapshot_id} of {store.directory}: abandoned "
                                    "before its upload began")
        entries = frozen.finalize() if frozen.finalize is not None else frozen.entries
        if state.remote_files is None:
            state.remote_files = dict(remote.list_files())
        have = state.remote_files
        known = _known_infos(store, remote)
        files = [
            (e.name, store.file_path(e.name), known.get(e.name), have.get(e.name))
            for e in entries
        ]
        meta = {"files": encode_entries(entries)}
        local = not remote.shareable or store.local_background
        fut = background.submit(
            ship, store.fs if local else None, remote, snapshot_id, store.engine, files, meta,
            lane="upload", local=local,
        )
        infos, shipped, sent, read = fut.result()
        known.update(infos)
        for name in shipped:
            have[name] = infos[name].size
        with store.lock:  # (a restore abandons it under the lock: before or after this)
            if not abandoned.is_set():
                # (before the unpin: replicas link its files)
                store.publish_snapshot(snapshot_id, entries)
                uploaded = True
        if not uploaded:
            raise SnapshotAbandoned(f"snapshot {snapshot_id} of {store.directory}: abandoned "
                                    "while it was uploaded (its manifest is no round's)")
    except SnapshotAbandoned:
        raise
    except RemoteError:
        state.remote_files = None
        raise
    except (OSError, BackgroundBusy, BackgroundDied) as exc:
        state.remote_files = None
        raise RemoteError(f"snapshot {snapshot_id} of {store.directory} failed: {exc}") from exc
    finally:
        if uploaded:
            _keep(store, names)
        else:
            store.unpin_files(names)
    info_out = SnapshotInfo(
        snapshot_id, len(shipped), sent, len(infos), sum(i.size for i in infos.values()), freeze_s,
        time.perf_counter() - t0, read,
    )
    log.info(
        "snapshot done",
        extra={
            "store": store.directory, "snapshot_id": snapshot_id, "files_uploaded": len(shipped),
            "bytes_uploaded": sent,
        },
    )
    return info_out


def wait_uploads(store: SnapshotHost, *, abandoned: bool = True) -> None:
    """Wait for every queued upload (their errors belong to the callers of ``snapshot_async``).

    ``abandoned=False``: not for those :func:`abandon_uploads` gave up (they end on their
    own; :func:`shutdown` waits for them). Uploads run in queue order: one queued behind an
    abandoned one still waits for it.
    """
    state = store.snapshot_state
    with store.lock:
        wait = [u for u in state.pending if abandoned or not u.abandoned.is_set()]
        state.pending = [u for u in state.pending if u not in wait]
    for u in wait:
        assert u.done is not None
        try:
            u.done.result()
        except SnapshotAbandoned as exc:
            log.info("%s", exc)
        except Exception as exc:
            log.warning("snapshot upload failed: %s", exc)


def abandon_uploads(store: SnapshotHost, target: int) -> int:
    """A rollback of ``store`` to snapshot ``target`` (0: to the empty state) begins: give up
    the queued uploads of newer snapshots (see the module docstring), so that the restore
    which follows does not wait for them, and count the rollback (:func:`restores`).
    Returns how many it gave up."""
    _check_id(target, "target")
    state = store.snapshot_state
    with store.lock:
        state.restores += 1
        newer = [u for u in state.pending
                 if u.snapshot_id > target and not u.abandoned.is_set() and not _ended(u)]
        for u in newer:
            u.abandon(target)
        # (the abandoned ones stay queued: close() waits for them)
    return len(newer)


def restores(store: SnapshotHost) -> int:
    """How many rollbacks ``store`` went through (restores, :func:`abandon_uploads`): a
    snapshot taken before the count moved was rolled back (its round, if any, was given up
    by whoever rolled the store back)."""
    return store.snapshot_state.restores


def manifest_entries(manifest: Manifest) -> list[FileEntry]:
    """The version entries a manifest names (checked against its file list)."""
    source = f"manifest {manifest.snapshot_id}"
    if "files" not in manifest.meta:
        raise CorruptionError(source, "manifest lacks its version entries (meta 'files')")
    entries = decode_entries(manifest.meta["files"], source)
    if {e.name for e in entries} != set(manifest.files):
        raise CorruptionError(source, "version entries do not match the manifest's file list")
    return entries


def _keep(store: SnapshotHost, names: Iterable[str]) -> None:
    """(uploader thread) Keep the pinned ``names`` of the snapshot just uploaded; release
    the oldest kept beyond :data:`KEEP_LOCAL` (deleting what no version names)."""
    kept = store.snapshot_state.kept
    kept.append(tuple(names))
    while len(kept) > KEEP_LOCAL:
        store.unpin_files(kept.popleft())


def trust(store: SnapshotHost, verified: dict[str, tuple[int, int]]) -> None:
    """Let a restore of ``store`` trust these files' ``(size, crc32c)`` without reading
    them again (a promoted replica checked them when they arrived)."""
    store.snapshot_state.verified = dict(verified)


def shutdown(store: SnapshotHost) -> None:
    """(close) Wait for the queued uploads and end the uploader thread."""
    wait_uploads(store)
    uploader = store.snapshot_state.uploader
    if uploader is not None:
        uploader.shutdown()


def restore(store: SnapshotHost, remote: Remote, snapshot_id: int | None) -> RestoreInfo:
    """Make ``store`` exactly snapshot ``snapshot_id`` (``None``: the latest).

    Waits for the queued uploads first, but for those :func:`abandon_uploads` gave up."""
    t0 = time.perf_counter()
    wait_uploads(store, abandoned=False)
    if snapshot_id is None:
        latest = remote.latest_snapshot()
        if latest is None:
            raise SnapshotNotFoundError(
                f"the remote of {store.directory} holds no snapshot to restore"
            )
        snapshot_id = latest
    else:
        _check_id(snapshot_id, "snapshot_id")
    manifest = remote.read_manifest(snapshot_id)
    if manifest.engine != store.engine:
        raise StoreError(
            f"snapshot {snapshot_id} was taken by engine {manifest.engine!r}, this store is "
            f"{store.engine!r}"
        )
    entries = manifest_entries(manifest)
    remote_files = remote.list_files()
    wanted = list(manifest.files)
    # Pinned, a local file the snapshot names survives a merge that finishes meanwhile:
    # the merge's edit removes it from the version, the pin keeps it on disk.
    store.pin_files(wanted)
    try:
        replaced, nbytes = _fetch(store, remote, manifest, remote_files)
        top = _top_seq(remote_files)
        store.pause_for_restore()  # a merge of what is being replaced: not waited for
        try:
            with store.lock:
                store.check_open()
                store.install_snapshot(entries, frozenset(replaced), top)
                _restored(store, manifest, entries, remote_files)
        finally:
            store.resume_after_restore()
    finally:
        store.unpin_files(wanted)
    return RestoreInfo(
        snapshot_id, len(replaced), nbytes, len(manifest.files), manifest.total_bytes,
        time.perf_counter() - t0,
    )


def adopt(store: SnapshotHost, remote: Remote, snapshot_id: int) -> RestoreInfo | None:
    """Make ``store`` snapshot ``snapshot_id`` as :func:`restore` would, without installing
    it again, when it stands there already: opened on that snapshot's files (a promoted
    replica, ``Follower.promote``) and — the caller vouches — not written since. Every file
    the manifest names must have been checked at its size and crc on arrival (``trust``);
    every live file it does not name must be a WAL the store began, numbered above every
    name the remote holds (nothing flushed or merged since; a later upload never meets a
    remote name with other bytes: sim seed 479); the engine must write only into files
    begun at its open (``Store.NEW_FILES_AT_OPEN``).
    None, the store untouched, when any of this does not hold: the caller restores.
    (A promoted standby's restore installed the same files again: 0.13-0.19 s per store.)"""
    t0 = time.perf_counter()
    _check_id(snapshot_id, "snapshot_id")
    wait_uploads(store, abandoned=False)
    manifest = remote.read_manifest(snapshot_id)
    remote_files = remote.list_files()
    checked = store.snapshot_state.verified
    if manifest.engine != store.engine or any(
            checked.get(n) != (i.size, i.crc) for n, i in manifest.files.items()):
        return None
    with store.lock:
        store.check_open()
        if not store.stands_at(manifest.files, _top_seq(remote_files)):
            return None
        _restored(store, manifest, manifest_entries(manifest), remote_files)
    return RestoreInfo(snapshot_id, 0, 0, len(manifest.files), manifest.total_bytes,
                       time.perf_counter() - t0)


def _restored(store: SnapshotHost, manifest: Manifest, entries: list[FileEntry],
              remote_files: dict[str, int]) -> None:
    """(lock held) ``store`` now stands at ``manifest``'s snapshot: remember it, and tell
    its replicas (they hold it too)."""
    state = store.snapshot_state
    state.restores += 1
    state.last_id = manifest.snapshot_id
    store.publish_snapshot(manifest.snapshot_id, entries)
    state.remote_files = dict(remote_files)
    known = state.file_infos if state.file_infos is not None else {}
    known.update(manifest.files)
    state.file_infos = known


def restore_empty(store: SnapshotHost, remote: Remote) -> int:
    """Make ``store`` empty, as before its first snapshot, numbering its new files above
    every name ``remote`` holds (returned: the highest number there). A rollback to before
    any round needs it: a round that failed after its uploads left its files in the
    remote, and a new file of one of their names would be taken for that file — an upload
    skips a name the remote holds at the size it knows (:func:`ship`), so a later manifest
    would name the old bytes. Emptying the store by deleting its keys would write into its
    current files, whose names may be such names too (sim seed 479)."""
    wait_uploads(store, abandoned=False)
    remote_files = remote.list_files()
    top = _top_seq(remote_files)
    store.pause_for_restore()
    try:
        with store.lock:
            store.check_open()
            store.install_snapshot([], frozenset(), top)
            store.snapshot_state.remote_files = dict(remote_files)
    finally:
        store.resume_after_restore()
    return top


def _top_seq(remote_files: Iterable[str]) -> int:
    """The highest file number a name in ``remote_files`` carries (0: none): a store's new
    files must be numbered above it, or a new file could take an old one's name."""
    return max((seq_of(n) for n in remote_files), default=0)


def _fetch(
    store: SnapshotHost, remote: Remote, manifest: Manifest, remote_files: dict[str, int]
) -> tuple[set[str], int]:
    """Download the files of ``manifest`` the directory lacks or holds damaged; return
    their names and the bytes downloaded."""
    fs = store.fs
    verified = store.snapshot_state.verified
    replaced: set[str] = set()
    nbytes = 0
    for name, info in manifest.files.items():
        path = store.file_path(name)
        if fs.exists(path) and (
            (verified.get(name) == (info.size, info.crc) and fs.size(path) == info.size)
            or file_crc(fs, path) == (info.size, info.crc)
        ):
            continue
        if name not in remote_files:
            raise RemoteError(
                f"snapshot {manifest.snapshot_id} names file {name!r}, which the remote lacks"
            )
        tmp = path + ".download"
        nbytes += remote.get_file(name, tmp)
        if file_crc(fs, tmp) != (info.size, info.crc):
            fs.remove(tmp)
            raise CorruptionError(
                f"remote:{name}",
                f"downloaded file does not match snapshot {manifest.snapshot_id}'s checksum",
            )
        fs.rename(tmp, path)
        replaced.add(name)
    return replaced, nbytes
