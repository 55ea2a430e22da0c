"""The fuzz suites' spread check (``tests.fuzz.outcomes``): a generator whose inputs all die
at the first check — or never get through — fails its test instead of passing."""

from __future__ import annotations

import msgpack
import pytest

from sfaas.errors import BadRequest
from sfaas.runtime import wire

from .outcomes import MIN_INPUTS_FOR_SPREAD, Outcomes, reason, spread

REQUEST = spread(accepted=["request"], min_accepted=0.1,
                 stages=["not msgpack", "element", "must be a str"])


def _decode_all(inputs: list[bytes]) -> Outcomes:
    o = Outcomes("fake")
    for data in inputs:
        try:
            wire.Request.decode(data)
        except BadRequest as exc:
            o.error(exc)
            continue
        o.add("request")
    return o


def _valid(rid: str) -> bytes:
    return msgpack.packb([rid, "kv", "k1", "put", [1], 0, 1.0], use_bin_type=True)


def test_inputs_that_all_die_at_the_first_byte_fail_the_spread() -> None:
    o = _decode_all([b"\xc1" * (i + 1) for i in range(200)])
    assert o.counts == {"BadRequest": 200}
    with pytest.raises(AssertionError, match=r"only 0 of 200 inputs reached \('request',\)"):
        o.check(REQUEST)


def test_inputs_never_rejected_past_the_first_stage_fail_the_spread() -> None:
    o = _decode_all([_valid(f"r{i}") for i in range(50)] + [b"\xc1"] * 150)
    with pytest.raises(AssertionError, match=r"no input was rejected at \['element', 'must be a str'\]"):
        o.check(REQUEST)


def test_a_spread_reaching_every_stage_passes() -> None:
    bad_shape = msgpack.packb([1, 2], use_bin_type=True)
    bad_field = msgpack.packb(["r", 5, "k1", "put", [1], 0, 1.0], use_bin_type=True)
    o = _decode_all([_valid(f"r{i}") for i in range(30)] + [b"\xc1", bad_shape, bad_field] * 30)
    o.check(REQUEST)
    assert reason(BadRequest("request r7: 12 arguments")) == "BadRequest: request rN: N arguments"


def test_a_missing_outcome_fails_and_a_tiny_run_is_not_judged() -> None:
    o = Outcomes("fake")
    for _ in range(MIN_INPUTS_FOR_SPREAD):
        o.add("streamed")
    with pytest.raises(AssertionError, match=r"no input reached \['reset'\]"):
        o.check(spread(accepted=["streamed"], each=["reset"]))
    small = Outcomes("fake")
    small.add("reset")
    small.check(spread(accepted=["streamed"], each=["streamed"]))  # (SFAAS_FUZZ_EXAMPLES=1)
