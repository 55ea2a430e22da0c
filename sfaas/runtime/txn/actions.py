"""Post-commit actions (``ctx.after_commit``): a transactional outbox.

The transaction writes the action as a record next to its other writes
(``sfaas.runtime.txn.internal``), so it exists if and only if the transaction committed.
:class:`Actions` follows the records applied to this process's stores and runs each:
``fn(*args)`` — looked up by name, sync functions in a thread — retried with exponential
backoff until it returns, with :func:`sfaas.effect_key` the action's key on every try.
When it has returned, the record is deleted by a small transaction (``done``), so a
restart or a recovery runs only the actions whose deletion never committed: an action
runs twice only when the process stops between its return and that commit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sfaas.context import EFFECT_KEY
from sfaas.runtime.codec import unpack
from sfaas.runtime.txn.effects import MAX_THREADS, call_any
from sfaas.runtime.txn.internal import ACTION, ACTION_B, resolve_function

log = logging.getLogger("sfaas.actions")

__all__ = ["Actions", "ActionSpans"]


class ActionSpans(Protocol):
    """What traces the actions (the worker's, with tracing on: ``worker.traces``)."""

    def action_context(self, key: str) -> Any:
        """The trace context of the transaction that wrote action record ``key`` (None:
        not traced, or not known here)."""

    def action_ran(self, context: Any, name: str, start_ns: int, tries: int) -> None:
        """Action ``name`` returned after ``tries`` tries, begun at ``start_ns``."""


class Actions:
    """Runs the post-commit actions of one process's stores (see the module docstring).

    ``done(operator, key)`` must delete the record ``key`` in a transaction. At most
    ``limit`` actions run at once; tries back off from ``backoff[0]`` to ``backoff[1]``
    seconds.
    """

    def __init__(self, done: Callable[[str, str], None], limit: int = 100,
                 backoff: tuple[float, float] = (0.1, 30.0)) -> None:
        self._done = done
        self.limit = limit
        self.backoff = backoff
        self._slots: asyncio.Semaphore | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            min(limit, MAX_THREADS), thread_name_prefix="sfaas-action")
        #: record → its task, from its record's commit until its deletion commits
        self.running: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: records whose action returned, waiting for their deletion to commit
        self.finishing: set[tuple[str, str]] = set()
        #: follow the records (off during a recovery's replay: ``load`` after it)
        self.live = True
        self.ran = self.tries_failed = 0
        #: with tracing on, a span of each action a traced transaction wrote
        self.spans: ActionSpans | None = None

    @property
    def pending(self) -> int:
        """Actions committed and not yet deleted."""
        return len(self.running) + len(self.finishing)

    def on_record(self, operator: str, key: str, value: bytes | None) -> None:
        """A runtime record was applied to a store here."""
        if not key.startswith(ACTION):
            return
        if value is None:
            self.finishing.discard((operator, key))
        elif self.live:
            self.start(operator, key, value)

    def load(self, stores: Mapping[tuple[str, int], Any]) -> int:
        """Start the action of every record in ``stores`` not running already; how many."""
        n = 0
        for (operator, _), store in stores.items():
            for k, v in store.prefixed(ACTION_B):
                if self.start(operator, k.decode(), v):
                    n += 1
        return n

    def start(self, operator: str, key: str, raw: bytes) -> bool:
        where = (operator, key)
        if where in self.running or where in self.finishing:
            return False
        context = self.spans.action_context(key) if self.spans is not None else None
        self.running[where] = asyncio.get_running_loop().create_task(
            self._run(operator, key, unpack(raw), context))
        return True

    async def _run(self, operator: str, key: str, record: list[Any], context: Any = None,
                   ) -> None:
        name, args, akey = record
        start_ns = time.time_ns() if context is not None else 0
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        delay = self.backoff[0]
        tries = 0
        while True:
            tries += 1
            token = EFFECT_KEY.set(akey)
            try:
                async with self._slots:  # (held for a try, not while backing off)
                    await call_any(self._pool, resolve_function(name), args)
                break
            except asyncio.CancelledError:
                self.running.pop((operator, key), None)
                raise
            except Exception as exc:
                self.tries_failed += 1
                log.warning("post-commit action %s (%s) failed on try %d: %s: %s; again in "
                            "%.1f s", akey, name, tries, type(exc).__name__, exc, delay)
            finally:
                EFFECT_KEY.reset(token)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])
        self.ran += 1
        if context is not None and self.spans is not None:
            self.spans.action_ran(context, name, start_ns, tries)
        self.running.pop((operator, key), None)
        self.finishing.add((operator, key))
        self._done(operator, key)

    def stop_all(self) -> list[asyncio.Task[None]]:
        """Cancel every running action (a recovery reloads them); the tasks."""
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        self.running.clear()
        self.finishing.clear()
        return tasks

    async def close(self) -> None:
        await asyncio.gather(*self.stop_all(), return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
