"""Following the coordinator: its messages acted on in order, a Commit that waits on peers
run as a task the next messages wait for — except a Recover, which cancels it (a lost peer
never finishes its re-runs) and goes first."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sfaas.errors import ChannelClosed
from sfaas.runtime import wire
from worker.links import CoordinatorLink
from worker.tasks import Tasks

log = logging.getLogger("sfaas.worker")

__all__ = ["CoordinatorInbox"]


class CoordinatorInbox:
    """Reads the coordinator's channel and hands each message on.

    ``commit(msg)`` commits an epoch; ``waits_on_peers(msg)``: that Commit's fallback phase
    may wait on peers; ``handle(msg)`` acts on any other message (False: stop following);
    ``index()``: this worker's slot (for the logs).
    """

    def __init__(
        self, uplink: CoordinatorLink, tasks: Tasks, *,
        commit: Callable[[wire.Commit], Coroutine[Any, Any, None]],
        waits_on_peers: Callable[[wire.Commit], bool],
        handle: Callable[[wire.Message], Awaitable[bool]], index: Callable[[], int],
    ) -> None:
        self._uplink = uplink
        self._tasks = tasks
        self._commit = commit
        self._waits_on_peers = waits_on_peers
        self._handle = handle
        self._index = index

    async def follow(self) -> bool:
        """Act on the coordinator's messages until told to stop (False) or the channel
        closed (True: the coordinator is lost)."""
        inbox: collections.deque[wire.Message] = collections.deque()
        recv: asyncio.Future[list[wire.Message]] | None = None
        commit: asyncio.Future[Any] | None = None
        try:
            while True:
                if not inbox or commit is not None:
                    if recv is None:
                        recv = asyncio.ensure_future(self._uplink.recv())
                    if commit is None:
                        try:
                            await recv  # (cheaper than asyncio.wait; its outcome is read below)
                        except Exception:  # noqa: S110 - ChannelClosed, handled below
                            pass
                    else:
                        either: set[asyncio.Future[Any]] = {recv, commit}
                        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    if recv.done():
                        got, recv = recv, None
                        try:
                            inbox.extend(got.result())
                        except ChannelClosed:
                            log.error("lost the coordinator", extra={"worker": self._index()})
                            return True
                    if commit is not None and any(isinstance(m, wire.Recover) for m in inbox):
                        commit.cancel()  # the recovery rolls its epoch back anyway
                        await asyncio.gather(commit, return_exceptions=True)
                        commit = None
                        inbox = _drop_rolled_back(inbox)
                    if commit is not None:
                        if not commit.done():
                            continue
                        done, commit = commit, None
                        if not done.cancelled():
                            done.result()  # a failed commit is a bug: stop loudly
                    if not inbox:
                        continue
                msg = inbox.popleft()
                if isinstance(msg, wire.Commit) and not self._waits_on_peers(msg):
                    await self._commit(msg)  # no cross-worker phase: nothing to wait for on peers
                elif isinstance(msg, wire.Commit):
                    commit = self._tasks.spawn(self._commit(msg))  # a recovery cancels it
                elif not await self._handle(msg):
                    return False
        finally:
            if recv is not None:
                recv.cancel()


def _drop_rolled_back(inbox: collections.deque[wire.Message]) -> collections.deque[wire.Message]:
    """The Begins and Commits before the first Recover are epochs it rolls back: dropped."""
    first = next(i for i, m in enumerate(inbox) if isinstance(m, wire.Recover))
    kept = [m for m in list(inbox)[:first] if not isinstance(m, (wire.Begin, wire.Commit))]
    return collections.deque([*kept, *list(inbox)[first:]])
