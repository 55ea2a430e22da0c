"""``MinioRemote``: snapshot storage in an S3 bucket (MinIO or any S3-compatible service).

Objects live under ``<bucket>/<prefix>/`` with the layout of :mod:`remotes._layout`.
S3 PUTs are atomic (a reader sees the old or the new object, never a mix), so
write-then-publish needs no temp objects: files first, the manifest last.

Transient failures (connection errors, timeouts, HTTP 5xx/429, ``SlowDown`` and friends)
are retried with exponential backoff and jitter (:class:`remotes._retry.RetryPolicy`);
then, and for every other failure, :class:`~remotes.errors.RemoteError` is raised with a
message that names the endpoint, bucket and object — never the secret key.

Several endpoints (the nodes of a distributed MinIO, which all serve every object) fail
over: a try that fails at the connection level moves on to the next endpoint at once
(:mod:`remotes._endpoints`), and the retry policy applies to whole rounds of them.
"""

from __future__ import annotations

import http.client
import io
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import certifi
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.helpers import check_bucket_name

from . import credentials
from ._endpoints import (
    FIRST_READ_TIMEOUT,
    EndpointsFailed,
    Hurry,
    Rotation,
    on_some_endpoint,
    parse_endpoints,
)
from ._gc import plan_gc
from ._layout import (
    BLOBS,
    FILES,
    MANIFESTS,
    check_name,
    check_snapshot_id,
    manifest_name,
    normalize_prefix,
    parse_manifest_name,
)
from ._retry import RetriesExhausted, RetryPolicy, retry_call
from .base import GcInfo, Remote
from .errors import RemoteError, SnapshotNotFoundError
from .manifest import Manifest

__all__ = ["MinioRemote", "RetryPolicy"]

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "SlowDownRead",
        "SlowDownWrite",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "OperationAborted",
        "XMinioServerNotInitialized",
        "XMinioStorageFull",
        "XMinioBackendDown",
        "XMinioReadQuorum",
        "XMinioWriteQuorum",
    }
)
#: Seconds to wait for a TCP connection to the one endpoint there is.
CONNECT_TIMEOUT = 3.0
#: ... when there are others to move on to: a node that does not take a connection within
#: a second (its host gone: no answer at all) counts as down. On a LAN a connect takes well
#: under a millisecond, and a refusing node (its process gone) answers at once.
FAILOVER_CONNECT_TIMEOUT = 1.0
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject"})
_CHUNK = 1 << 20


def _status_transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def is_transient(e: BaseException) -> bool:
    """Whether ``e`` (raised by the minio client) is worth retrying."""
    if isinstance(e, S3Error):
        status = e.response.status if e.response is not None else 0
        return e.code in _TRANSIENT_CODES or _status_transient(status)
    if isinstance(e, ServerError):
        return _status_transient(e.status_code)
    if isinstance(e, InvalidResponseError):
        return _status_transient(int(getattr(e, "_code", 0) or 0))
    return isinstance(
        e, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, http.client.HTTPException)
    )


class _OnClient(Protocol[T_co]):
    """An operation on one endpoint's client; called without one, on the first endpoint."""

    def __call__(self, client: Minio = ...) -> T_co: ...


def _transient_or_swept(e: BaseException) -> bool:
    # a round in which every endpoint failed is retried like one endpoint's transient error
    return isinstance(e, EndpointsFailed) or is_transient(e)


class MinioRemote(Remote):
    """A remote in ``bucket`` (created on first use if missing) under ``prefix``.

    ``endpoint`` is ``host:port`` (an ``http://``/``https://`` scheme is accepted and sets
    ``secure``), or several of them — a comma-separated str or a list — that serve the same
    objects (the nodes of one distributed MinIO): the remote uses one at a time and moves
    to the next when a request to it fails at the connection level (refused, reset, timed
    out, 502/503/504), trying each endpoint once per try of an operation.
    Thread-safe: one connection pool of ``pool_size`` connections per endpoint is shared by
    all threads. ``retry`` bounds how long transient errors are retried; ``connect_timeout``
    (default :data:`CONNECT_TIMEOUT`, or :data:`FAILOVER_CONNECT_TIMEOUT` with several
    endpoints) and ``read_timeout`` bound each request (so a node that accepts connections
    but never answers costs ``read_timeout`` before the next endpoint is tried); with
    several endpoints, the first one of each try has ``first_read_timeout`` (default
    :data:`FIRST_READ_TIMEOUT`, at most ``read_timeout``).
    """

    shareable = True

    def __init__(
        self,
        endpoint: str | list[str] | tuple[str, ...],
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        secure: bool = False,
        prefix: str = "",
        region: str = "us-east-1",
        retry: RetryPolicy | None = None,
        pool_size: int = 16,
        connect_timeout: float | None = None,
        read_timeout: float = 30.0,
        first_read_timeout: float | None = None,
    ) -> None:
        endpoints, secure = parse_endpoints(endpoint, secure)
        if connect_timeout is None:
            connect_timeout = CONNECT_TIMEOUT if len(endpoints) == 1 else FAILOVER_CONNECT_TIMEOUT
        if first_read_timeout is None:
            first_read_timeout = FIRST_READ_TIMEOUT
        first_read_timeout = min(first_read_timeout, read_timeout)
        if first_read_timeout <= 0:
            raise ValueError(f"first_read_timeout must be > 0 s, got {first_read_timeout}")
        for label, value in (("access_key", access_key), ("secret_key", secret_key)):
            if not isinstance(value, str) or not value:
                # Never echo the value: it may be a credential.
                raise ValueError(f"{label} must be a non-empty str")
        if not isinstance(bucket, str):
            raise TypeError(f"bucket must be a str, got {type(bucket).__name__}: {bucket!r}")
        try:
            check_bucket_name(bucket, strict=True)
        except ValueError as e:
            raise ValueError(f"bucket {bucket!r} is not a valid S3 bucket name: {e}") from None
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")

        # What pickling needs to rebuild this remote in another process (pools and locks
        # cannot travel): every argument but the secret key, which the receiving process
        # resolves from the reference (remotes.credentials), so no pickle ever holds it.
        urls = tuple(("https://" if secure else "http://") + e for e in endpoints)
        full_endpoint = ",".join(urls)
        self._init_args: dict[str, Any] = dict(
            endpoint=full_endpoint, access_key=access_key,
            credential=credentials.register(full_endpoint, access_key, secret_key), bucket=bucket,
            prefix=prefix, region=region, retry=retry, pool_size=pool_size,
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            first_read_timeout=first_read_timeout,
        )
        #: Every endpoint, ``host:port``; :attr:`endpoint` is the one in use.
        self.endpoints = endpoints
        self.bucket = bucket
        self.secure = bool(secure)
        self.prefix = normalize_prefix(prefix)
        self.retry = retry or RetryPolicy()
        self._secret = secret_key
        #: every connection pool (one per read timeout), for :meth:`close`
        self._pools: list[urllib3.PoolManager] = []

        def clients(read: float) -> tuple[Minio, ...]:
            http = urllib3.PoolManager(
                timeout=urllib3.Timeout(connect=connect_timeout, read=read),
                maxsize=pool_size,
                block=False,
                cert_reqs="CERT_REQUIRED" if self.secure else "CERT_NONE",
                ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
                # Our own retry loop decides; urllib3 must not retry (or sleep) underneath it.
                retries=False,
            )
            self._pools.append(http)
            return tuple(Minio(e, access_key=access_key, secret_key=secret_key,
                               secure=self.secure, region=region, http_client=http)
                         for e in endpoints)

        self._clients = clients(read_timeout)
        self._client = self._clients[0]
        #: One endpoint: no failover bookkeeping at all on the request path.
        self._rotation = Rotation(urls) if len(urls) > 1 else None
        #: the first endpoint of each try's clients (several endpoints: hurried)
        self._first_clients = self._clients if self._rotation is None \
            or first_read_timeout >= read_timeout else clients(first_read_timeout)
        self._hurry = Hurry(first_read_timeout)
        self._label = ", ".join(urls)
        self._bucket_lock = threading.Lock()
        self._bucket_ready = False
        self._gc_lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._init_args,))

    @property
    def endpoint(self) -> str:
        """The endpoint (``host:port``) requests go to now."""
        return self.endpoints[self._rotation.current if self._rotation else 0]

    def __repr__(self) -> str:
        where = ",".join(self.endpoints)
        return f"MinioRemote({where!r}, bucket={self.bucket!r}, prefix={self.prefix!r})"

    # -- plumbing --
    def _scrub(self, text: str) -> str:
        # (a secret of 1-3 chars would turn every message into asterisks, and a server never
        # echoes secrets anyway; this is defence in depth, not the only guard)
        return text.replace(self._secret, "***") if len(self._secret) >= 4 else text

    def _where(self, key: str | None) -> str:
        obj = f", object {key!r}" if key is not None else f", prefix {self.prefix!r}"
        return f"MinIO at {self._label}, bucket {self.bucket!r}{obj}"

    def _call(self, op: str, key: str | None, fn: _OnClient[T], *, recreated: bool = False) -> T:
        """Run ``fn`` with retries (and failover between endpoints); turn client errors into
        ``RemoteError``. ``fn(client)`` runs on ``client``; ``fn()`` on the first endpoint's,
        which ``fn`` has as its default (so one endpoint costs no wrapper per call)."""
        what = f"{op} ({self._where(key)})"
        try:
            if self._rotation is None:
                return retry_call(fn, policy=self.retry, is_transient=is_transient, what=what,
                                  scrub=self._scrub)
            return self._failover_call(self._rotation, fn, what)
        except S3Error as e:
            if e.code != "NoSuchBucket" or recreated or not self._bucket_ready:
                raise self._error(op, key, e) from e
            # The bucket vanished after we created/saw it: create it again, like on first use.
            log.warning(
                "bucket disappeared; creating it again",
                extra={"endpoint": self.endpoint, "bucket": self.bucket},
            )
            self._bucket_ready = False
            self._ensure_bucket()
            return self._call(op, key, fn, recreated=True)
        except RetriesExhausted as e:
            last = f"on every endpoint: {e.last}" if isinstance(e.last, EndpointsFailed) \
                else f"{type(e.last).__name__}: {e.last}"
            raise RemoteError(
                self._scrub(
                    f"{self._where(key)}: {op} failed after {e.attempts} tries in "
                    f"{e.elapsed:.1f}s: {last}"
                )
            ) from e.last
        except (ServerError, InvalidResponseError) as e:
            raise self._error(op, key, e) from e

    def _failover_call(self, rotation: Rotation, fn: _OnClient[T], what: str) -> T:
        # (not inlined in _call: its closure would turn _call's locals into cells, which
        # slows the one-endpoint path down)
        clients, first = self._clients, self._first_clients
        hurry = first is not clients and self._hurry.now()
        return retry_call(
            lambda: on_some_endpoint(rotation, clients, fn, what=what, scrub=self._scrub,
                                     first=first if hurry else None,
                                     after_first=self._hurry.answered_after),
            policy=self.retry, is_transient=_transient_or_swept, what=what, scrub=self._scrub,
        )

    def _error(self, op: str, key: str | None, e: Exception) -> RemoteError:
        detail = f"{e.code}: {e.message}" if isinstance(e, S3Error) else f"{type(e).__name__}: {e}"
        return RemoteError(self._scrub(f"{self._where(key)}: {op} failed: {detail}"))

    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return

            def make(client: Minio = self._client) -> None:
                if client.bucket_exists(self.bucket):
                    return
                try:
                    client.make_bucket(self.bucket)
                    log.info(
                        "created bucket", extra={"endpoint": self.endpoint, "bucket": self.bucket}
                    )
                except S3Error as e:
                    if e.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

            self._call("create bucket", None, make)
            self._bucket_ready = True

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}/{name}"

    def _list(self, kind: str) -> Iterator[tuple[str, int, float]]:
        """``(name, size, mtime)`` of every object under ``<prefix><kind>/``."""
        self._ensure_bucket()
        base = f"{self.prefix}{kind}/"

        def listing(client: Minio = self._client) -> list[tuple[str, int, float]]:
            out = []
            for obj in client.list_objects(self.bucket, prefix=base, recursive=True):
                name = obj.object_name or ""
                # names never contain '/': deeper keys belong to a nested prefix, not to us
                if obj.is_dir or not name.startswith(base) or "/" in name[len(base):]:
                    continue
                mtime = obj.last_modified.timestamp() if obj.last_modified else 0.0
                out.append((name[len(base):], int(obj.size or 0), mtime))
            return out

        return iter(self._call(f"list {kind}", base, listing))

    def _get_bytes(self, key: str, op: str) -> bytes | None:
        """Object ``key``'s bytes, or ``None`` if it does not exist."""
        self._ensure_bucket()

        def get(client: Minio = self._client) -> bytes | None:
            try:
                resp = client.get_object(self.bucket, key)
            except S3Error as e:
                if e.code in _MISSING_CODES:
                    return None
                raise
            try:
                return resp.read()
            finally:
                resp.close()
                resp.release_conn()

        return self._call(op, key, get)

    def _put_bytes(self, key: str, data: bytes, op: str) -> None:
        self._ensure_bucket()

        def put(client: Minio = self._client) -> None:
            client.put_object(self.bucket, key, io.BytesIO(data), len(data))

        self._call(op, key, put)

    def _delete(self, key: str, op: str) -> None:
        self._ensure_bucket()
        self._call(op, key, lambda client=self._client: client.remove_object(self.bucket, key))

    # -- files --
    def put_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Upload local file ``path`` as ``files/<name>``; durable on return."""
        check_name(name)
        size = os.path.getsize(path)  # a missing local file is the caller's error, not ours
        key = self._key(FILES, name)
        self._ensure_bucket()
        def put(client: Minio = self._client) -> None:
            client.fput_object(self.bucket, key, os.fspath(path))

        self._call("put file", key, put)
        log.debug("put file", extra={"bucket": self.bucket, "key": key, "bytes": size})
        return size

    def get_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Download ``files/<name>`` to ``path`` (temp file beside it, fsync, rename)."""
        check_name(name)
        key = self._key(FILES, name)
        dst = Path(path)
        tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex}.part")
        self._ensure_bucket()

        def get(client: Minio = self._client) -> int | None:
            try:
                resp = client.get_object(self.bucket, key)
            except S3Error as e:
                if e.code in _MISSING_CODES:
                    return None
                raise
            n = 0
            try:
                with open(tmp, "wb") as f:
                    for chunk in resp.stream(_CHUNK):
                        f.write(chunk)
                        n += len(chunk)
                    f.flush()
                    os.fsync(f.fileno())
            finally:
                resp.close()
                resp.release_conn()
            return n

        try:
            n = self._call("get file", key, get)
            if n is None:
                raise RemoteError(f"{self._where(key)}: no file {name!r}")
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        return n

    def list_files(self) -> dict[str, int]:
        """Every data file: name → size in bytes."""
        return {name: size for name, size, _ in self._list(FILES)}

    def delete_file(self, name: str) -> None:
        """Delete ``files/<name>``; a missing file is not an error."""
        check_name(name)
        self._delete(self._key(FILES, name), "delete file")

    # -- manifests --
    def write_manifest(self, manifest: Manifest) -> None:
        """Publish ``manifest`` (one atomic PUT; replaces one with the same id)."""
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a remotes.Manifest, got {type(manifest).__name__}")
        key = self._key(MANIFESTS, manifest_name(manifest.snapshot_id))
        self._put_bytes(key, manifest.encode(), "write manifest")

    def read_manifest(self, snapshot_id: int) -> Manifest:
        """The manifest of ``snapshot_id``; ``SnapshotNotFoundError`` if unpublished."""
        key = self._key(MANIFESTS, manifest_name(snapshot_id))
        data = self._get_bytes(key, "read manifest")
        if data is None:
            raise SnapshotNotFoundError(f"{self._where(key)}: no snapshot {snapshot_id}")
        m = Manifest.decode(data, source=f"s3://{self.bucket}/{key}")
        if m.snapshot_id != snapshot_id:
            raise RemoteError(
                f"{self._where(key)}: holds the manifest of snapshot {m.snapshot_id}, not "
                f"{snapshot_id}"
            )
        return m

    def _manifests(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for name, _, mtime in self._list(MANIFESTS):
            sid = parse_manifest_name(name)
            if sid is not None:
                out[sid] = mtime
        return out

    def list_snapshots(self) -> list[int]:
        """Ids of the published snapshots, ascending."""
        return sorted(self._manifests())

    def delete_snapshot(self, snapshot_id: int) -> None:
        """Unpublish ``snapshot_id`` (its files stay until :meth:`gc`); missing is fine."""
        check_snapshot_id(snapshot_id)
        self._delete(self._key(MANIFESTS, manifest_name(snapshot_id)), "delete manifest")

    def delete_snapshots(self, snapshot_ids: Iterable[int]) -> None:
        """Unpublish ``snapshot_ids`` in one request (S3 DeleteObjects); missing is fine."""
        ids = [check_snapshot_id(sid) for sid in snapshot_ids]
        self._delete_keys(
            [self._key(MANIFESTS, manifest_name(sid)) for sid in ids], "delete manifests"
        )

    # -- blobs --
    def put_blob(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``blobs/<name>`` (one atomic PUT)."""
        check_name(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob {name!r}: data must be bytes, got {type(data).__name__}")
        self._put_bytes(self._key(BLOBS, name), bytes(data), "put blob")

    def get_blob(self, name: str) -> bytes | None:
        """``blobs/<name>``, or ``None`` if absent."""
        check_name(name)
        return self._get_bytes(self._key(BLOBS, name), "get blob")

    def delete_blob(self, name: str) -> None:
        """Delete ``blobs/<name>``; a missing blob is not an error."""
        check_name(name)
        self._delete(self._key(BLOBS, name), "delete blob")

    # -- lifecycle --
    def gc(self, keep: int) -> GcInfo:
        """Keep the newest ``keep`` (>= 1) snapshots; delete older manifests and the files no
        retained manifest references (files newer than the newest retained manifest are
        kept: they may belong to an upload in flight)."""
        with self._gc_lock:
            manifests = self._manifests()
            plan = plan_gc(
                sorted(manifests), keep, self.read_manifest, list(self._list(FILES)),
                manifests.__getitem__,
            )
            # manifests first: a crash in between leaves orphan files, never a manifest
            # that names deleted files
            self._delete_keys(
                [self._key(MANIFESTS, manifest_name(s)) for s in plan.drop_snapshots],
                "gc manifests",
            )
            self._delete_keys([self._key(FILES, n) for n in plan.drop_files], "gc files")
        info = GcInfo(plan.drop_snapshots, len(plan.drop_files), sum(plan.drop_files.values()))
        log.info(
            "gc",
            extra={
                "bucket": self.bucket, "prefix": self.prefix,
                "snapshots_deleted": info.snapshots_deleted, "files_deleted": info.files_deleted,
                "bytes_deleted": info.bytes_deleted,
            },
        )
        return info

    def _delete_keys(self, keys: list[str], op: str) -> None:
        if not keys:
            return
        self._ensure_bucket()

        def delete(client: Minio = self._client) -> None:
            for i in range(0, len(keys), 1000):  # S3 DeleteObjects takes <= 1000 keys
                batch = [DeleteObject(k) for k in keys[i : i + 1000]]
                errors = list(client.remove_objects(self.bucket, batch))
                if errors:
                    first = errors[0]
                    raise RemoteError(
                        self._scrub(
                            f"{self._where(first.name)}: {op}: {len(errors)} of {len(batch)} "
                            f"deletes failed, first: {first.code}: {first.message}"
                        )
                    )

        self._call(op, None, delete)

    def destroy(self) -> None:
        """Delete every object of this remote (``files/``, ``manifests/``, ``blobs/`` under
        the prefix; the bucket and anything else in it stay). Usable again afterwards."""
        with self._gc_lock:
            keys = [
                self._key(kind, name)
                for kind in (FILES, MANIFESTS, BLOBS)
                for name, _, _ in self._list(kind)
            ]
            self._delete_keys(keys, "destroy")
        log.info(
            "destroyed", extra={"bucket": self.bucket, "prefix": self.prefix, "objects": len(keys)}
        )

    def close(self) -> None:
        """Close pooled connections (the remote reopens them if used again)."""
        for pool in self._pools:
            pool.clear()


#: Remotes rebuilt by unpickling in this process, by settings: a store's background
#: process receives its remote with every upload and reuses one pool (and the bucket check)
#: instead of opening new connections each time. Bounded; the oldest goes first.
_rebuilt: dict[tuple[Any, ...], MinioRemote] = {}
_REBUILT_MAX = 64
_rebuilt_lock = threading.Lock()


def _rebuild(kwargs: dict[str, Any]) -> MinioRemote:
    """Unpickle helper: a MinioRemote with the same settings (one per settings and process);
    its secret key comes from ``remotes.credentials``, never from the pickle."""
    key = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    with _rebuilt_lock:
        remote = _rebuilt.get(key)
        if remote is None:
            kw = dict(kwargs)
            endpoint, access_key = kw.pop("endpoint"), kw.pop("access_key")
            secret_key = credentials.lookup(kw.pop("credential"), access_key)
            if secret_key is None:
                raise RemoteError(
                    f"MinIO at {endpoint}: no secret key for access key {access_key!r} in process "
                    f"{os.getpid()}; set SFAAS_MINIO_SECRET_KEY (and SFAAS_MINIO_ACCESS_KEY)"
                )
            remote = MinioRemote(endpoint, access_key, secret_key, kw.pop("bucket"), **kw)
            if len(_rebuilt) >= _REBUILT_MAX:
                del _rebuilt[next(iter(_rebuilt))]
            _rebuilt[key] = remote
        return remote
