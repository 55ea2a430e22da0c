"""A standby worker: follow a primary's partition stores, take its place when it dies.

A worker the coordinator answers with ``wire.Follow`` (it asked with ``--standby-of``, or
the cluster was missing a standby) opens a :class:`statestores.replica.Follower` per
partition store of that primary, under ``{home}/standby/{namespace}/{app}/{name}/``, fed
by the primary's ``tcp`` replication server. The followers install the primary's own
files — no flush, merge or index build here — and hold each snapshot round's files. A
new standby first downloads the newest round's files of each store from MinIO (``seed``),
so its catch-up costs the primary only what changed since that round.

On ``wire.Promote(index, round)`` (the primary died) every follower is promoted to that
round's files and moved (a rename) into the directory the primary's stores use, and the
worker registers for the primary's slot; the recovery that follows restores the round
from those local files — nothing is downloaded — and replays the epoch log. A new
``Follow`` (the primary was replaced, at another address) re-points the followers; they
resume where they stand and receive only the files they lack.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

import statestores
from sfaas.app import App
from sfaas.errors import ChannelClosed, ClusterError
from sfaas.runtime import wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores, StoreKey, store_engine, store_remote, stores_root
from statestores.replica import Follower, TcpSource
from worker.links import CoordinatorLink
from worker.replication import store_name

log = logging.getLogger("sfaas.worker.standby")

__all__ = ["run_standby"]


class _Standby:
    def __init__(self, settings: Settings, app: App, name: str, secret: str) -> None:
        self._settings = settings
        self._app = app
        self._secret = secret
        self.root = os.path.join(settings.home, "standby", settings.namespace, app.name, name)
        self.followers: dict[StoreKey, Follower] = {}
        self.follow: wire.Follow | None = None

    def _mine(self, f: wire.Follow) -> list[int]:
        return [p for p in range(f.partitions) if p % f.n_workers == f.index]

    def start(self, f: wire.Follow) -> None:
        """(Re)follow the stores of ``f.index`` at ``f.host:f.port``."""
        self.stop()
        old = self.follow
        if old is not None and (old.index, old.n_workers) != (f.index, f.n_workers):
            shutil.rmtree(self.root, ignore_errors=True)  # another primary's stores: start clean
        self.follow = f
        s, app = self._settings, self._app
        for p in self._mine(f):
            for op in app.operators:
                engine, opts = store_engine(app, op, s.store)
                source = TcpSource(f.host, f.port, store_name(op, p), self._secret)
                # a new standby downloads the newest round's files from MinIO first: the
                # primary ships only what changed since (its network and CPU are spared)
                self.followers[(op, p)] = statestores.follow(
                    engine, os.path.join(self.root, op, f"p{p}"), source,
                    seed=store_remote(s, app.name, op, p), **opts)
        log.info("standby of worker %d: following %d stores at %s:%d", f.index, len(self.followers),
                 f.host, f.port, extra={"worker": f.index})

    def stop(self) -> None:
        for fol in self.followers.values():
            fol.close()
        self.followers.clear()

    def promote(self, msg: wire.Promote) -> PartitionStores:
        """(a thread) Every follower becomes its store in the primary's directory."""
        s, app = self._settings, self._app
        assert self.follow is not None
        stores: dict[StoreKey, statestores.Store] = {}
        try:
            for (op, p), fol in list(self.followers.items()):
                held = fol.snapshots()
                at = msg.round if msg.round in held else (held[-1] if held else None)
                target = os.path.join(stores_root(s, app.name), op, f"p{p}")
                store = fol.promote(at, directory=target)
                store.remote = store_remote(s, app.name, op, p)
                stores[(op, p)] = store
                del self.followers[(op, p)]
                log.info("promoted %s/p%d to snapshot %s (round %d asked), %d files local", op, p,
                         at, msg.round, len(store.version()[1]), extra={"worker": msg.index})
        except BaseException:
            PartitionStores(stores, self.follow.partitions).close()
            raise
        return PartitionStores(stores, self.follow.partitions)


async def run_standby(settings: Settings, app: App, name: str, secret: str, uplink: CoordinatorLink,
                      first: wire.Follow) -> tuple[PartitionStores, int]:
    """Be a standby (``name``) until promoted; returns the promoted stores and the slot to take."""
    sb = _Standby(settings, app, name, secret)
    sb.start(first)
    try:
        while True:
            try:
                msgs = await uplink.recv()
            except ChannelClosed:
                raise ClusterError("lost the coordinator while standing by") from None
            for msg in msgs:
                if isinstance(msg, wire.Follow):
                    await asyncio.to_thread(sb.start, msg)
                elif isinstance(msg, wire.Promote):
                    stores = await asyncio.to_thread(sb.promote, msg)
                    return stores, msg.index
                elif isinstance(msg, wire.Stop):
                    raise ClusterError(f"coordinator stopped this standby: {msg.reason}")
    finally:
        sb.stop()
        shutil.rmtree(sb.root, ignore_errors=True)
