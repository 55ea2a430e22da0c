"""Fuzz: egress records as a client reads them (anyone who can write to the egress topic
can put anything on a client's reply partition), through ``Client._take_replies`` (where
the client's reader thread hands them to the event loop).

Outcomes: a reply completes the call waiting for its request id (with exactly that
reply), or the record is skipped — counted in ``Client.rejected`` and logged. Taking
them never raises (which would lose the rest of the reader's batch, leaving those calls
to time out) and never completes a call with another request's reply.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from sfaas import wire
from sfaas.client import Client
from sfaas.errors import TransactionAborted, reply_error

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
               (1, st.none()))


@fuzz()
@given(batch=st.lists(records(), min_size=1, max_size=10))
async def test_client_takes_replies_and_skips_the_rest(batch: list[bytes | None], tmp_path_factory: Any,
                                                       outcomes: Outcomes) -> None:
    c = Client("fuzzapp", settings=settings("/nonexistent"))
    loop = asyncio.get_running_loop()
    waiting = {f"c-{i}": loop.create_future() for i in range(6)}
    c._waiting = dict(waiting)
    c._take_replies(list(enumerate(batch)))  # (raises nothing: the reader thread lives on)
    # the first valid reply for each id completes its call, and nothing else does
    first: dict[str, wire.Reply] = {}
    skipped = 0
    for value in batch:
        try:
            r = wire.Reply.decode(value)  # type: ignore[arg-type]
        except wire.ProtocolError:
            skipped += 1
            continue
        first.setdefault(r.rid, r)
    assert c.rejected == skipped
    outcomes.add("skipped") if skipped else None
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
