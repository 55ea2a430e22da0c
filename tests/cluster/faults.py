"""Faults that prove they happened (issue 48): every fault a chaos run injects is checked
to have taken effect — the process gone or stopped, the container paused or stopped, the
network link cut, the service's port closed — and a run fails naming any that did not.

A :class:`FaultLog` is kept by the chaos scenario (``tests.runtime.test_recovery._scenario``)
and handed to whatever injects its faults (the local cluster's kills and outages, the
nemesis' docker faults). Each injector calls :meth:`FaultLog.confirm` with a probe of the
fault's effect; :meth:`FaultLog.check` then fails the run if a fault's effect was never
seen, or if a kind of fault the schedule holds never took effect at all.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FaultLog", "Probe", "process_halted", "process_stopped", "port_closed"]

#: A probe of a fault's effect: what it saw when the effect holds, else None.
Probe = Callable[[], "str | None"]


def _proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``R``, ``S``, ``T``, ``Z``...), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def process_halted(pid: int) -> Probe:
    """The process is gone (or a zombie, or stopped): it runs no more."""

    def probe() -> str | None:
        state = _proc_state(pid)
        if state is None:
            return f"pid {pid} gone"
        return f"pid {pid} in state {state}" if state in "ZXTt" else None
    return probe


def process_stopped(pid: int) -> Probe:
    """The process exists and is stopped (SIGSTOP): paused, not dead."""

    def probe() -> str | None:
        state = _proc_state(pid)
        return f"pid {pid} stopped" if state in ("T", "t") else None
    return probe


def port_closed(host: str, port: int) -> Probe:
    """Nothing accepts connections on ``host:port`` (the service is down)."""

    def probe() -> str | None:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return None
        except OSError as exc:
            return f"{host}:{port} refuses ({type(exc).__name__})"
    return probe


@dataclass
class FaultLog:
    """Per kind of fault: how many fired (were injected) and how many took effect."""

    fired: Counter[str] = field(default_factory=Counter)
    effective: Counter[str] = field(default_factory=Counter)
    #: what each fault was seen to do, or why it was not
    seen: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def confirm(self, kind: str, what: str, probe: Probe, timeout: float = 10.0,
                      interval: float = 0.05) -> bool:
        """Record fault ``what`` of ``kind`` as fired, and as effective once ``probe`` sees
        its effect within ``timeout`` seconds (else as failed: the run will fail)."""
        self.fired[kind] += 1
        deadline = time.monotonic() + timeout
        while True:
            seen = await asyncio.to_thread(probe)
            if seen is not None:
                self.effective[kind] += 1
                self.seen.append(f"{what}: {seen}")
                return True
            if time.monotonic() > deadline:
                self.failed.append(f"{what}: no effect seen within {timeout:.0f} s")
                return False
            await asyncio.sleep(interval)

    def not_injected(self, kind: str, what: str, why: str) -> None:
        """A fault that could not be injected at all: the run fails naming it."""
        self.fired[kind] += 1
        self.failed.append(f"{what}: not injected ({why[-160:]})")

    def summary(self) -> dict[str, str]:
        """``{kind: "fired N, took effect M"}``, for the run's report."""
        return {k: f"fired {n}, took effect {self.effective[k]}" for k, n in sorted(self.fired.items())}

    def check(self, scheduled: Iterable[str]) -> None:
        """Fail unless every fault took effect and each ``scheduled`` kind did at least once."""
        assert not self.failed, f"faults that did not take effect: {self.failed}; {self.summary()}"
        never = sorted({k for k in scheduled if not self.effective[k]})
        assert not never, f"scheduled faults that never took effect: {never}; {self.summary()}"
