"""Fuzz: egress records as a client reads them (anyone who can write to the egress topic
can put anything on a client's reply partition), through ``Client._read_replies``.

Outcomes: a reply completes the call waiting for its request id (with exactly that
reply), or the record is skipped — counted in ``Client.rejected`` and logged — or it is
a recovery's fence record (``wire.FENCE``, in an aborted transaction), skipped silently. The reader
never dies (which would leave every later call to time out) and never completes a call
with another request's reply.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfaas.client import Client
from sfaas.errors import TransactionAborted, reply_error
from sfaas.runtime import wire

from .budget import fuzz
from .harness import settings
from .outcomes import Outcomes
from .strategies import deep_values, hostile, mix, packed, values, wrong_fields

_rids = st.sampled_from([f"c-{i}" for i in range(6)])


def reply_fields() -> st.SearchStrategy[list[Any]]:
    return st.one_of(
        st.tuples(_rids, st.just(True), values(), st.none(), st.none()),
        st.tuples(_rids, st.just(False), st.none(), st.text(max_size=20), st.text(max_size=40)),
    ).map(list)


def records() -> st.SearchStrategy[bytes | None]:
    valid = reply_fields().map(lambda f: msgpack.packb(f, use_bin_type=True))
    return mix((4, valid), (5, hostile(valid, packed(wrong_fields(reply_fields())), packed(deep_values()))),
               (1, st.none()), (1, st.just(wire.FENCE)))


class _Record:
    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset = offset
        self.value = value


class _Consumer:
    """Hands out the records once, then waits like an idle consumer."""

    def __init__(self, values: list[bytes | None]) -> None:
        self.batches = [{"tp": [_Record(i, v) for i, v in enumerate(values)]}]
        self.drained = asyncio.Event()

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[str, list[_Record]]:
        if self.batches:
            return self.batches.pop()
        self.drained.set()
        await asyncio.sleep(3600)
        return {}


@pytest.mark.spread(accepted=["call completed"], min_accepted=0.2, each=["skipped", "fence skipped"])
@fuzz()
@given(batch=st.lists(records(), min_size=1, max_size=10))
async def test_client_takes_replies_and_skips_the_rest(batch: list[bytes | None], tmp_path_factory: Any,
                                                       outcomes: Outcomes) -> None:
    c = Client("fuzzapp", settings=settings("/nonexistent"))
    loop = asyncio.get_running_loop()
    waiting = {f"c-{i}": loop.create_future() for i in range(6)}
    c._waiting = dict(waiting)
    consumer = _Consumer(batch)
    c._consumer = consumer
    reader = asyncio.create_task(c._read_replies())
    await asyncio.wait_for(consumer.drained.wait(), 10)
    assert not reader.done(), reader  # the reader lives on
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    # the first valid reply for each id completes its call, and nothing else does
    first: dict[str, wire.Reply] = {}
    skipped = fences = 0
    for value in batch:
        if value == wire.FENCE:  # (a recovery's fence: not a reply, nor a rejected one)
            fences += 1
            continue
        try:
            r = wire.Reply.decode(value)  # type: ignore[arg-type]
        except wire.ProtocolError:
            skipped += 1
            continue
        first.setdefault(r.rid, r)
    assert c.rejected == skipped
    outcomes.add("skipped") if skipped else None
    outcomes.add("fence skipped") if fences else None
    for rid, fut in waiting.items():
        if rid in first:
            assert fut.done() and fut.result().encode() == first[rid].encode()  # (NaN != NaN)
            outcomes.add("call completed")
            r = first[rid]
            if not r.ok:  # what Client.call raises for it
                exc = reply_error(r.error_type or "TransactionAborted", r.reason or "aborted")
                assert isinstance(exc, TransactionAborted)
        else:
            assert not fut.done()
