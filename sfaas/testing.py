"""Run an :class:`~sfaas.App` in-process, with the cluster's transaction semantics, no Kafka.

>>> runner = LocalRunner(app)
>>> runner.call("accounts", "alice", "deposit", 100)          # blocking, outside an event loop
>>> await runner.call("accounts", "alice", "deposit", 100)    # inside one, it is awaitable

``LocalRunner`` simulates ``workers`` workers, each an :class:`~sfaas.txn.engine.Engine`
owning its partitions of every operator's store, and drives the same deterministic epochs
as the coordinator: concurrent calls submitted together run in one epoch, conflicting ones
re-run, and a failed call raises :class:`~sfaas.errors.TransactionAborted` (or one of its
subclasses). Values cross a (simulated) wire between workers, so they are copied exactly
as msgpack would (tuples become lists).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .app import App
from .codec import pack, unpack
from .errors import reply_error
from .partitioning import owner_of_partition
from .state import open_partition_stores
from .txn.engine import Engine, Outcome
from .txn.epochs import Sequencer, decide

log = logging.getLogger("sfaas.testing")

__all__ = ["LocalRunner", "RunnerStats"]


@dataclass
class RunnerStats:
    """Counters of a :class:`LocalRunner` since it started."""

    epochs: int = 0
    committed: int = 0
    aborted: int = 0
    reruns: int = 0


@dataclass
class _Item:
    request: tuple[str, str, str, list[Any]]
    future: asyncio.Future[Any]
    now: float = 0.0
    attempts: int = 0


class _LocalRouter:
    """Delivers calls to the in-process engine that owns the key (copying like a wire would)."""

    def __init__(self) -> None:
        self.engines: list[Engine] = []

    async def remote_call(
        self, dest: int, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int,
    ) -> Outcome:
        wire_args = unpack(pack(list(args), f"arguments of {operator}.{function}"))
        ok, value = await self.engines[dest].serve(tid, now, operator, key, function, wire_args, depth)
        return ok, (unpack(pack(value)) if ok else value)


@dataclass
class _Queues:
    per_worker: list[collections.deque[_Item]] = field(default_factory=list)


class LocalRunner:
    """An in-process cluster for tests and notebooks (see module docstring)."""

    def __init__(
        self,
        app: App,
        *,
        workers: int = 2,
        partitions: int = 8,
        store: str | None = None,
        store_options: dict[str, Any] | None = None,
        directory: str | os.PathLike[str] | None = None,
        max_batch: int = 1000,
    ) -> None:
        if not isinstance(app, App):
            raise TypeError(f"LocalRunner needs an sfaas.App, got {type(app).__name__}")
        if workers < 1 or partitions < workers:
            raise ValueError(f"need 1 <= workers <= partitions, got workers={workers} partitions={partitions}")
        self.app = app
        self.max_batch = max_batch
        self._own_dir = directory is None
        self.directory = tempfile.mkdtemp(prefix="sfaas-local-") if directory is None else os.fspath(directory)
        self._router = _LocalRouter()
        self.engines: list[Engine] = []
        for i in range(workers):
            mine = [p for p in range(partitions) if owner_of_partition(p, workers) == i]
            stores = open_partition_stores(app, self.directory, mine, partitions,
                                           store=store, store_options=store_options)
            self.engines.append(Engine(app, i, workers, partitions, stores, self._router))
        self._router.engines = self.engines
        self._sequencers = [Sequencer(i) for i in range(workers)]
        self._queues: list[collections.deque[_Item]] = [collections.deque() for _ in range(workers)]
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.stats = RunnerStats()
        #: Called after every epoch's commit with ``(epoch, committed_tids)`` (the snapshot hook's seam).
        self.on_epoch_committed: Any = None

    # -- calling -----------------------------------------------------------------------
    def call(self, operator: str, key: str, function: str, *args: Any) -> Any:
        """Run one request as a transaction and return its result.

        Inside a running event loop this returns an awaitable; outside one it blocks.
        Raises :class:`~sfaas.errors.TransactionAborted` (or a subclass) if it aborted.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._own_loop is None:
                self._own_loop = asyncio.new_event_loop()
            return self._own_loop.run_until_complete(self.acall(operator, key, function, *args))
        return self.acall(operator, key, function, *args)

    async def acall(self, operator: str, key: str, function: str, *args: Any) -> Any:
        """Like :meth:`call`, always a coroutine."""
        if self._closed:
            raise RuntimeError("LocalRunner is closed")
        self.app.validate(operator, key, function, args)
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._wake = asyncio.Event()
            self._driver = loop.create_task(self._drive())
        elif self._loop is not loop:
            raise RuntimeError("a LocalRunner is bound to the event loop it was first used in")
        fut: asyncio.Future[Any] = loop.create_future()
        item = _Item((operator, key, function, unpack(pack(list(args)))), fut)
        owner = self.engines[0].owner(operator, key)
        self._queues[owner].append(item)
        assert self._wake is not None
        self._wake.set()
        return await fut

    async def gather(self, *requests: Sequence[Any], return_exceptions: bool = False) -> list[Any]:
        """Run several ``(operator, key, function, *args)`` requests concurrently."""
        return await asyncio.gather(
            *(self.acall(*r) for r in requests), return_exceptions=return_exceptions
        )

    # -- inspection ----------------------------------------------------------------------
    def state(self, operator: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``operator`` (``default`` if none)."""
        self.app.get_operator(operator)
        eng = self.engines[self.engines[0].owner(operator, key)]
        raw = eng.store_of(operator, key).get(key.encode())
        return default if raw is None else unpack(raw)

    def items(self, operator: str) -> dict[str, Any]:
        """Every committed ``key → value`` of ``operator``."""
        self.app.get_operator(operator)
        out: dict[str, Any] = {}
        for eng in self.engines:
            for store in eng.operator_stores(operator):
                for k, v in store.items():
                    out[k.decode()] = unpack(v)
        return out

    # -- epochs ----------------------------------------------------------------------------
    async def _drive(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            # let requests submitted in the same tick join this epoch
            await asyncio.sleep(0)
            while any(self._queues) or any(s.pending_retries for s in self._sequencers):
                try:
                    await self._run_epoch()
                except Exception:  # a bug in the runtime: fail loudly, but fail the waiters too
                    log.exception("epoch failed")
                    raise

    async def _run_epoch(self) -> None:
        self.stats.epochs += 1
        epoch = self.stats.epochs
        now = time.time()
        work: list[tuple[int, int, _Item]] = []
        blocked: set[int] = set()
        for seq in self._sequencers:
            blocked |= seq.pending_tids()
        for i, eng in enumerate(self.engines):
            q = self._queues[i]
            retries = self._sequencers[i].take_retries(self.max_batch, blocked)
            new = [q.popleft() for _ in range(min(len(q), self.max_batch - len(retries)))]
            for item in new:
                item.now = now
            eng.begin(epoch)
            for tid, item in retries + self._sequencers[i].assign(epoch, new):
                work.append((i, tid, item))
        outcomes = await asyncio.gather(
            *(self.engines[i].run_root(tid, item.now, item.request) for i, tid, item in work)
        )
        conflicts: dict[int, int] = {}
        user_aborts: dict[int, tuple[str, str]] = {}
        for eng in self.engines:
            c, u = eng.votes()
            for tid, blocker in c.items():
                conflicts[tid] = max(blocker, conflicts.get(tid, -1))
            for tid, why in u.items():
                user_aborts.setdefault(tid, why)
        decision = decide((tid for _, tid, _ in work), set(conflicts), user_aborts)
        for eng in self.engines:
            eng.commit(conflicts, user_aborts)
        rerun = set(decision.rerun)
        for (i, tid, item), (ok, value) in zip(work, outcomes, strict=True):
            if tid in rerun:
                item.attempts += 1
                self.stats.reruns += 1
                self._sequencers[i].requeue(tid, item, conflicts[tid])
            elif tid in decision.aborted:
                self.stats.aborted += 1
                etype, reason = value if not ok else decision.aborted[tid]
                if not item.future.done():
                    item.future.set_exception(reply_error(etype, reason))
            else:
                self.stats.committed += 1
                if not item.future.done():
                    item.future.set_result(value)
        if self.on_epoch_committed is not None:
            self.on_epoch_committed(epoch, decision.committed)

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the epoch driver, close the stores, remove the temporary directory."""
        if self._closed:
            return
        self._closed = True
        if self._driver is not None:
            self._driver.cancel()
            if self._own_loop is not None and not self._own_loop.is_closed():
                try:
                    self._own_loop.run_until_complete(asyncio.gather(self._driver, return_exceptions=True))
                except RuntimeError:
                    pass
        if self._own_loop is not None:
            self._own_loop.close()
        for eng in self.engines:
            eng.close()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> LocalRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
            self._driver = None
        self.close()
