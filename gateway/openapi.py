"""``/openapi.json``: an OpenAPI 3.1 document generated from the app's registered functions.

One path per function (``POST /v1/{app}/{operator}/{key}/{function}``) whose request body
describes the ``args`` array parameter by parameter, from the signature and annotations
(``int``, ``float``, ``str``, ``bool``, ``list[X]``, ``dict[str, X]``, ``X | None`` /
``Optional[X]``; anything else or unannotated: ``{}``, any value), plus the state read paths
of each operator.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections import abc
from typing import Any

from sfaas.app import App, Function

__all__ = ["openapi"]

_SCALARS: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"},
    bool: {"type": "boolean"}, type(None): {"type": "null"}, None: {"type": "null"},
    bytes: {"type": "object", "properties": {"$base64": {"type": "string"}},
            "required": ["$base64"]},
}
_ERROR = {"type": "object", "properties": {"error": {"type": "string"},
                                           "type": {"type": "string"}}, "required": ["error"]}


def schema_of(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a Python annotation ({} when it says nothing JSON can check)."""
    if annotation in _SCALARS:
        return dict(_SCALARS[annotation])
    origin, params = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (list, tuple) or origin in (list, tuple, abc.Sequence):
        if origin is tuple and params and params[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [schema_of(p) for p in params],
                    "minItems": len(params), "maxItems": len(params)}
        return {"type": "array", **({"items": schema_of(params[0])} if params else {})}
    if annotation is dict or origin in (dict, abc.Mapping):
        out: dict[str, Any] = {"type": "object"}
        if len(params) == 2 and schema_of(params[1]):
            out["additionalProperties"] = schema_of(params[1])
        return out
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [schema_of(p) for p in params]}
    if origin is typing.Literal:
        return {"enum": list(params)}
    return {}


def _hints(fn: Any) -> dict[str, Any]:
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


def args_schema(func: Function) -> dict[str, Any]:
    """The schema of ``func``'s ``args`` array (the context parameter left out)."""
    hints = _hints(func.fn)
    items: list[dict[str, Any]] = []
    rest: dict[str, Any] | None = None
    lo = 0
    for p in list(func.signature.parameters.values())[1:]:
        schema = schema_of(hints[p.name]) if p.name in hints else {}
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is not p.empty:
                schema = {**schema, "default": p.default} if _jsonable(p.default) else schema
            else:
                lo = len(items) + 1
            items.append({"title": p.name, **schema})
        elif p.kind is p.VAR_POSITIONAL:
            rest = {"title": p.name, **schema}
    out: dict[str, Any] = {"type": "array", "prefixItems": items, "minItems": lo}
    if rest is None:
        out.update(items=False, maxItems=len(items))
    else:
        out["items"] = rest
    return out


def _jsonable(value: Any) -> bool:
    return value is None or type(value) in (int, float, str, bool)


def _responses(result: dict[str, Any], what: str) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": _ERROR}}}
    return {
        "200": {"description": what,
                "content": {"application/json": {"schema": result}}},
        "400": {"description": "bad input: names it and what was expected", **err},
        "401": {"description": "missing or wrong bearer token", **err},
        "404": {"description": "unknown app or path", **err},
        "429": {"description": "the gateway's in-flight limit is reached: retry later", **err},
        "504": {"description": "no reply in time: the request may still commit; a retry with "
                               "the same Idempotency-Key is safe", **err},
    }


def _key_param() -> dict[str, Any]:
    return {"name": "key", "in": "path", "required": True,
            "description": "the key (percent-encode '/' and other reserved characters)",
            "schema": {"type": "string", "minLength": 1}}


def openapi(app: App, *, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app`` behind the gateway (``auth``: a token is set)."""
    paths: dict[str, Any] = {}
    for op_name, op in sorted(app.operators.items()):
        for fn_name, func in sorted(op.functions.items()):
            ret = _hints(func.fn).get("return", inspect.Signature.empty)
            result = {} if ret is inspect.Signature.empty else schema_of(ret)
            responses = _responses({"type": "object", "properties": {"result": result},
                                    "required": ["result"]}, "the transaction committed")
            responses["409"] = {"description": "the transaction aborted", "content": {
                "application/json": {"schema": {
                    "type": "object", "required": ["aborted"],
                    "properties": {"aborted": {"type": "string"}, "type": {"type": "string"}}}}}}
            responses["413"] = {"description": "the body is larger than the gateway's limit"}
            paths[f"/v1/{app.name}/{op_name}/{{key}}/{fn_name}"] = {"post": {
                "operationId": f"{op_name}.{fn_name}",
                "summary": (inspect.getdoc(func.fn) or f"{op_name}.{fn_name}").split("\n")[0],
                "description": inspect.getdoc(func.fn) or "",
                "tags": [op_name],
                "parameters": [_key_param(), {
                    "name": "Idempotency-Key", "in": "header", "required": False,
                    "description": "a retry with the same key gets the first outcome without "
                                   "running again",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 256}}],
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"args": args_schema(func)}}}}},
                "responses": responses,
            }}
        paths[f"/v1/{app.name}/{op_name}/{{key}}"] = {"get": {
            "operationId": f"{op_name}.get", "tags": [op_name],
            "summary": f"the committed value of one {op_name} key (null: none)",
            "parameters": [_key_param()],
            "responses": _responses({"type": "object", "properties": {"value": {}},
                                     "required": ["value"]}, "the value"),
        }}
        paths[f"/v1/{app.name}/{op_name}"] = {"get": {
            "operationId": f"{op_name}.scan", "tags": [op_name],
            "summary": f"{op_name} keys starting with prefix, in key order",
            "parameters": [
                {"name": "prefix", "in": "query", "schema": {"type": "string", "default": ""}},
                {"name": "limit", "in": "query",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 10_000,
                            "default": 1000}}],
            "responses": _responses({"type": "object", "required": ["items"], "properties": {
                "items": {"type": "array", "items": {"type": "array", "prefixItems": [
                    {"type": "string"}, {}], "minItems": 2, "maxItems": 2}}}}, "the entries"),
        }}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": f"sfaas app {app.name}", "version": "1"},
        "paths": paths,
    }
    if auth:
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        doc["security"] = [{"bearer": []}]
    return doc
