"""``/openapi.json``: the OpenAPI 3.1 document of one app behind the gateway, generated from
its registered functions — the gateway's exact contract.

One path per function (``POST /v1/{app}/{operator}/{key}/{function}``) whose request body
describes the ``args`` array parameter by parameter from the signature
(:mod:`gateway.schemas`; :mod:`gateway.checks` holds requests to it), the two state read
paths of each operator, and ``/healthz``, ``/metrics``, ``/openapi.json``. Every status an
operation can answer is listed with its body and headers; the bearer token, when the
gateway has one, is a security scheme. Links join the operations on one key (a call, then a
read of that key or another call on it), for a client generator and schemathesis' stateful
phase alike.
"""

from __future__ import annotations

import inspect
from typing import Any

from gateway.checks import fits
from gateway.schemas import COMPONENTS, args_schema, hints, result_schema
from gateway.settings import MAX_BODY
from sfaas.app import App, Function, Operator
from sfaas.runtime.txn.reads import MAX_SCAN
from sfaas.runtime.wire import MAX_RID

__all__ = ["openapi"]

_ERROR = {"type": "object", "required": ["error", "type"], "additionalProperties": False,
          "properties": {"error": {"type": "string", "description": "what is wrong, naming "
                                   "the input and what was expected"},
                         "type": {"type": "string", "description": "its kind, e.g. "
                                  "BadArguments, BadKey, UnknownFunction, BadRequest"}}}
_ABORTED = {"type": "object", "required": ["aborted", "type"], "additionalProperties": False,
            "properties": {"aborted": {"type": "string", "description": "why"},
                           "type": {"type": "string", "description": "what raised it"}}}
_KEY = {"type": "string", "minLength": 1, "pattern": "^[^\\u0000]"}
_IDEMPOTENCY_KEY = {"type": "string", "minLength": 1, "maxLength": MAX_RID,
                    "pattern": "^[!-~]([ -~]*[!-~])?$"}


def _json(schema: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema}}, **extra}


def _errors(auth: bool, *, read: bool) -> dict[str, Any]:
    """The answers every ``/v1`` operation can give besides its 200."""
    out = {
        "400": _json(_ERROR, "bad input: the message names it and what was expected"),
        "409": _json(_ABORTED, "the worker could not read the value (an upcast failed)"
                     if read else "the transaction aborted (rolled back)"),
        "429": _json(_ERROR, "the gateway is working on its in-flight limit of requests; "
                     "retry later", headers={"Retry-After": {
                         "required": True, "description": "seconds to wait",
                         "schema": {"type": "string", "pattern": "^[0-9]+$"}}}),
        "503": {"description": "the cluster did not take the request (not sent: safe to "
                               "retry), or the gateway has no room for another connection",
                "content": {"application/json": {"schema": _ERROR},
                            "text/plain": {"schema": {"type": "string"}}}},
        "504": _json(_ERROR, "no reply in time: the request may still commit; a retry with "
                     "the same Idempotency-Key is safe"),
    }
    if auth:
        out["401"] = _json(_ERROR, "missing or wrong bearer token", headers={
            "WWW-Authenticate": {"required": True, "schema": {"type": "string"}}})
    return out


def _key_param() -> dict[str, Any]:
    return {"name": "key", "in": "path", "required": True,
            "description": "the key: any text not starting with NUL, percent-encoded (a '/' "
                           "inside a key is %2F)",
            "schema": _KEY, "example": "k1"}


def _links(app: App, op: Operator) -> dict[str, Any]:
    """From an answer about one key to the other operations on that key."""
    key = {"key": "$request.path.key"}
    out = {"get": {"operationId": f"{op.name}.get", "parameters": key,
                   "description": f"the {op.name} value of this key"}}
    for fn in sorted(op.functions):
        out[fn] = {"operationId": f"{op.name}.{fn}", "parameters": key,
                   "description": f"{op.name}.{fn} on this key"}
    return out


def _call(app: App, op: Operator, func: Function, auth: bool) -> dict[str, Any]:
    """The ``POST`` of one function."""
    args = args_schema(func, fits)
    ret = hints(func.fn).get("return", inspect.Signature.empty)
    result = {} if ret is inspect.Signature.empty else result_schema(ret)
    needs_args = args["minItems"] > 0
    body: dict[str, Any] = {"type": "object", "additionalProperties": False,
                            "properties": {"args": args}}
    if needs_args:
        body["required"] = ["args"]
    doc = inspect.getdoc(func.fn) or ""
    return {
        "operationId": f"{op.name}.{func.name}",
        "summary": (doc or f"{op.name}.{func.name}").split("\n")[0],
        "description": doc,
        "tags": [op.name],
        "parameters": [_key_param(), {
            "name": "Idempotency-Key", "in": "header", "required": False,
            "description": "a retry with the same key gets the first outcome without "
                           "running again (printable ASCII, no blank at either end)",
            "schema": _IDEMPOTENCY_KEY}],
        "requestBody": {
            "required": needs_args,
            "description": "the arguments" + ("" if needs_args else
                                              " (no body, or no args: none)"),
            "content": {"application/json": {"schema": body,
                                              "example": {"args": _example(args)}}}},
        "responses": {
            "200": _json({"type": "object", "required": ["result"],
                          "additionalProperties": False, "properties": {"result": result}},
                         "the transaction committed", links=_links(app, op)),
            **_errors(auth, read=False),
            "413": _json(_ERROR, f"the body is over {MAX_BODY} bytes, or the arguments "
                         "encode to more than a request record holds"),
        },
    }


def _reads(app: App, op: Operator, auth: bool) -> dict[str, Any]:
    """The two read paths of ``op``: one key, and a scan."""
    get = {"get": {
        "operationId": f"{op.name}.get", "tags": [op.name],
        "summary": f"the committed value of one {op.name} key (null: none)",
        "parameters": [_key_param()],
        "responses": {"200": _json({"type": "object", "required": ["value"],
                                    "additionalProperties": False, "properties": {"value": {}}},
                                   "the value", links=_links(app, op)),
                      **_errors(auth, read=True)},
    }}
    pair = {"type": "array", "minItems": 2, "maxItems": 2,
            "description": "[key, value]: the key is a string, the value any JSON"}
    scan = {"get": {
        "operationId": f"{op.name}.scan", "tags": [op.name],
        "summary": f"{op.name} keys starting with prefix, in key order",
        "parameters": [
            {"name": "prefix", "in": "query", "schema": {"type": "string", "default": ""}},
            {"name": "limit", "in": "query",
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_SCAN,
                        "default": 1000}}],
        "responses": {"200": _json({"type": "object", "required": ["items"],
                                    "additionalProperties": False,
                                    "properties": {"items": {"type": "array", "items": pair}}},
                                   "the entries"),
                      **_errors(auth, read=True)},
    }}
    return {f"/v1/{app.name}/{op.name}/{{key}}": get, f"/v1/{app.name}/{op.name}": scan}


def _fixed(app: App, auth: bool) -> dict[str, Any]:
    """``/healthz`` and ``/metrics`` (no token), ``/openapi.json``."""
    health = {"type": "object", "required": ["ok", "app", "in_flight"],
              "additionalProperties": False,
              "properties": {"ok": {"const": True}, "app": {"const": app.name},
                             "in_flight": {"type": "integer", "minimum": 0}}}
    doc = {"200": _json({"type": "object"}, "this document")}
    if auth:
        doc["401"] = _errors(auth, read=True)["401"]
    return {
        "/healthz": {"get": {"operationId": "healthz", "security": [],
                             "summary": "the gateway is up",
                             "responses": {"200": _json(health, "up")}}},
        "/metrics": {"get": {"operationId": "metrics", "security": [],
                             "summary": "Prometheus metrics",
                             "responses": {"200": {"description": "the text format",
                                                   "content": {"text/plain": {"schema": {
                                                       "type": "string"}}}}}}},
        "/openapi.json": {"get": {"operationId": "openapi", "summary": "this document",
                                  "responses": doc}},
    }


def _example(args: dict[str, Any]) -> list[Any]:
    """Arguments that fit ``args``: a simple value of each required parameter's type."""
    out = [_sample(p) for p in args.get("prefixItems", [])[:args["minItems"]]]
    assert fits(out, args), (out, args)
    return out


def _sample(schema: dict[str, Any]) -> Any:
    if "anyOf" in schema:
        return _sample(schema["anyOf"][0])
    if "enum" in schema:
        return schema["enum"][0]
    if "prefixItems" in schema:
        return [_sample(s) for s in schema["prefixItems"]]
    if "$base64" in schema.get("properties", {}):
        return {"$base64": ""}
    kind = schema.get("type")
    samples = {"integer": 1, "number": 1.5, "string": "a", "boolean": True, "array": [],
               "object": {}}
    return samples.get(kind) if isinstance(kind, str) else None


def openapi(app: App, *, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app`` behind the gateway (``auth``: a token is set)."""
    paths: dict[str, Any] = {}
    for op_name, op in sorted(app.operators.items()):
        for fn_name, func in sorted(op.functions.items()):
            paths[f"/v1/{app.name}/{op_name}/{{key}}/{fn_name}"] = {
                "post": _call(app, op, func, auth)}
        paths.update(_reads(app, op, auth))
    paths.update(_fixed(app, auth))
    components: dict[str, Any] = {"schemas": COMPONENTS}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": f"sfaas app {app.name}", "version": "1",
                 "description": f"The HTTP gateway of app {app.name!r}: each function is a "
                                "transaction; reads see committed state."},
        "paths": paths,
        "components": components,
    }
    if auth:
        components["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "the gateway's token (SFAAS_GATEWAY_TOKEN)"}}
        doc["security"] = [{"bearer": []}]
    return doc
