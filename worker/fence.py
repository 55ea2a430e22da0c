"""Self-fencing: a worker acts only while it holds a lease from the coordinator.

The coordinator answers every ``Heartbeat`` with ``Alive`` (echoing the beat's send time).
The worker's lease runs until ``sent + heartbeat_timeout × LEASE_FRACTION``, ``sent`` the
*send* time (its own monotonic clock) of the newest beat an ``Alive`` answered — not when
the answer arrived: after a pause the answers that waited in the socket are old.

Why a lost worker always holds an expired lease: the coordinator declares a worker lost
after ``heartbeat_timeout`` (T) without hearing from it. Every ``Alive`` it sent answered a
beat it heard, so at the loss it heard nothing for T since the newest acknowledged beat
arrived, and that beat was sent before it arrived: the loss comes later than ``sent + T``,
while the lease ended at ``sent + T/2``. Only the worker's own clock is compared with
itself (monotonic), and the coordinator's timer measures a span at least as long; clock
rates of two processes on any real machine differ by far less than the T/2 of margin.

Before every externally visible action — producing replies (``worker.egress``), writing an
epoch-log record, committing ingress offsets, reporting a round, answering a recovery,
sending a ``Call``/``Result`` to peers — the worker checks its lease (:meth:`FenceLease.valid`:
one clock read and a compare). With an expired lease it acts on nothing, and:

* if the lease expired by more than T, or the coordinator's channel is closed, and this
  process was not :meth:`~FenceLease.awake` throughout, it is fenced: one clear log line,
  then ``os._exit(EXIT_FENCED)`` at once — no flush of the producer, no offset commit, no
  clean stop that would act — and its supervisor starts a fresh process, which registers
  as a new member;
* if it was awake throughout — its own event loop ran at least every T/2
  (:meth:`FenceLease.tick`, from the heartbeat task) since the beat its lease runs from —
  the silence was the coordinator's (paused, or stopped and being restarted): it acts on
  nothing, leaves the coordinator's channel (the heartbeat task closes it once the lease
  expired by more than T) and rejoins the coordinator in its slot
  (``worker.membership.Membership.rejoin``), keeping its stores, like a worker whose
  coordinator died. A coordinator that declared this worker lost meanwhile gives the slot
  to its standby or a replacement and refuses the rejoin, and the worker leaves then
  (fenced); or, with the slot still empty, takes it back and rolls everyone back, as for
  any replacement. A fresh process would have done the same, 1–2 s later: the restart's
  backoff, its imports, its Kafka clients;
* otherwise it waits for the next ``Alive`` (:meth:`FenceLease.held`). A worker whose event loop
  was merely busy for longer than T/2 (a long merge, a GC pause) is in this case: its
  beats went out late, but the coordinator heard them, and the answers renew the lease
  within a round trip. Exiting then would turn every hiccup into a recovery.

Normal load never trips it: beats leave every T/4, so the lease (T/2) spans two beats of
slack, and the coordinator answers each beat as it reads it (the same step of its loop
that records the beat; it never blocks its loop for long — slow work, MinIO and file I/O,
runs in threads). The worker reads the answers on a task of their own
(``worker.links.CoordinatorLink``), never behind a slow message it is acting on. A
worker whose loop is blocked past ``1.5 × T`` after its last acknowledged beat is fenced on
waking: the coordinator heard nothing for at least T by then and declared it lost (its
loop stood still for the pause, so it was not awake). The heartbeat task checks this every
T/4, so an idle zombie leaves too.

What the lease cannot stop: bytes handed to the OS or to the Kafka producer before the
pause (aiokafka's sender may deliver its buffered batch on resume, before any of this
code runs). For replies the broker stops them: they leave in transactions of the slot's
transactional producer, which the slot's next process fences (``worker.egress``);
``tests/runtime/test_fencing_cluster.py`` checks that none of a zombie's replies is seen.
The epoch log is not transactional; the chaos test checks that no worker logged an epoch
twice.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from sfaas.errors import EXIT_FENCED, ChannelClosed
from sfaas.runtime import ports, wire

log = logging.getLogger("sfaas.worker")

__all__ = ["FenceLease", "LEASE_FRACTION", "Fenced"]

#: The lease: this fraction of ``heartbeat_timeout`` from the send time of an answered beat.
LEASE_FRACTION = 0.5
#: Seconds between two looks at the coordinator's channel while :meth:`FenceLease.held_open`
#: waits.
OPEN_POLL = 0.1


class Fenced(Exception):
    """Raised (in tests, with ``exit=None``) where a fenced worker would exit."""


def _exit_now(code: int) -> None:
    """Leave at once: the process's end (``sfaas.runtime.ports.ProcessPort``)."""
    ports.current().process.exit(code)


class FenceLease:
    """A worker's lease (see the module docstring).

    ``closed()``: the coordinator's channel is closed; ``rejoins``: a worker awake
    throughout rejoins the coordinator instead of leaving (with snapshot rounds on: without
    them a lost coordinator ends the cluster); ``clock``: a monotonic clock (default: the
    process's clock port's; a fake one in tests); ``exit``: how a fenced worker leaves
    (default: ``os._exit``; ``None`` raises :class:`Fenced` instead).
    """

    def __init__(self, timeout: float, closed: Callable[[], bool], *, rejoins: bool = True,
                 clock: Callable[[], float] | None = None,
                 exit: Callable[[int], None] | None = _exit_now) -> None:
        self._timeout = timeout
        self._closed = closed
        self._rejoins = rejoins
        self._clock = clock or ports.current().clock.monotonic
        self._exit = exit
        #: the lease runs until this time (``clock``); -inf: none yet, +inf: not enforced
        self.until = math.inf
        self._renewed = asyncio.Event()
        #: why the worker was fenced ("" : it was not)
        self.fenced = ""
        #: the index and generation the coordinator confirmed last
        self.index = -1
        self.generation = 0
        #: while rejoining a restarted coordinator nothing may act, but nothing fences
        self._waiting = False
        #: the last :meth:`tick` (``clock``), and when the last stall seen by one ended
        self._ticked = -math.inf
        self._still_until = math.inf

    # -- granting -----------------------------------------------------------------------------
    def grant(self, sent: float) -> None:
        """An answer to the beat (or registration) sent at ``sent`` arrived."""
        until = sent + self._timeout * LEASE_FRACTION
        if until > self.until or self.until == math.inf:
            self.until = until
        self._waiting = False
        self._renewed.set()
        self._renewed = asyncio.Event()

    def start(self, now: float) -> None:
        """The lease starts ``now``, granted by this process itself (assigned, not yet
        ready: the heartbeat task's start). It runs now, so it counts as awake from here: a
        coordinator silent from the first beat on is rejoined, not left. Before, the first
        tick counted as the end of a stall, so a standby promoted just before a coordinator
        cut could never be awake and left (exit, restart) instead of rejoining in its slot
        (the nemesis' seed 4: its fresh process then took another slot)."""
        self._ticked = now
        self._still_until = -math.inf
        self.grant(now)

    def alive(self, msg: wire.Alive) -> None:
        """The coordinator's ``Alive`` (read by ``CoordinatorLink``)."""
        self.on_alive(msg.index, msg.generation, msg.sent)

    def on_alive(self, index: int, generation: int, sent: float) -> None:
        """The coordinator's ``Alive``."""
        self.index, self.generation = index, generation
        self.grant(sent)

    def suspend(self) -> None:
        """The coordinator is gone and the worker waits to rejoin: act on nothing until a
        new registration is answered (:meth:`grant`), without fencing."""
        self._waiting = True
        self.until = -math.inf

    # -- this process' own liveness ----------------------------------------------------------
    def tick(self) -> None:
        """This process' event loop runs now (the heartbeat task, every T/4): a longer gap
        than :meth:`_still` since the last tick was a pause or a stall of its own."""
        now = self._clock()
        if now - self._ticked > self._still():
            self._still_until = now
        self._ticked = now

    def _still(self) -> float:
        """The longest gap between ticks of a process that counts as awake: the lease (T/2).
        Its beats then left at most 3T/4 apart, within the coordinator's T."""
        return self._timeout * LEASE_FRACTION

    def awake(self) -> bool:
        """Did this process run throughout since it sent the beat its lease runs from (no
        gap between ticks longer than :meth:`_still`, none going on)? Then a silence since
        is the coordinator's, not a pause of this process (always False when the worker
        does not rejoin: ``rejoins``)."""
        sent = self.until - self._timeout * LEASE_FRACTION
        return (self._rejoins and self._clock() - self._ticked <= self._still()
                and self._still_until < sent)

    def coordinator_silent(self) -> bool:
        """Awake, the coordinator's channel open and the lease expired by more than T: the
        coordinator stands still (paused, or stuck): leave its channel and rejoin it."""
        return (not self._waiting and not self._closed()
                and self.expired_for() > self._timeout and self.awake())

    # -- checking -----------------------------------------------------------------------------
    def valid(self) -> bool:
        """May the worker act now? (the hot-path check: one clock read)"""
        return self._clock() < self.until

    def expired_for(self) -> float:
        """Seconds since the lease ended (≤ 0: it holds)."""
        return self._clock() - self.until

    def check(self) -> bool:
        """True: the lease holds. False: it does not — and if it is past saving and this
        process was not awake throughout, the worker is fenced (it leaves; see the module
        docstring)."""
        if self.valid():
            return True
        if not self._waiting and (self._closed() or self.expired_for() > self._timeout) \
                and not self.awake():
            self.fence()
        return False

    async def held(self) -> None:
        """Return once the worker may act: at once while the lease holds, else after the
        next answer renews it. A worker past saving is fenced (leaves) instead."""
        while not self.check():
            if self.fenced:  # (only with an ``exit`` that returns: tests)
                raise Fenced(self.fenced)
            # (until the next answer, or until the lease is past saving; past it and not
            # fenced, this process is awake: check again after a tick's gap)
            left = self._timeout - self.expired_for()
            wait = None if self._waiting else max(0.01, left) if left > 0 else self._still()
            try:
                await asyncio.wait_for(self._renewed.wait(), wait)
            except TimeoutError:
                pass

    async def held_open(self) -> None:
        """:meth:`held`, for a recovery's steps: a closed coordinator channel ends the wait
        with :class:`~sfaas.errors.ChannelClosed`. The recovery runs inside the loop that
        reads the coordinator, and a worker awake while its lease lapsed closes that channel
        to rejoin; the rejoin that renews the lease runs only once the recovery returns
        (the simulator's seed 49: it waited for ever)."""
        while not self.open():
            try:
                await asyncio.wait_for(self.held(), OPEN_POLL)
            except TimeoutError:
                pass

    def open(self) -> bool:
        """:meth:`held_open`'s test, once: True while the lease holds, False while it
        lapsed with the coordinator's channel open; :class:`~sfaas.errors.ChannelClosed`
        once it lapsed with the channel closed (the recovery ends; the worker rejoins)."""
        if self.check():
            return True
        if self._closed():
            raise ChannelClosed("the coordinator's channel closed during the recovery "
                                "(the worker rejoins)")
        return False

    def fence(self, why: str = "") -> None:
        """Leave: no word from the coordinator for too long (or its channel closed; or
        ``why``: it could not be rejoined)."""
        if why:
            self.fenced = f"fenced: {why}, leaving (worker {self.index})"
        else:
            gone = self._clock() - (self.until - self._timeout * LEASE_FRACTION)
            why = "its channel is closed" if self._closed() else "lease expired"
            self.fenced = (f"fenced: no word from the coordinator for {gone:.1f} s ({why}), "
                           f"leaving (worker {self.index}, generation {self.generation})")
        log.error("%s", self.fenced)
        if self._exit is None:
            raise Fenced(self.fenced)
        self._exit(EXIT_FENCED)
