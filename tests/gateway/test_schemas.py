"""The schemas the document publishes and the gateway's check of requests against them
agree with JSON Schema 2020-12 itself (``jsonschema_rs``, schemathesis' validator): the
gateway takes exactly what its document says, no cluster needed."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional

import jsonschema_rs
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks import fits, problem
from gateway.openapi import openapi
from gateway.schemas import COMPONENTS, INT_MAX, INT_MIN, args_schema, result_schema, schema_of
from sfaas import App, Context
from tests.gateway.shop import app as shop

_INTS = st.one_of(st.integers(-1000, 1000), st.sampled_from(
    [INT_MIN, INT_MIN - 1, INT_MAX, INT_MAX + 1, 1 << 70]))
_TEXT = st.text(max_size=6)
_B64 = st.sampled_from(["", "AA==", "AAA=", "AAAA", "A", "AAAA=", "!!!!", "AP8="])
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), _INTS, st.floats(allow_nan=False, allow_infinity=False),
              _TEXT, st.builds(lambda t: {"$base64": t}, st.one_of(_B64, _INTS, st.none()))),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(_TEXT, st.just("$base64")), inner,
                                            max_size=3)),
    max_leaves=12)

typed = App("typed")
things = typed.operator("things")


@things.function
async def every(ctx: Context, a: int, b: float, c: bytes, d: tuple[int, str],
                e: dict[str, bool], f: Literal["x", 2], g: Optional[list[int]] = None,  # noqa: UP045
                *h: Any) -> tuple[int, str]:
    return 1, ""


def _validator(schema: dict[str, Any]) -> Any:
    return jsonschema_rs.validator_for({**schema, "components": {"schemas": COMPONENTS}})


def _schemas() -> list[dict[str, Any]]:
    return [args_schema(fn, fits) for app in (shop, typed) for op in app.operators.values()
            for fn in op.functions.values()]


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON, max_size=9))
def test_the_gateway_takes_exactly_the_args_the_schema_takes(args: list[Any]) -> None:
    for schema in _schemas():
        assert fits(args, schema) == _validator(schema).is_valid(args), (args, schema)


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, min_size=7, max_size=9))
def test_each_parameter_of_a_typed_signature_is_held_to_its_type(args: list[Any]) -> None:
    schema = args_schema(typed.operators["things"].functions["every"], fits)
    for i, item in enumerate(schema["prefixItems"]):
        v = _validator(item)
        assert fits(args[i], item) == v.is_valid(args[i]), (args[i], item)


def test_a_refusal_names_the_argument_and_what_was_expected() -> None:
    schema = args_schema(typed.operators["things"].functions["every"], fits)
    good = [1, 1.5, {"$base64": "AP8="}, [1, "x"], {"k": True}, "x"]
    assert problem(good, schema) is None and fits([*good, [2], {"any": [None]}], schema)
    assert problem([2.5, *good[1:]], schema) == (
        "[0]", f"an integer from {INT_MIN} to {INT_MAX}", 2.5)
    assert problem([*good[:2], {"$base64": "A"}, *good[3:]], schema)[:2] == (
        "[2]", 'bytes as {"$base64": "<standard base64>"}')
    assert problem([*good[:3], [1, 2], *good[4:]], schema)[:2] == ("[3][1]", "a string")
    assert problem([*good[:5], "y"], schema)[:2] == ("[5]", 'one of "x", 2')
    assert problem([*good, None, [1, {"k": [{"$base64": 7}]}]], schema)[:2] == (
        '[7][1]["k"][0]', 'bytes as {"$base64": "<standard base64>"}')


def test_schemas_of_annotations() -> None:
    assert schema_of(int) == {"type": "integer", "minimum": INT_MIN, "maximum": INT_MAX}
    assert schema_of(object) == {"$ref": "#/components/schemas/Value"}
    # results: a float may come back as "NaN"/"Infinity"; a tuple without prefixItems
    assert result_schema(float) == {"anyOf": [{"type": "number"},
                                              {"enum": ["NaN", "Infinity", "-Infinity"]}]}
    assert result_schema(tuple[int, str]) == {
        "type": "array", "minItems": 2, "maxItems": 2,
        "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}


def test_the_document_is_valid_json_schema_and_lists_every_status() -> None:
    doc = openapi(typed, auth=False)
    text = json.dumps(doc)
    assert '"prefixItems": []' not in text and "securitySchemes" not in text
    call = doc["paths"]["/v1/typed/things/{key}/every"]["post"]
    assert set(call["responses"]) == {"200", "400", "409", "413", "429", "503", "504"}
    result = call["responses"]["200"]["content"]["application/json"]["schema"]
    assert "prefixItems" not in json.dumps(result)
    example = call["requestBody"]["content"]["application/json"]["example"]["args"]
    assert fits(example, call["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["args"])
    for path in doc["paths"].values():
        for op in path.values():
            for answer in op["responses"].values():
                for media in answer.get("content", {}).values():
                    _validator(media["schema"])  # compiles: valid 2020-12
