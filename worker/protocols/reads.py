"""The worker's side of direct state reads: answer a client's ``Read`` from the committed
state of a partition this worker owns (``sfaas.runtime.protocols.reads``).

What a read sees is what a read through Kafka sees (``sfaas.runtime.txn.reads``): the
stores between two commits — an epoch's writes stay buffered until its commit, and a
commit is applied only after every worker's epoch-log record is durable, so a read never
shows state a recovery could take back. A worker answers ``NOT_HERE`` for a partition it
does not own, and for every partition while a recovery rolls back and replays (its
stores are behind the replies already sent) — the client then asks the coordinator
again, or reads through Kafka.
"""

from __future__ import annotations

import logging

from sfaas.errors import SfaasError
from sfaas.runtime import wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.reads import NOT_HERE
from sfaas.runtime.txn.engine import describe
from sfaas.runtime.txn.reads import GET, SCAN, read
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker.reads")

__all__ = ["ReadServer"]


class ReadServer:
    """Answers direct reads (see the module docstring) while ``WorkerState.reads_open``;
    a client's channel is served by ``worker.direct.DirectIngress.serve``."""

    def __init__(self, state: WorkerState) -> None:
        self._state = state
        #: reads answered, and those turned away (``NOT_HERE``)
        self.answered = 0
        self.turned_away = 0

    def answer(self, msg: wire.Read) -> wire.ReadReply:
        st = self._state
        eng = st.engine
        owners = st.owners
        if eng is None or not st.reads_open or not 0 <= msg.partition < len(owners) \
                or owners[msg.partition] != st.index:
            self.turned_away += 1
            return wire.ReadReply(msg.id, False, None, NOT_HERE,
                                  f"worker {st.index} does not serve partition {msg.partition} "
                                  "now")
        try:
            if msg.key:
                if partition_of(msg.operator, msg.key, eng.partitions) != msg.partition:
                    raise wire.ProtocolError(f"key {msg.key!r:.80} is not in partition "
                                             f"{msg.partition}")
                value = read(eng.app, eng.stores, lambda op, k: msg.partition, msg.operator,
                             msg.key, GET, [])
            else:
                value = read(eng.app, eng.stores, lambda op, k: msg.partition, msg.operator,
                             "", SCAN, [msg.partition, msg.prefix, msg.limit])
        except SfaasError as exc:
            etype, reason = describe(exc)
            return wire.ReadReply(msg.id, False, None, etype, reason)
        self.answered += 1
        return wire.ReadReply(msg.id, True, value, "", "")
