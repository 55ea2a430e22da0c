"""Report a stall of a service's event loop, with the code that held it (issue 48).

A loop that stands still near the heartbeat timeout costs a cluster a recovery: a
coordinator whose loop stood still for 1 s reads every worker's beats late and loses them
all at once, and the workers, hearing nothing meanwhile, leave it
("no word from the coordinator for 1.8 s while this worker ran"). The nemesis saw exactly
that mid-recovery, with no line in any log saying what the coordinator was doing.

:class:`StallWatch` ticks on the loop every :data:`TICK` seconds; a daemon thread reads the
last tick's time and, once it is older than the threshold, logs a warning with the loop
thread's stack at that moment — the code holding the loop (a blocking call, a long
computation). When the loop ticks again the thread logs how long the stall lasted.

A stall that stops the thread too — the whole process stopped or starved (a SIGSTOP, a
frozen container, a CPU given to others), or C code keeping the GIL — shows as the thread
waking late; the process's CPU time over that gap tells the two apart (little: it stood
still, not its code; most of it: held by code that kept the GIL). A stack taken after the
loop moved on is never reported as the culprit.

A stall held by code reports the CPU the process used meanwhile too: little of it means the
loop's thread waited — on a blocking call (I/O, a lock, a sleep), or for a CPU on a starved
host, when its stack shows code that cannot wait (a dict lookup) and only says where.

The thread only reads the loop's tick time and logs; the loop owns the tick.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("sfaas.stalls")

__all__ = ["StallWatch", "TICK", "STACK_EVERY"]

#: Seconds between the loop's ticks (and between the watching thread's looks).
TICK = 0.1
#: Seconds between two stacks in the log (each stall's end is always logged).
STACK_EVERY = 5.0
#: Frames of the loop thread's stack a report shows (the innermost ones).
FRAMES = 12
#: Names of the functions a loop is in while it waits for events (nothing holds it), and
#: the files whose frame is innermost then under uvloop (its waiting is C code).
_WAITING = {"select", "poll", "epoll", "_run_once", "run_forever"}
_WAITING_IN = ("asyncio/runners.py", "uvloop/__init__.py")


def _waited(used: float, span: float) -> bool:
    """Did a process that used ``used`` seconds of CPU over ``span`` seconds mostly wait?
    (Under a quarter: on a shared CPU a busy process still gets a share.)"""
    return used < span / 4


class StallWatch:
    """Watch ``loop`` (run by the calling thread) for stalls of ``threshold`` seconds or more
    (see the module docstring); :meth:`start` on the loop's thread, :meth:`stop` at the end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float) -> None:
        self._loop = loop
        self._threshold = threshold
        self._loop_thread = threading.get_ident()
        #: the last tick's (monotonic time, process CPU time): written by the loop only,
        #: one reference swapped at a time
        self._mark = (time.monotonic(), time.process_time())
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        #: stalls seen, those reported with their stack, and those the watching thread
        #: stood still for too (the watching thread's counts)
        self.stalls = 0
        self.stacks = 0
        self.frozen = 0

    def start(self) -> None:
        self._tick()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def _tick(self) -> None:
        self._mark = (time.monotonic(), time.process_time())
        self._handle = self._loop.call_later(TICK, self._tick)

    def _watch(self) -> None:
        stalled_since: float | None = None  # the last tick before the stall being watched
        last_stack = -STACK_EVERY
        woke, cpu = time.monotonic(), time.process_time()
        while not self._stop.wait(TICK):
            now, cpu_now = time.monotonic(), time.process_time()
            late, used = now - woke - TICK, cpu_now - cpu
            woke, cpu = now, cpu_now
            if late >= self._threshold:  # this thread did not run either: see _frozen
                self._frozen(late, used)
                stalled_since = None
                continue
            last, last_cpu = self._mark
            if stalled_since is not None and last != stalled_since:
                log.warning("the event loop stood still for %.2f s", last - stalled_since)
                stalled_since = None
            if stalled_since is None and now - last >= self._threshold:
                stalled_since = last
                self.stalls += 1
                if now - last_stack >= STACK_EVERY and self._report(last, last_cpu, now):
                    last_stack = now

    def _frozen(self, late: float, used: float) -> None:
        """This thread woke ``late`` seconds late, the process having used ``used`` seconds
        of CPU meanwhile: code that kept the GIL (C code) if it did not mostly wait
        (:func:`_waited`), else the whole process was stopped or starved."""
        self.stalls += 1
        self.frozen += 1
        if not _waited(used, late):
            log.warning("the process did not run Python for %.2f s (%.2f s of CPU used): held "
                        "by code that kept the GIL", late, used)
        else:
            log.warning("the process did not run for %.2f s (%.2f s of CPU used): the whole "
                        "process stood still (a starved CPU, a pause), not its code", late, used)

    def _report(self, last: float, last_cpu: float, now: float) -> bool:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return False
        stack = traceback.extract_stack(frame)[-FRAMES:]
        used = time.process_time() - last_cpu
        if self._mark[0] != last:  # (it moved on while the stack was taken: not the culprit)
            return False
        if stack and (stack[-1].name in _WAITING or stack[-1].filename.endswith(_WAITING_IN)):
            return False  # (it is waiting for events: it ran since, the tick is due)
        self.stacks += 1
        waited = ("; it waited, on a blocking call (I/O, a lock, a sleep) or for a CPU (a "
                  "starved host)" if _waited(used, now - last) else "")
        log.warning("the event loop has not run for %.2f s (%.2f s of CPU used%s); it is held "
                    "by:\n%s", now - last, used, waited,
                    "".join(traceback.format_list(stack)).rstrip())
        return True
