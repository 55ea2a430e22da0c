"""Holding a request's JSON to the schemas the document publishes (:mod:`gateway.schemas`).

:func:`compile_schema` turns a schema into a check, once (the gateway compiles each
function's when it starts); it knows exactly the JSON Schema keywords those schemas use (an
unknown one is a bug, asserted) with JSON Schema's meaning: an integer is a number without
a fraction (``2.0`` is one), ``true`` is no number. A check works on the body as parsed,
before ``{"$base64": …}`` becomes bytes, as the document describes the JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from gateway.schemas import COMPONENTS, REF

__all__ = ["Check", "Problem", "compile_schema", "expected", "fits", "problem"]

#: Where in the value (``[1]``, ``["k"]``; "" for the value itself), what was expected,
#: what was there.
Problem = tuple[str, str, Any]
#: A compiled schema: the first problem of a value, or None when it is valid.
Check = Callable[[Any], Problem | None]

_ANNOTATIONS = {"title", "description", "default", "examples"}
_TYPES = {"null": type(None), "boolean": bool, "string": str, "array": list, "object": dict}
_BOUNDS = {"minimum", "maximum", "pattern", "minLength", "maxLength", "minItems", "maxItems",
           "required", "maxProperties"}
_KNOWN = _ANNOTATIONS | _BOUNDS | {"$ref", "type", "enum", "anyOf", "not", "prefixItems",
                                   "items", "properties", "additionalProperties"}


def fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` (JSON as parsed) is valid against ``schema``."""
    return problem(value, schema) is None


def problem(value: Any, schema: dict[str, Any] | bool) -> Problem | None:
    """The first place where ``value`` breaks ``schema``, or None when it is valid."""
    return compile_schema(schema)(value)


def _ok(value: Any) -> None:
    return None


def compile_schema(schema: dict[str, Any] | bool) -> Check:
    """The check of ``schema``."""
    if schema is True or schema is not False and not schema.keys() - _ANNOTATIONS:
        return _ok
    if schema is False:
        return lambda value: ("", "nothing (no more items)", value)
    assert not schema.keys() - _KNOWN, f"a schema keyword checks.py does not know: {schema}"
    want = expected(schema)
    tests = _tests(schema)
    inner = _ref(schema)
    children = _children(schema)
    whole = "$base64" in schema.get("properties", {})  # bytes: named as a whole

    def check(value: Any) -> Problem | None:
        if inner is not None:
            found = inner(value)
            if found is not None:
                return found
        for test in tests:
            if not test(value):
                return "", want, value
        if children is not None:
            found = children(value)
            if found is not None:
                return ("", want, value) if whole else found
        return None

    return check


def _ref(schema: dict[str, Any]) -> Check | None:
    if "$ref" not in schema:
        return None
    name = schema["$ref"].removeprefix(REF)
    return _value if name == "Value" else compile_schema(COMPONENTS[name])


def _tests(schema: dict[str, Any]) -> list[Callable[[Any], bool]]:
    """The tests of ``schema`` on the value itself (its items and properties aside)."""
    out: list[Callable[[Any], bool]] = []
    if "type" in schema:
        kinds = schema["type"]
        out.append(lambda v: _type_ok(v, kinds))
    if "enum" in schema:
        values = schema["enum"]
        out.append(lambda v: any(_same(v, e) for e in values))
    if "anyOf" in schema:
        branches = [compile_schema(s) for s in schema["anyOf"]]
        out.append(lambda v: any(b(v) is None for b in branches))
    if "not" in schema:
        negated = compile_schema(schema["not"])
        out.append(lambda v: negated(v) is not None)
    if schema.keys() & _BOUNDS:
        out.append(lambda v: _bounds_ok(v, schema))
    return out


def _children(schema: dict[str, Any]) -> Check | None:
    """The check of an array's items or an object's properties, if ``schema`` has one."""
    if "prefixItems" in schema or "items" in schema:
        prefix = [compile_schema(s) for s in schema.get("prefixItems", [])]
        rest = compile_schema(schema.get("items", True))
        return lambda v: _items(v, prefix, rest) if type(v) is list else None
    if "properties" in schema or "additionalProperties" in schema:
        props = {k: compile_schema(s) for k, s in schema.get("properties", {}).items()}
        extra = compile_schema(schema.get("additionalProperties", True))
        return lambda v: _properties(v, props, extra) if type(v) is dict else None
    return None


def _items(value: list[Any], prefix: list[Check], rest: Check) -> Problem | None:
    n = len(prefix)
    for i, v in enumerate(value):
        check = prefix[i] if i < n else rest
        if check is not _ok:
            found = check(v)
            if found is not None:
                return f"[{i}]{found[0]}", found[1], found[2]
    return None


def _properties(value: dict[str, Any], props: dict[str, Check],
                extra: Check) -> Problem | None:
    for k, v in value.items():
        found = props.get(k, extra)(v)
        if found is not None:
            return f"[{json.dumps(k)}]{found[0]}", found[1], found[2]
    return None


def _value(value: Any) -> Problem | None:
    """The check of ``Value`` (``COMPONENTS["Value"]``), faster and naming the innermost
    wrong part: any JSON is a Value but for an object of the one key ``$base64`` whose value
    is not standard base64 text."""
    if type(value) is list:
        for i, v in enumerate(value):
            if type(v) in (list, dict):
                found = _value(v)
                if found is not None:
                    return f"[{i}]{found[0]}", found[1], found[2]
    elif type(value) is dict:
        if len(value) == 1 and "$base64" in value:
            return _bytes(value)
        for k, v in value.items():
            if type(v) in (list, dict):
                found = _value(v)
                if found is not None:
                    return f"[{json.dumps(k)}]{found[0]}", found[1], found[2]
    return None


def _type_ok(value: Any, want: str | list[str] | None) -> bool:
    if want is None:
        return True
    for t in [want] if isinstance(want, str) else want:
        if t in ("integer", "number"):
            if type(value) is int or (type(value) is float
                                      and (t == "number" or value.is_integer())):
                return True
        elif type(value) is _TYPES[t]:
            return True
    return False


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        type(a) in (int, float) and type(b) in (int, float) and a == b)


def _bounds_ok(value: Any, schema: dict[str, Any]) -> bool:
    if type(value) in (int, float):
        return bool(schema.get("minimum", value) <= value <= schema.get("maximum", value))
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            return False
        return "pattern" not in schema or _regex(schema["pattern"]).search(value) is not None
    if isinstance(value, list):
        return bool(schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)))
    if isinstance(value, dict):
        return len(value) <= schema.get("maxProperties", len(value)) \
            and all(k in value for k in schema.get("required", ()))
    return True


@lru_cache(maxsize=64)
def _regex(pattern: str) -> re.Pattern[str]:
    # (ECMA-262's $ is the end of the text; Python's also matches before a final newline)
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern)


def expected(schema: dict[str, Any] | bool) -> str:
    """What ``schema`` takes, in words (for error messages)."""
    if schema is False:
        return "nothing"
    if schema is True or not schema.keys() - _ANNOTATIONS:
        return "any value"
    if "$ref" in schema:
        name: str = schema["$ref"].removeprefix(REF)
        return {"Value": "a JSON value", "Bytes": 'bytes as {"$base64": "<standard base64>"}',
                "Object": "an object"}.get(name, name)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(expected(s) for s in schema["anyOf"])
    if "$base64" in schema.get("properties", {}):
        return expected({"$ref": REF + "Bytes"})
    kind = schema.get("type")
    if kind == "integer" and "minimum" in schema:
        return f"an integer from {schema['minimum']} to {schema['maximum']}"
    if kind == "array":
        items = schema.get("items", True)
        return "an array" + (f" (each item: {expected(items)})"
                             if isinstance(items, dict) and items else "")
    if kind == "object":
        values = schema.get("additionalProperties", True)
        return "an object" + (f" (each value: {expected(values)})"
                              if isinstance(values, dict) and values else "") \
            + (' other than {"$base64": …} (bytes)' if "not" in schema else "")
    if kind == "string" and "pattern" in schema:
        return f"a string matching {schema['pattern']}"
    if kind == "string" and "maxLength" in schema:
        return f"a string of {schema.get('minLength', 0)} to {schema['maxLength']} characters"
    names = {"integer": "an integer", "number": "a number", "string": "a string",
             "boolean": "true or false", "null": "null"}
    if isinstance(kind, str):
        return names[kind]
    return " or ".join(names.get(k, k) for k in kind or ["any value"])


_bytes = compile_schema(COMPONENTS["Bytes"])
