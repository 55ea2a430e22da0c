"""The gateway's HTTP application (Starlette): routes, auth, limits, error mapping.

    POST /v1/{app}/{operator}/{key}/{function}  {"args": [...]}  → 200 {"result": …}
    GET  /v1/{app}/{operator}/{key}                              → 200 {"value": …}
    GET  /v1/{app}/{operator}?prefix=&limit=                     → 200 {"items": [[k, v], …]}
    GET  /openapi.json, /healthz, /metrics

Path segments are percent-decoded one by one (``%2F`` is a ``/`` inside a key). The
``/openapi.json`` document is the contract: a call's arguments are held to the schema it
publishes for them (:mod:`gateway.checks`). Every answer that is not a 2xx is JSON naming
the problem: 400 ``{"error", "type"}`` for bad input (the SDK's own message when the SDK
refused it; ``BadArguments`` naming the argument and the type its annotation asks for when
it does not fit the function's schema), 401 without the bearer token, 404,
405, 409 ``{"aborted", "type"}`` for a transaction that rolled back, 413 over
:data:`~gateway.settings.MAX_BODY`, 429 at the in-flight limit, 503 when Kafka did not take
the request, 504 when no reply came in time.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from gateway.checks import Check, compile_schema, fits
from gateway.metrics import CALL, GET, SCAN, GatewayMetrics
from gateway.openapi import openapi
from gateway.schemas import args_schema
from gateway.settings import MAX_BODY, GatewaySettings
from gateway.values import arguments, dumps, parse_body
from sfaas.app import App
from sfaas.client import Client, check_idempotency_key
from sfaas.errors import (
    BadArguments,
    BadKey,
    BadRequest,
    ClusterError,
    RequestTimeout,
    TransactionAborted,
)
from sfaas.runtime import tracing
from sfaas.runtime.codec import pack
from sfaas.runtime.kafka import PRODUCE_BATCH_BYTES
from sfaas.runtime.txn.reads import check_scan

log = logging.getLogger("gateway")

__all__ = ["Gateway"]

#: Most bytes a request's encoded arguments and key may take: what one Kafka record holds
#: (a producer batch), less room for the request's other fields (ids, names, times).
MAX_RECORD = PRODUCE_BATCH_BYTES - 4096
_PATHS = ("POST /v1/{app}/{operator}/{key}/{function}, GET /v1/{app}/{operator}/{key}, "
          "GET /v1/{app}/{operator}?prefix=&limit=")


class HttpError(Exception):
    """An answer other than 200, raised where the problem is found."""

    def __init__(self, status: int, doc: dict[str, Any],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, doc)
        self.status, self.doc, self.headers = status, doc, headers


def _error(status: int, message: str, kind: str, **headers: str) -> HttpError:
    return HttpError(status, {"error": message, "type": kind}, headers or None)


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(doc), status, headers, media_type="application/json")


class Gateway:
    """One app's HTTP gateway: ``asgi`` is the application uvicorn serves; ``client`` the
    :class:`~sfaas.client.Client` every request goes through (started by the caller)."""

    def __init__(self, app: App, client: Client, settings: GatewaySettings) -> None:
        self.app, self.client, self.settings = app, client, settings
        self.metrics = GatewayMetrics()
        self._token = settings.token.encode("ascii")
        self._openapi = dumps(openapi(app, auth=bool(settings.token)))
        #: (operator, function) → the schema of its args, as the document has it, compiled
        self._args: dict[tuple[str, str], tuple[dict[str, Any], Check]] = {}
        for op in app.operators.values():
            for fn in op.functions.values():
                schema = args_schema(fn, fits)
                self._args[op.name, fn.name] = schema, compile_schema(schema)
        starlette = Starlette(routes=[
            Route("/healthz", self._healthz),
            Route("/metrics", self._metrics),
            Route("/openapi.json", self._openapi_json),
        ], exception_handlers={404: self._not_found, 405: self._not_allowed})
        starlette.router.redirect_slashes = False
        self._starlette = starlette

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry: the Starlette app, timed and counted by route and status."""
        if scope["type"] != "http":
            await self._starlette(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if scope["path"].startswith("/v1/"):  # the hot path: straight to its handler
                await self._v1(scope, receive, counted_send)
            else:
                await self._starlette(scope, receive, counted_send)
        finally:
            self.metrics.observe(scope.get("sfaas.route", "other"), status,
                                 time.perf_counter() - t0)

    # -- fixed routes ---------------------------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        request.scope["sfaas.route"] = "/healthz"
        return _json(200, {"ok": True, "app": self.app.name,
                           "in_flight": self.metrics.in_flight})

    async def _metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        request.scope["sfaas.route"] = "/metrics"
        return Response(generate_latest(self.metrics.registry), 200,
                        media_type=CONTENT_TYPE_LATEST)

    async def _openapi_json(self, request: Request) -> Response:
        request.scope["sfaas.route"] = "/openapi.json"
        try:
            self._authorize(request.scope)
        except HttpError as exc:
            return _json(exc.status, exc.doc, exc.headers)
        return Response(self._openapi, 200, media_type="application/json")

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return _json(404, {"error": f"no such path {request.url.path!r:.200}; this gateway "
                                    f"serves {_PATHS} for app {self.app.name!r}, "
                                    "/openapi.json, /healthz and /metrics",
                           "type": "NotFound"})

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return _json(405, {"error": f"method {request.method!r:.40} is not allowed on "
                                    f"{request.url.path!r:.200}; use GET",
                           "type": "MethodNotAllowed"}, {"Allow": "GET"})

    # -- /v1 ------------------------------------------------------------------------------

    async def _v1(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.ON:  # (a server span, in the caller's trace when it sent a traceparent)
            with tracing.span(f"{scope['method']} /v1", "server",
                              tracing.carrier_of(scope["headers"]),
                              {"http.request.method": scope["method"],
                               "url.path": scope["path"][:256]}) as span:
                response = await self._respond(Request(scope, receive))
                route = scope.get("sfaas.route")
                if route is not None:  # (named as HTTP spans are: method and route)
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.route", route)
                if response is not None:
                    span.set_attribute("http.response.status_code", response.status_code)
        else:
            response = await self._respond(Request(scope, receive))
        if response is not None:
            await response(scope, receive, send)

    async def _respond(self, request: Request) -> Response | None:
        """The answer to a /v1 request (None: the caller left while sending its body)."""
        try:
            response = await self._route(request)
        except HttpError as exc:
            response = _json(exc.status, exc.doc, exc.headers)
        except ClientDisconnect:
            return None  # it left while sending its body: nobody to answer
        except Exception:
            log.exception("internal error answering %s %.200s", request.method,
                          request.url.path)
            response = _json(500, {"error": "internal error of the gateway (see its log)",
                                   "type": "InternalError"})
        return response

    def _authorize(self, scope: Scope) -> None:
        if not self._token:
            return
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        scheme, _, credentials = given[0].partition(b" ") if len(given) == 1 else (b"", b"", b"")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(),
                                                                  self._token):
            raise _error(401, "this gateway needs 'Authorization: Bearer <token>' with its "
                              "token (SFAAS_GATEWAY_TOKEN)", "Unauthorized",
                         **{"WWW-Authenticate": 'Bearer realm="sfaas"'})

    def _segments(self, scope: Scope) -> list[str]:
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        parts = raw.split(b"?", 1)[0].split(b"/")[2:]  # after b"" and b"v1"
        if not 2 <= len(parts) <= 4:
            raise _error(404, f"no such path {raw.decode('latin-1')!r:.200}; this gateway "
                              f"serves {_PATHS}", "NotFound")
        out = []
        for i, part in enumerate(parts):
            try:
                out.append(unquote_to_bytes(part).decode("utf-8"))
            except UnicodeDecodeError:
                what = ("app", "operator", "key", "function")[i]
                raise _error(400, f"the {what} in the path is not percent-encoded UTF-8: "
                                  f"{part.decode('latin-1')!r:.120}", "BadRequest") from None
        if out[0] != self.app.name:
            raise _error(404, f"no app {out[0]!r:.130} here; this gateway serves app "
                              f"{self.app.name!r}", "NotFound")
        return out

    async def _route(self, request: Request) -> Response:
        scope = request.scope
        self._authorize(scope)
        parts = self._segments(scope)
        route = (SCAN, GET, CALL)[len(parts) - 2]
        scope["sfaas.route"] = route
        want = "POST" if route is CALL else "GET"
        if request.method != want:
            raise _error(405, f"{request.method!r:.40} is not allowed on {route}: use {want}",
                         "MethodNotAllowed", Allow=want)
        m = self.metrics
        if m.in_flight >= self.settings.max_in_flight:
            raise _error(429, f"the gateway is working on {m.in_flight} requests, its limit "
                              "(SFAAS_GATEWAY_MAX_IN_FLIGHT); retry later", "TooManyRequests",
                         **{"Retry-After": "1"})
        m.in_flight += 1
        try:
            if route is CALL:
                return await self._call(request, *parts[1:])
            if route is GET:
                return await self._get(*parts[1:])
            return await self._scan(request, parts[1])
        finally:
            m.in_flight -= 1

    async def _call(self, request: Request, operator: str, key: str,
                    function: str) -> Response:
        headers = request.headers
        keys = headers.getlist("idempotency-key")
        if len(keys) > 1:
            raise _error(400, "give one Idempotency-Key header, got "
                              f"{len(keys)}", "BadRequest")
        ikey = keys[0] if keys else None
        if ikey is not None and not (ikey.isascii() and ikey.isprintable()):
            raise _error(400, f"an Idempotency-Key must be printable ASCII, got {ikey!r:.80}",
                         "BadRequest")
        ctype = headers.getlist("content-type")
        if ctype and not _is_json(ctype):
            raise _error(400, f"the request body must be application/json (UTF-8), got "
                              f"Content-Type {', '.join(ctype)!r:.120}", "BadRequest")
        body = await _read_body(request)
        if body and not ctype:
            raise _error(400, "a request body needs 'Content-Type: application/json'",
                         "BadRequest")
        try:
            raw = parse_body(body)
            check_idempotency_key(ikey)
            self.app.resolve(operator, function).check_args(operator, raw)
            self._check_types(operator, function, raw)
            args = arguments(raw)
            self.app.validate(operator, key, function, args)
            size = len(pack(args)) + len(key.encode())
        except TransactionAborted as exc:  # the SDK's validation errors, named as it names them
            raise _error(400, exc.reason, exc.error_type) from None
        if size > MAX_RECORD:  # (JSON can grow in msgpack: 1.5 takes 4 bytes there, 9 here)
            raise _error(413, f"the arguments and key encode to {size} bytes, more than a "
                              f"request record holds ({MAX_RECORD})", "PayloadTooLarge")
        return await self._answer(lambda: self.client.call(
            operator, key, function, *args, idempotency_key=ikey), "result")

    def _check_types(self, operator: str, function: str, raw: list[Any]) -> None:
        """:class:`BadArguments` unless ``raw`` (the args as JSON has them) fits the
        function's schema in the document."""
        schema, check = self._args[operator, function]
        found = check(raw)
        if found is None:
            return
        at, want, got = found
        if not at:  # the array itself: too many arguments for a *args
            raise BadArguments(f"{operator}.{function} takes at most {schema['maxItems']} "
                               f"arguments, got {len(raw)}")
        i = int(at[1:at.index("]")])
        prefix = schema.get("prefixItems", [])
        name = (prefix[i] if i < len(prefix) else schema["items"])["title"]
        inner = at[at.index("]") + 1:]
        raise BadArguments(f"{operator}.{function} argument {i + 1} ({name}){inner} must be "
                           f"{want}, got {dumps(got)[:80].decode(errors='replace')}")

    async def _get(self, operator: str, key: str) -> Response:
        try:
            self.app.get_operator(operator)
            if not key or key[0] == "\x00":
                raise BadKey(f"key for operator {operator!r} must be non-empty and not start "
                             f"with '\\x00' (reserved for the runtime), got {key!r:.80}")
        except TransactionAborted as exc:
            raise _error(400, exc.reason, exc.error_type) from None
        return await self._answer(lambda: self.client.get(operator, key), "value")

    async def _scan(self, request: Request, operator: str) -> Response:
        query = dict(parse_qsl(request.url.query, keep_blank_values=True))
        unknown = sorted(set(query) - {"prefix", "limit"})
        if unknown:
            raise _error(400, f"unknown query parameter(s) {unknown!r:.120}; a scan takes "
                              "prefix and limit", "BadRequest")
        raw = query.get("limit", "1000")
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6):
            raise _error(400, f"limit must be an integer from 1 to 10000, got {raw!r:.40}",
                         "BadArguments")
        prefix, limit = query.get("prefix", ""), int(raw)
        try:
            self.app.get_operator(operator)
            check_scan(prefix, limit)
        except TransactionAborted as exc:
            raise _error(400, exc.reason, exc.error_type) from None
        return await self._answer(lambda: self._scan_items(operator, prefix, limit), "items")

    async def _scan_items(self, operator: str, prefix: str, limit: int) -> list[list[Any]]:
        return [list(kv) for kv in await self.client.scan(operator, prefix, limit)]

    async def _answer(self, work: Callable[[], Awaitable[Any]], field: str) -> Response:
        """Run ``work`` against the cluster; 200 ``{field: value}`` or the mapped error."""
        try:
            value = await work()
        except RequestTimeout as exc:
            raise _error(504, f"{exc}. The request may still commit: a retry is safe only "
                              "with the same Idempotency-Key header", "GatewayTimeout") from None
        except ClusterError as exc:
            raise _error(503, f"the cluster did not take the request: {exc}",
                         "ServiceUnavailable") from None
        except (BadRequest, LookupError) as exc:  # a read the SDK refused, a bad name
            assert isinstance(exc, TransactionAborted)
            raise _error(400, exc.reason, exc.error_type) from None
        except TransactionAborted as exc:
            raise HttpError(409, {"aborted": exc.reason, "type": exc.error_type}) from None
        return _json(200, {field: value})


def _is_json(values: list[str]) -> bool:
    if len(values) != 1:
        return False
    media, _, params = values[0].partition(";")
    if media.strip().lower() != "application/json":
        return False
    charset = [p.split("=", 1)[1].strip().strip('"').lower() for p in params.split(";")
               if p.strip().lower().startswith("charset=")]
    return all(c in ("utf-8", "utf8") for c in charset)


async def _read_body(request: Request) -> bytes:
    """The body, or 413 as soon as it passes :data:`MAX_BODY` (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _too_large(int(declared))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise _too_large(len(body))
    return bytes(body)


def _too_large(size: int) -> HttpError:
    return _error(413, f"the request body has more than {MAX_BODY} bytes (got {size}+), the "
                       "gateway's limit (gateway.settings.MAX_BODY)", "PayloadTooLarge")
