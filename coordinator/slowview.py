"""The status page's slow-request view: the slowest and the aborted requests of the last
minute across the workers, each with its phases (issue 50).

Each worker keeps its own (``worker.slowest``) and sends it on a heartbeat when it changed
(``wire.Heartbeat.slow``); this keeps the newest of each slot — at most
``SLOWEST_KEPT + ABORTED_KEPT`` requests a slot — and the page shows what is younger than
a minute. With the setting ``jaeger_ui``, a request whose trace was recorded links to it.
"""

from __future__ import annotations

from typing import Any

from sfaas.runtime import wire

__all__ = ["SlowView", "WINDOW", "COLUMNS"]

#: Seconds a request stays on the page (the workers' window too).
WINDOW = 60.0
#: The view's columns (a phase's duration, or what the request met).
COLUMNS = ["request", "function", "worker", "outcome", "latency", "queued", "executed",
           "barrier", "commit", "re-runs", "fallback", "effects", "epoch", "ago"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


class SlowView:
    """The workers' slowest and aborted requests, by slot (see the module docstring)."""

    def __init__(self) -> None:
        self._by_slot: dict[int, list[wire.SlowRequest]] = {}

    def heartbeat(self, index: int, beat: wire.Heartbeat) -> None:
        """Worker ``index``'s beat: its view replaces the last one it sent, if it changed."""
        if beat.slow_fresh:
            self._by_slot[index] = [wire.SlowRequest(*r) for r in beat.slow]

    def rows(self, now: float, jaeger_ui: str = "") -> list[list[Any]]:
        """The table's rows, slowest first; a request cell is ``[id, trace URL]`` when its
        trace can be opened in ``jaeger_ui``."""
        live = [(slot, r) for slot, rs in self._by_slot.items() for r in rs
                if now - r.at <= WINDOW]
        live.sort(key=lambda sr: -sr[1].latency)
        ui = jaeger_ui.rstrip("/")
        out: list[list[Any]] = []
        for slot, r in live:
            rid: Any = [r.rid, f"{ui}/trace/{r.trace_id}"] if ui and r.trace_id else r.rid
            out.append([rid, r.function, str(slot), r.outcome, _ms(r.latency), _ms(r.queued),
                        _ms(r.executed), _ms(r.barrier), _ms(r.commit), str(r.attempts),
                        "yes" if r.fallback else "no", str(r.effects), str(r.epoch),
                        f"{max(0.0, now - r.at):.0f} s"])
        return out
