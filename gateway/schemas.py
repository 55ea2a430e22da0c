"""JSON Schemas (2020-12, as OpenAPI 3.1 has them) of what goes in and out of the gateway.

A function's ``args`` array is described parameter by parameter from its signature and
annotations, and :mod:`gateway.checks` holds a request to exactly that schema, so the
document and the gateway cannot disagree:

* ``int`` → an integer msgpack holds (-2**63 to 2**64-1); ``float`` → a number; ``str``,
  ``bool``, ``None`` → string, boolean, null; ``bytes`` → ``{"$base64": "<base64>"}``;
* ``list[X]``, ``tuple[X, ...]``, ``Sequence[X]`` → an array of X; ``tuple[X, Y]`` → that
  pair; ``dict[str, X]`` / ``Mapping`` → an object of X (never the one-key ``$base64``
  object, which is bytes); ``X | None``, ``Optional[X]``, ``Union`` → any of them;
  ``Literal[...]`` → one of its values;
* anything else, or no annotation → ``Value``: any JSON value the gateway takes.

A result is described from the return annotation as :mod:`gateway.values` writes it (a
float may be ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; bytes are ``{"$base64": …}``);
without one, as any JSON. Response schemas spell a tuple as a plain array of bounded
length, never with ``prefixItems`` (schemathesis 4.32 rewrites ``prefixItems`` in response
schemas to draft-7's array-form ``items`` and then refuses that as invalid OpenAPI 3.1).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections import abc
from typing import Any

from gateway.values import B64_PATTERN
from sfaas.app import Function
from sfaas.runtime.codec import MAX_ARGS, MAX_NESTING

__all__ = ["COMPONENTS", "INT_MAX", "INT_MIN", "VALUE", "args_schema", "hints",
           "result_schema", "schema_of", "signature_params"]

#: The integers msgpack holds: what an ``int`` parameter takes.
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
REF = "#/components/schemas/"
#: Any value the gateway takes as an argument (a reference to :data:`COMPONENTS`).
VALUE = {"$ref": REF + "Value"}
_INT = {"type": "integer", "minimum": INT_MIN, "maximum": INT_MAX}
_BYTES = {"type": "object", "required": ["$base64"], "additionalProperties": False,
          "properties": {"$base64": {"type": "string", "pattern": B64_PATTERN}}}
#: An object of exactly one key ``$base64`` is bytes, never a dict.
_NOT_BYTES = {"required": ["$base64"], "maxProperties": 1}

#: ``components.schemas`` of the document: what the ``$ref`` of the schemas point at.
COMPONENTS: dict[str, dict[str, Any]] = {
    "Value": {
        "description": "any JSON value (an integer beyond 64 bits is read as the nearest "
                       "float); bytes as {\"$base64\": \"<standard base64>\"}; lists and "
                       f"objects nest at most {MAX_NESTING} levels deep",
        "anyOf": [{"type": ["null", "boolean", "number", "string", "array"], "items": VALUE},
                  {"$ref": REF + "Bytes"}, {"$ref": REF + "Object"}]},
    "Object": {"type": "object", "additionalProperties": VALUE, "not": _NOT_BYTES},
    "Bytes": {"description": "bytes, as standard base64 text", **_BYTES},
}

_SCALARS: dict[Any, dict[str, Any]] = {
    int: _INT, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"},
    type(None): {"type": "null"}, None: {"type": "null"}, bytes: _BYTES,
}
_NON_FINITE = {"enum": ["NaN", "Infinity", "-Infinity"]}


def schema_of(annotation: Any) -> dict[str, Any]:
    """The JSON schema of an argument annotated ``annotation`` (:data:`VALUE` when it says
    nothing JSON can check)."""
    return _schema(annotation, result=False)


def result_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a result annotated ``annotation``, as the gateway writes it
    (``{}``: any JSON)."""
    return _schema(annotation, result=True)


def _schema(ann: Any, result: bool) -> dict[str, Any]:
    if ann in _SCALARS:
        if result and ann is float:
            return {"anyOf": [{"type": "number"}, _NON_FINITE]}
        return {"type": "integer"} if result and ann is int else dict(_SCALARS[ann])
    origin, params = typing.get_origin(ann), typing.get_args(ann)
    if ann in (list, tuple) or origin in (list, tuple, abc.Sequence):
        if origin is tuple and params and params[-1] is not Ellipsis:
            return _tuple([_schema(p, result) for p in params], result)
        return {"type": "array", "items": _schema(params[0], result) if params
                else _any(result)}
    if ann is dict or origin in (dict, abc.Mapping):
        value = _schema(params[1], result) if len(params) == 2 else _any(result)
        out: dict[str, Any] = {"type": "object", "additionalProperties": value}
        return out if result else {**out, "not": _NOT_BYTES}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(p, result) for p in params]}
    if origin is typing.Literal and all(_jsonable(p) for p in params):
        return {"enum": list(params)}
    return _any(result)


def _any(result: bool) -> dict[str, Any]:
    return {} if result else dict(VALUE)


def _tuple(items: list[dict[str, Any]], result: bool) -> dict[str, Any]:
    n = len(items)
    if not result and items:
        return {"type": "array", "prefixItems": items, "items": False, "minItems": n}
    out: dict[str, Any] = {"type": "array", "minItems": n, "maxItems": n}
    if items:  # (a response schema: no prefixItems, see the module docstring)
        out["items"] = {"anyOf": items} if len(items) > 1 else items[0]
    return out


def hints(fn: Any) -> dict[str, Any]:
    """Resolved annotations of ``fn``; one that cannot be resolved (a name imported only for
    type checking) is left out, the others kept."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # any failure of resolving a string annotation
        out = {}
        for name, ann in getattr(fn, "__annotations__", {}).items():
            try:
                out[name] = typing.get_type_hints(
                    types.SimpleNamespace(__annotations__={name: ann},
                                          __globals__=getattr(fn, "__globals__", {})),
                    globalns=getattr(fn, "__globals__", {}))[name]
            except Exception:  # unresolvable: described as any value
                continue
        return out


def signature_params(func: Function) -> list[inspect.Parameter]:
    """The parameters a request's ``args`` fill (the context parameter left out)."""
    return list(func.signature.parameters.values())[1:]


def args_schema(func: Function, valid: abc.Callable[[Any, dict[str, Any]], bool]) \
        -> dict[str, Any]:
    """The schema of ``func``'s ``args`` array; ``valid(value, schema)`` says whether a
    default value fits its parameter's schema (one that does not is left out)."""
    found = hints(func.fn)
    items: list[dict[str, Any]] = []
    rest: dict[str, Any] | None = None
    lo = 0
    for p in signature_params(func):
        schema = {"title": p.name, **(schema_of(found[p.name]) if p.name in found
                                     else dict(VALUE))}
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is p.empty:
                lo = len(items) + 1
            elif _jsonable(p.default) and valid(p.default, schema):
                schema["default"] = p.default
            items.append(schema)
        elif p.kind is p.VAR_POSITIONAL:
            rest = schema
    out: dict[str, Any] = {"type": "array", "minItems": lo}
    if items:
        out["prefixItems"] = items
    if rest is None:
        out.update(items=False, maxItems=len(items))
    else:
        out.update(items=rest, maxItems=MAX_ARGS)
    return out


def _jsonable(value: Any) -> bool:
    return value is None or type(value) in (int, float, str, bool)
