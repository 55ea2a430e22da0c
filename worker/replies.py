"""An epoch's decided requests, answered: each reply to where its client waits for it.

A request read from the ingress topic is answered in the egress topic (``worker.egress``,
in the slot's Kafka transactions); one a client sent straight to this worker, on its
client's channel (``worker.direct``); one the runtime made, nowhere. A replayed request
whose reply is already out (a recovery: ``WorkerState.answered``) is not answered again —
only compared with the reply made before the crash, and a difference reported loudly.
"""

from __future__ import annotations

import logging
from typing import Any

from sfaas.runtime import wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.loop import Fate
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.links import CoordinatorLink
from worker.needs import Completions, Divergences
from worker.state import Pending, WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Replies", "astuple_head"]


def astuple_head(r: wire.Reply) -> tuple[str, bool, Any, str | None, str | None]:
    """A reply without its traceback (what a replay must reproduce)."""
    return r.rid, r.ok, r.value, r.error_type, r.reason


class Replies:
    """Answers the decided requests of each epoch (see the module docstring)."""

    def __init__(self, settings: Settings, state: WorkerState, *, direct: DirectIngress,
                 completions: Completions, egress: Egress, metrics: Divergences,
                 uplink: CoordinatorLink) -> None:
        self._settings = settings
        self._state = state
        self._direct = direct
        self._completions = completions
        self._egress = egress
        self._metrics = metrics
        self._uplink = uplink

    def reply(self, fates: list[Fate[Pending]]) -> None:
        """Queue the replies of decided ``fates`` (a replay's already out: only mark them done)."""
        st = self._state
        for f in fates:
            req = f.item.request
            if f.item.partition < 0:  # a request the runtime made: nobody waits for a reply
                continue
            if f.committed:
                reply = wire.Reply(req.rid, True, f.value)
            else:
                reply = wire.Reply(req.rid, False, None, str(f.value[0]), str(f.value[1]))
                if self._settings.reply_tracebacks and st.engine is not None:
                    reply.traceback = st.engine.tracebacks.get((f.tid, str(f.value[1])))
            if f.item.direct:  # (its epoch is durable: answered on its client's channel)
                self._direct.replied(f.item, reply)
                continue
            before = st.answered.get(req.rid)
            if before is not None:  # a replay: this reply is already in the egress topic
                if wire.Reply(*astuple_head(before)).encode() \
                        != wire.Reply(*astuple_head(reply)).encode():
                    self._diverged(req, before, reply)
                st.applied_item(f.item)
                if f.item.offset >= 0:
                    self._completions.complete(f.item.partition, f.item.offset)
                continue
            self._egress.add(req.reply_partition, reply.encode(), f.item.partition, f.item.offset)
            st.applied_item(f.item)

    def _diverged(self, req: wire.Request, before: wire.Reply, after: wire.Reply) -> None:
        """A replayed request answered otherwise than before the crash: say so, loudly."""
        def brief(r: wire.Reply) -> str:
            return f"{r.value!r:.120}" if r.ok else f"{r.error_type}: {r.reason!r:.120}"

        b, a = brief(before), brief(after)
        self._metrics.divergences_total += 1
        log.error("replay diverged: %s.%s on key %r (request %s) replied %s before the crash "
                  "and %s in the replay: it is not deterministic (use ctx.now(), ctx.random() "
                  "or ctx.run for what may differ between runs) — or the app's code changed "
                  "since the epoch was logged", req.operator, req.function,
                  req.key, req.rid, b, a, extra={"worker": self._state.index})
        if not self._uplink.closed:
            self._uplink.send(wire.Diverged(self._state.index, req.rid, req.operator,
                                            req.function, req.key[:200], b, a))
