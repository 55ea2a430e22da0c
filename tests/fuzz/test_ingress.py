"""Fuzz: ingress records (what anyone who can write to the ingress topic sends), through
the worker's real path: ``Ingress.admit`` per record, then epochs (``EpochRunner.begin``,
``execute``, ``commit``) that run what was admitted and produce the replies.

Outcomes: a request runs and gets exactly one reply (a result or its transaction's error),
or the record is rejected — counted, logged, and answered with a ``BadRequest`` error
reply when it names a request id and an existing reply partition. Never an exception out
of the worker, a request without its reply, or a reply to a request that was never made.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfaas.errors import BadRequest
from sfaas.runtime import wire
from sfaas.runtime.codec import MAX_ARGS

from .budget import fuzz
from .harness import FUNCTIONS, OPERATORS, PARTITIONS, EchoPeer, bare_worker, run_epochs
from .outcomes import Outcomes
from .strategies import deep, deep_values, hostile, mix, packed, values, wrong_fields

_rids = st.one_of(st.uuids().map(lambda u: u.hex), st.text(min_size=1, max_size=8))


_hex = st.text("0123456789abcdef", min_size=1, max_size=32)
#: W3C traceparents: well formed, or nearly (a field too short, upper case, text)
_traceparents = st.one_of(
    st.tuples(st.just("00"), _hex.map(lambda h: h.rjust(32, "0")),
              _hex.map(lambda h: h[:16].rjust(16, "1")), st.sampled_from(["01", "00"]))
    .map("-".join),
    st.tuples(st.just("00"), _hex, _hex, st.just("01")).map("-".join),
    st.text(max_size=60), st.just("00-" + "A" * 32 + "-" + "b" * 16 + "-01"))


def request_fields() -> st.SearchStrategy[list[Any]]:
    head = st.tuples(
        _rids, st.sampled_from(OPERATORS), st.sampled_from(["k1", "k2", "k3", "k4", ""]), st.sampled_from(FUNCTIONS),
        st.one_of(st.lists(values(6), max_size=3), st.just([deep(70)]), st.just(list(range(MAX_ARGS + 1)))),
        st.integers(0, PARTITIONS + 1), st.one_of(st.floats(0, 2e9), st.none()),
    ).map(list)
    # (an idempotency key, and a trace context after it: the record's optional tail)
    idem = st.one_of(st.none(), _rids)
    traced = st.tuples(idem, _traceparents).map(list)
    tail = st.one_of(st.just([]), idem.map(lambda k: [k]), traced, traced)
    return st.tuples(head, tail).map(lambda ht: ht[0] + ht[1])


def valid_records() -> st.SearchStrategy[bytes]:
    return request_fields().map(lambda f: msgpack.packb(f, use_bin_type=True))


def traced_records() -> st.SearchStrategy[bytes]:
    """Requests whose other fields pass, with a trace context well formed or not."""
    return st.tuples(_rids, st.sampled_from(OPERATORS), st.sampled_from(["k1", "k2"]),
                     st.sampled_from(FUNCTIONS), st.lists(values(3), max_size=2),
                     st.integers(0, PARTITIONS - 1), st.floats(0, 2e9), st.one_of(st.none(), _rids),
                     _traceparents).map(lambda f: msgpack.packb(list(f), use_bin_type=True))


def records() -> st.SearchStrategy[bytes | None]:
    return mix(
        (4, valid_records()),
        (1, traced_records()),
        (5, hostile(valid_records(), packed(wrong_fields(request_fields())), packed(deep_values()))),
        (1, st.just(None)),
    )


@pytest.mark.spread(accepted=["request"],
                    min_accepted=0.1,
                    stages=["not msgpack", "element", "request id must be", "must be a str", "more than the limit", "arguments nest more than", "traceparent must be"])
@fuzz(share=0.5)
@given(data=records())
def test_request_decode_gives_a_request_or_bad_request(data: bytes | None, outcomes: Outcomes) -> None:
    try:
        req = wire.Request.decode(data)  # type: ignore[arg-type]
    except BadRequest as exc:
        assert exc.reason and exc.error_type == "BadRequest"
        outcomes.error(exc)
        return
    outcomes.add("request")
    assert isinstance(req.rid, str) and isinstance(req.args, list) and isinstance(req.reply_partition, int)
    assert all(isinstance(x, str) for x in (req.operator, req.key, req.function))
    assert wire.Request.decode(req.encode()).encode() == req.encode()  # (compared encoded: NaN != NaN)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-ingress")


@pytest.mark.spread(accepted=["admitted"],
                    min_accepted=0.04,
                    each=["rejected, answered", "rejected, dropped"])
@fuzz(share=0.5)
@given(batch=st.lists(records(), min_size=1, max_size=8))
async def test_worker_answers_every_request_and_every_answerable_malformed_record(
        batch: list[bytes | None], home: Path, outcomes: Outcomes) -> None:
    w = bare_worker(str(home / "w"))
    w.links.channels = {1: EchoPeer(w)}
    try:
        expected: collections.Counter[str] = collections.Counter()
        rejected_rids: collections.Counter[str] = collections.Counter()
        for offset, value in enumerate(batch):
            w.state.offsets.take(0, offset)
            w.state.applied.take(0, offset)
            req = w_admit(w, offset, value)
            if req is not None:
                expected[req.rid] += 1
                outcomes.add("admitted")
                continue
            address = wire.reply_address(value) if isinstance(value, bytes) else None
            if address is not None and address[1] < PARTITIONS:
                rejected_rids[address[0]] += 1
                outcomes.add("rejected, answered")
            else:
                outcomes.add("rejected, dropped")
        await run_epochs(w)
        replies = [(p, wire.Reply.decode(v)) for p, v, _, _ in w.egress.replies]
        got = collections.Counter(r.rid for _, r in replies)
        assert got == expected + rejected_rids
        assert all(0 <= p < PARTITIONS for p, _ in replies)
        for _, r in replies:
            if r.rid in rejected_rids and r.rid not in expected:
                assert (r.ok, r.error_type) == (False, "BadRequest")
        assert sum(w.ingress.rejected.values()) == len(batch) - sum(expected.values())
        # every offset is applied; the taken ones complete as their replies are acknowledged
        assert w.state.applied.watermarks() == {0: len(batch)}
    finally:
        w.state.engine.close()  # type: ignore[union-attr]


def w_admit(w: Any, offset: int, value: bytes | None) -> wire.Request | None:
    from worker.state import Pending

    req = w.ingress.admit(0, offset, value)
    if req is not None:
        w.state.loop.queue.append(Pending(req, 0, offset))
    return req
