"""The coordinator's inbox: workers' messages waiting for the epoch barrier or a recovery.

The connection handlers put reports and recovery answers here; the one protocol running
(the barrier, a leased run, a recovery) takes them. A loss is put here too (:class:`Lost`),
so whatever waits is interrupted, and so is a wake-up of a leased run (:class:`Tick`); a
wake-up of live epochs is a flag beside the queue (:meth:`Inbox.wake`).
"""

from __future__ import annotations

import asyncio

from sfaas.runtime import wire

__all__ = ["INBOX_LIMIT", "Inbox", "Interrupted", "Lost", "Tick"]

#: Messages (reports, recovery answers) waiting for the epoch barrier or a recovery. When
#: it is full, a worker's channel is not read until the barrier takes one; a loss marker
#: displaces the oldest waiting message (what it belonged to is abandoned by the loss).
INBOX_LIMIT = 4096


class Interrupted(Exception):
    """A worker was lost while the coordinator waited for the workers."""


class Lost(wire.Message):
    """Put into the inbox when a worker is lost: interrupts a barrier or a recovery."""


class Tick(wire.Message):
    """Put into the inbox to make an idle leased run look now whether a round or a switch
    is due (``coordinator.protocols.lease``)."""


class Inbox(asyncio.Queue[wire.Message]):
    """A bounded queue of workers' messages that a loss always gets into."""

    def __init__(self, limit: int = INBOX_LIMIT) -> None:
        super().__init__(maxsize=limit)
        self._loss = asyncio.Event()
        self._wakeup = asyncio.Event()

    # -- wake-ups ------------------------------------------------------------------------------
    def wake(self) -> None:
        """A worker has work (``wire.Wakeup``), or a rescale waits for an epoch boundary:
        begin the next epoch at once."""
        self._wakeup.set()

    @property
    def woken(self) -> bool:
        return self._wakeup.is_set()

    async def wait_woken(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a wake-up."""
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except TimeoutError:
            pass

    def take_wakeup(self) -> None:
        """An epoch begins: the wake-ups so far are answered."""
        self._wakeup.clear()

    # -- losses --------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Interrupt the barrier or recovery in progress, even with a full inbox."""
        if self.full():
            self.get_nowait()
        self.put_nowait(Lost())
        self._loss.set()

    @property
    def interrupted(self) -> bool:
        """Was a loss put in since :meth:`rearm`?"""
        return self._loss.is_set()

    async def wait_interrupted(self) -> None:
        await self._loss.wait()

    def rearm(self) -> None:
        """A recovery starts: the losses so far are being dealt with."""
        self._loss.clear()

    def tick(self) -> None:
        """Wake an idle leased run (dropped when the inbox is full: it is not idle then)."""
        if not self.full():
            self.put_nowait(Tick())

    def discard(self) -> None:
        """Drop everything waiting (from before a recovery attempt: stale reports, loss
        markers)."""
        while not self.empty():
            self.get_nowait()
