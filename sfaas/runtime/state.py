"""Where state lives: one store per (operator, partition), each with its own remote.

A worker keeps one store per operator for every ingress partition it owns, so a
partition's state is a set of files that can move to another worker — what recovery,
rescaling and replication need. This module is the one place those stores are opened:

* locally under ``{home}/data/{namespace}/{app}/{operator}/p{partition}/`` — the same
  directory whichever worker owns the partition, so a worker restarted on the same disk
  finds its files again;
* in MinIO under ``{bucket}/{namespace}/{app}/{operator}/p{partition}/`` (a
  :class:`remotes.MinioRemote` per store), and the snapshot rounds' global manifests
  under ``{bucket}/{namespace}/{app}/_rounds/`` (see :mod:`sfaas.runtime.protocols.rounds`).

Each operator's directory records the app, engine and partition count its stores were
written with (``LAYOUT.json``): :func:`check_layout` refuses to open them otherwise — also
a directory that holds another app's state (:func:`check_app`), and on a host whose data
directory of the namespace holds another app's stores, a run of this app in that namespace
(:func:`check_namespace`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import statestores
from remotes import Remote
from sfaas.app import App
from sfaas.errors import ConfigError
from sfaas.runtime import ports
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.ports import DiskPort, ObjectsPort
from sfaas.runtime.settings import Settings
from statestores import FileSystem, Store

log = logging.getLogger("sfaas.runtime.state")

__all__ = [
    "StoreKey", "PartitionStores", "open_partition_stores", "open_stores", "store_remote",
    "rounds_remote", "ROUNDS_DIR", "stores_root", "store_engine", "check_layout", "check_app",
    "check_namespace",
]

#: ``(operator, partition)``: the unit of state that moves.
StoreKey = tuple[str, int]

#: The name under ``{namespace}/{app}/`` where snapshot rounds are published.
ROUNDS_DIR = "_rounds"


def store_remote(settings: Settings, app: str, operator: str, partition: int, *,
                 objects: ObjectsPort | None = None) -> Remote:
    """The remote of ``operator``'s store of ``partition``, from ``objects`` (the object
    port: ``sfaas.runtime.ports``; the process's when None — MinIO in production)."""
    return (objects or ports.current().objects).remote(
        settings, f"{settings.namespace}/{app}/{operator}/p{partition}")


def rounds_remote(settings: Settings, app: str, *, objects: ObjectsPort | None = None) -> Remote:
    """The remote whose blobs hold the app's snapshot rounds (see
    :mod:`sfaas.runtime.protocols.rounds`), from ``objects`` as :func:`store_remote`."""
    return (objects or ports.current().objects).remote(
        settings, f"{settings.namespace}/{app}/{ROUNDS_DIR}")


class PartitionStores(Mapping[StoreKey, Store]):
    """The stores of one worker: ``(operator, partition)`` → :class:`Store`.

    :meth:`for_key` routes a key to its partition's store with the same hash clients use
    (:func:`sfaas.runtime.partitioning.partition_of`).
    """

    def __init__(self, stores: Mapping[StoreKey, Store], partitions: int,
                 opened_at: Mapping[StoreKey, int] | None = None) -> None:
        self._stores = dict(stores)
        self.partitions = partitions
        #: the snapshot each store was opened at, of those a promoted standby opened at the
        #: round asked (none written since: the first rollback adopts them as they stand)
        self.opened_at = dict(opened_at or {})

    def __getitem__(self, key: StoreKey) -> Store:
        return self._stores[key]

    def __iter__(self) -> Iterator[StoreKey]:
        return iter(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    def for_key(self, operator: str, key: str) -> Store:
        """The store holding ``key`` of ``operator``; KeyError if this worker lacks it."""
        return self._stores[(operator, partition_of(operator, key, self.partitions))]

    def operators(self) -> set[str]:
        return {op for op, _ in self._stores}

    def close(self) -> None:
        """Close every store (errors are logged; every store gets its close)."""
        for key, store in self._stores.items():
            try:
                store.close()
            except Exception:
                log.exception("closing the store of %s/p%d failed", *key)


#: The file in each operator's directory naming how its stores were laid out.
LAYOUT_FILE = "LAYOUT.json"


def _read_layout(path: str, operator: str) -> dict[str, Any] | None:
    """The layout recorded at ``path`` (None: none yet); :class:`ConfigError` if unreadable."""
    try:
        with open(path) as f:
            have = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}): it says how the stores of "
                          f"{operator!r} were written; restore it or use a fresh "
                          "directory") from None
    if not isinstance(have, dict):
        raise ConfigError(f"{path} holds {have!r:.60}, not a layout: it says how the stores of "
                          f"{operator!r} were written; restore it or use a fresh directory")
    return have


def _state_of(root: str, unnamed: str | None = None) -> Iterator[tuple[str, str]]:
    """``(operator, app)`` of every operator directory under ``root`` whose layout says it
    holds state: an engine other than ``memonly`` (whose stores keep nothing on disk).
    ``app`` is the layout's; one without (none was ever written without) names ``unnamed``,
    or is skipped when that is None."""
    try:
        entries = sorted((e.name, e.path) for e in os.scandir(root) if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for name, path in entries:
        have = _read_layout(os.path.join(path, LAYOUT_FILE), name)
        if have is None or have.get("engine") == "memonly":
            continue
        app = have.get("app") if isinstance(have.get("app"), str) else unnamed
        if app is not None:
            yield name, app


def check_app(app_name: str, root: str) -> None:
    """Refuse to open ``root`` as the stores directory of app ``app_name`` when it holds
    another app's state, naming both apps (it would read and overwrite that app's keys as
    this one's)."""
    for operator, owner in _state_of(root):
        if owner != app_name:
            raise ConfigError(
                f"data directory {root} holds the state of app {owner!r} (operator "
                f"{operator!r}); this is app {app_name!r}. Opening it would read and overwrite "
                f"app {owner!r}'s data as app {app_name!r}'s: use a fresh directory for app "
                f"{app_name!r}, or open this one with app {owner!r}")


def check_namespace(settings: Settings, app_name: str) -> None:
    """Refuse to run app ``app_name`` in ``settings.namespace`` when this host's data
    directory of the namespace (``{home}/data/{namespace}/``) holds another app's stores,
    naming both apps: a namespace is one app's cluster, and a renamed app would otherwise
    start empty beside the data it means to use."""
    base = os.path.join(settings.home, "data", settings.namespace)
    try:
        apps = sorted(e.name for e in os.scandir(base) if e.is_dir() and e.name != app_name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for other in apps:
        for operator, owner in _state_of(os.path.join(base, other), unnamed=other):
            if owner == app_name:
                continue
            raise ConfigError(
                f"namespace {settings.namespace!r} holds the state of app {owner!r} "
                f"({os.path.join(base, other)}, operator {operator!r}); this is app "
                f"{app_name!r}. A namespace runs one app: run app {app_name!r} in another "
                f"namespace (--namespace, SFAAS_NAMESPACE), start app {owner!r} here, or "
                f"delete that directory (and app {owner!r}'s topics and snapshots) to give "
                f"the namespace to app {app_name!r}")


def check_layout(app: App, root: str, n_partitions: int, store: str | None = None,
                 store_options: Mapping[str, Any] | None = None, *, write: bool = True) -> None:
    """Refuse to open ``root``'s stores with another engine or partition count than they
    were written with, naming both (a store of one engine opened as another, or a key
    looked up in another partition, would read as absent: data silently gone), or when
    they hold another app's state (:func:`check_app`); record the layout when there is
    none yet (``write``). A directory of ``memonly`` stores holds nothing to lose: it takes
    the new layout."""
    check_app(app.name, root)
    for name, op in app.operators.items():
        engine = store or op.store
        path = os.path.join(root, name, LAYOUT_FILE)
        want = {"app": app.name, "operator": name, "engine": engine, "partitions": n_partitions}
        have = _read_layout(path, name)
        if have is not None and have.get("engine") != "memonly" and (
                have.get("engine") != engine or have.get("partitions") != n_partitions):
            raise ConfigError(
                f"the stores of operator {name!r} in {os.path.join(root, name)} were written "
                f"by app {have.get('app')!r} with engine {have.get('engine')!r} in "
                f"{have.get('partitions')} partitions; this run asks for engine {engine!r} in "
                f"{n_partitions} partitions. Opening them so would read their keys as absent: "
                "use the same engine and partition count, or a fresh directory (namespace)")
        if write and have != want:
            # (every worker process of a host may write it at once: each its own temporary
            # file, the same content)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(want, f)
            os.replace(tmp, path)


def open_partition_stores(
    app: App, root: str, partitions: Iterable[int], n_partitions: int, *,
    store: str | None = None, store_options: Mapping[str, Any] | None = None,
    remote_of: Callable[[str, int], Remote] | None = None, fs: FileSystem | None = None,
) -> PartitionStores:
    """Open ``root/{operator}/p{partition}`` for every operator of ``app`` and partition.

    The engine is the operator's, or ``store`` for all (with ``store_options``). Each store
    gets ``remote_of(operator, partition)`` as its remote, attached after opening: opening
    never talks to the remote (MinIO may be down) and never restores implicitly —
    recovery restores to a complete round explicitly. The stores write through ``fs``
    (None: the real file system). With remotes, a store whose files are damaged is set
    aside and opened empty (:func:`_open_store`).
    """
    if ROUNDS_DIR in app.operators:
        raise ConfigError(
            f"operator name {ROUNDS_DIR!r} is reserved (it names the snapshot rounds)")
    check_layout(app, root, n_partitions, store, store_options)
    stores: dict[StoreKey, Store] = {}
    try:
        for p in sorted(set(partitions)):
            if not 0 <= p < n_partitions:
                raise ValueError(f"partition {p} not in [0, {n_partitions})")
            for name, op in app.operators.items():
                engine = store or op.store
                opts = dict(store_options or {}) if store else dict(op.store_options)
                s = _open_store(engine, os.path.join(root, name, f"p{p}"), fs, opts,
                                recoverable=remote_of is not None)
                if remote_of is not None:
                    s.remote = remote_of(name, p)
                stores[(name, p)] = s
    except BaseException:
        PartitionStores(stores, n_partitions).close()
        raise
    return PartitionStores(stores, n_partitions)


def _open_store(engine: str, path: str, fs: FileSystem | None, opts: dict[str, Any], *,
                recoverable: bool) -> Store:
    """The store at ``path``. One whose files are damaged (a file its ``CURRENT`` names is
    missing: a disk that lost files, a directory deleted under a process still writing it)
    is moved to ``{path}.damaged`` (replacing an earlier one) and opened empty when its
    state is ``recoverable`` from the snapshot rounds: the recovery that follows a worker's
    start restores the round, downloading what the directory lacks. Refusing it made the
    worker exit at every restart until the supervisor gave up — the slot never came back.
    Without rounds the error stands: the files are the only copy of the state."""
    try:
        return statestores.open(engine, path, fs=fs, **opts)
    except statestores.CorruptionError as exc:
        if not recoverable:
            raise
        aside = f"{path}.damaged"
        log.error("the store at %s is damaged (%s): moved to %s and opened empty; the "
                  "recovery downloads its round", path, exc, aside)
        shutil.rmtree(aside, ignore_errors=True)
        (fs or FileSystem()).rename(path, aside)
        return statestores.open(engine, path, fs=fs, **opts)


def stores_root(settings: Settings, app_name: str) -> str:
    """Where a worker's partition stores live: ``{home}/data/{namespace}/{app}``."""
    return os.path.join(settings.home, "data", settings.namespace, app_name)


def store_engine(app: App, operator: str, store: str = "") -> tuple[str, dict[str, Any]]:
    """The engine and options of ``operator``'s stores (``store`` overrides, as in
    :func:`open_partition_stores`)."""
    op = app.operators[operator]
    return (store, {}) if store else (op.store, dict(op.store_options))


def open_stores(
    settings: Settings, app: App, partitions: Iterable[int], n_partitions: int, *,
    objects: ObjectsPort | None = None, disk: DiskPort | None = None,
) -> PartitionStores:
    """A worker's stores: :func:`open_partition_stores` under ``{home}/data/{namespace}/{app}``
    with ``settings.store`` and, when snapshot rounds are on, each store's remote (from
    ``objects``, as :func:`store_remote`), writing through ``disk``'s file system (the disk
    port: the process's when None — the real files in production); refused in a namespace
    whose data directory holds another app's (:func:`check_namespace`)."""
    def remote_of(op: str, p: int) -> Remote:
        return store_remote(settings, app.name, op, p, objects=objects)

    check_namespace(settings, app.name)
    if settings.snapshot_interval > 0:
        # start the uploads' background process now, not at the first round (a process
        # start is ~0.3 s of CPU on the cores the epochs run on)
        statestores.background.warm_up("upload")
    return open_partition_stores(
        app, stores_root(settings, app.name), partitions, n_partitions,
        store=settings.store or None,
        remote_of=remote_of if settings.snapshot_interval > 0 else None,
        fs=(disk or ports.current().disk).file_system(),
    )
