"""Following the coordinator: its messages acted on in order, a Commit that waits on peers
run as a task the next messages wait for — except a Recover, which cancels it (a lost peer
never finishes its re-runs) and goes first."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from sfaas.errors import ChannelClosed
from sfaas.runtime import wire
from worker.links import CoordinatorLink
from worker.needs import Commits, Directions, Spawner
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["CoordinatorInbox"]


class CoordinatorInbox:
    """Reads the coordinator's channel and hands each message on: a Commit to ``epochs``
    (run as a task when its fallback phase may wait on peers), any other message to
    ``directions`` (ports of ``worker.needs``); ``state``: this worker's slot, for the logs.
    """

    def __init__(self, uplink: CoordinatorLink, tasks: Spawner, *, epochs: Commits,
                 directions: Directions, state: WorkerState) -> None:
        self._uplink = uplink
        self._tasks = tasks
        self._epochs = epochs
        self._directions = directions
        self._state = state

    async def follow(self) -> bool:
        """Act on the coordinator's messages until told to stop (False) or the channel
        closed (True: the coordinator is lost)."""
        f = _Following(self._uplink)
        try:
            while True:
                if not f.inbox or f.commit is not None:
                    if not await f.fill():
                        log.error("lost the coordinator", extra={"worker": self._state.index})
                        return True
                    if not await f.settle():
                        continue
                if not await self._act(f.inbox.popleft(), f):
                    return False
        finally:
            f.close()

    async def _act(self, msg: wire.Message, f: _Following) -> bool:
        """Act on ``msg``; False: stop following."""
        if isinstance(msg, wire.Commit) and not self._epochs.waits_on_peers(msg):
            await self._epochs.commit(msg)  # no cross-worker phase: nothing to wait for on peers
        elif isinstance(msg, wire.Commit):
            f.commit = self._tasks.spawn(self._epochs.commit(msg))  # a recovery cancels it
        elif not await self._directions.handle(msg):
            return False
        return True


class _Following:
    """The messages read and not yet acted on, the read under way and the Commit running
    as a task (if any)."""

    def __init__(self, uplink: CoordinatorLink) -> None:
        self._uplink = uplink
        self.inbox: collections.deque[wire.Message] = collections.deque()
        self.recv: asyncio.Future[list[wire.Message]] | None = None
        self.commit: asyncio.Future[Any] | None = None

    async def fill(self) -> bool:
        """Wait for the coordinator's next messages (or the running Commit's end) and add
        them to the inbox; False: the channel closed."""
        if self.recv is None:
            self.recv = asyncio.ensure_future(self._uplink.recv())
        recv = self.recv
        if self.commit is None:
            try:
                await recv  # (cheaper than asyncio.wait; its outcome is read below)
            except Exception:  # noqa: S110 - ChannelClosed, handled below
                pass
        else:
            either: set[asyncio.Future[Any]] = {recv, self.commit}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if recv.done():
            self.recv = None
            try:
                self.inbox.extend(recv.result())
            except ChannelClosed:
                return False
        return True

    async def settle(self) -> bool:
        """A Recover cancels the running Commit (the recovery rolls its epoch back anyway);
        one that failed raises (a bug: stop loudly). True: a message may be acted on now."""
        if self.commit is not None and any(isinstance(m, wire.Recover) for m in self.inbox):
            self.commit.cancel()
            await asyncio.gather(self.commit, return_exceptions=True)
            self.commit = None
            self.inbox = _drop_rolled_back(self.inbox)
        if self.commit is not None:
            if not self.commit.done():
                return False
            done, self.commit = self.commit, None
            if not done.cancelled():
                done.result()  # a failed commit is a bug: stop loudly
        return bool(self.inbox)

    def close(self) -> None:
        if self.recv is not None:
            self.recv.cancel()


def _drop_rolled_back(inbox: collections.deque[wire.Message]) -> collections.deque[wire.Message]:
    """The Begins and Commits before the first Recover are epochs it rolls back: dropped."""
    first = next(i for i, m in enumerate(inbox) if isinstance(m, wire.Recover))
    kept = [m for m in list(inbox)[:first] if not isinstance(m, (wire.Begin, wire.Commit))]
    return collections.deque([*kept, *list(inbox)[first:]])
