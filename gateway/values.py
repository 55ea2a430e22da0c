"""JSON in, JSON out: request bodies to function arguments, msgpack values to JSON text.

Arguments arrive as strict JSON (RFC 8259: no ``NaN``/``Infinity`` literals) and are
exactly the values a function sees: null, bool, int, float, str, list, dict — and bytes,
written as ``{"$base64": "<standard base64>"}`` (an object of that one key is always read
as bytes).

Results and state values are msgpack values, a little more than JSON holds; they are
written as JSON this way:

* ``bytes`` → ``{"$base64": "<standard base64>"}`` (a dict key that is bytes → its base64
  text);
* a float that is not finite → the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``;
* dict keys that are int, float, bool or null → their JSON text (``1`` → ``"1"``), as JSON
  objects have only string keys.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from sfaas.errors import BadRequest

__all__ = ["dumps", "parse_args"]

#: Deepest nesting of a request body (a deeper one is refused before it is parsed, so a
#: pathological body cannot exhaust the parser's recursion).
MAX_DEPTH = 100
#: A JSON escape of a UTF-16 surrogate: a lone one makes a str no UTF-8 encoder takes.
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"the request body is not strict JSON: {name} is not a JSON value")


def _depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` (strings ignored), stopping above MAX_DEPTH."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_args(body: bytes) -> list[Any]:
    """The ``args`` list of a request body ``{"args": [...]}`` (an empty body: no
    arguments); :class:`BadRequest` naming what is wrong."""
    if not body.strip():
        return []
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8: {exc}") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an int of more than 4300 digits
        raise BadRequest(f"the request body is not acceptable JSON: {exc}") from None
    if _SURROGATE.search(text):
        _check_text(doc)
    if not isinstance(doc, dict):
        raise BadRequest('the request body must be a JSON object {"args": [...]}, got '
                         f"{type(doc).__name__ if doc is not None else 'null'}")
    extra = sorted(k for k in doc if k != "args")
    if extra:
        raise BadRequest(f'the request body may only hold "args", got also {extra!r:.120}')
    args = doc.get("args", [])
    if not isinstance(args, list):
        raise BadRequest(f'"args" must be a JSON array of the function\'s arguments, got '
                         f"{json.dumps(args)[:80]}")
    if '"$base64"' in text:
        return [_bytes_in(a) for a in args]
    return args


def _bytes_in(value: Any) -> Any:
    """``value`` with each ``{"$base64": "…"}`` decoded to bytes."""
    if isinstance(value, dict):
        if len(value) == 1 and "$base64" in value:
            try:
                return base64.b64decode(value["$base64"], validate=True)
            except (TypeError, ValueError):
                raise BadRequest(f'{{"$base64": …}} must hold standard base64 text, got '
                                 f"{value['$base64']!r:.80}") from None
        return {k: _bytes_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bytes_in(v) for v in value]
    return value


def _check_text(value: Any) -> None:
    """Raise :class:`BadRequest` if a str in ``value`` holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"the request body holds a lone UTF-16 surrogate escape in "
                             f"{value!r:.80}, which is no Unicode text") from None
    elif isinstance(value, list):
        for v in value:
            _check_text(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not a msgpack value")


def _plain(value: Any) -> Any:
    """``value`` with what strict JSON cannot hold replaced (module docstring)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, bytes | bytearray | memoryview):
        return _default(value)
    return value


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(k)).decode("ascii")
    return json.dumps(_plain(k))


def dumps(doc: Any) -> bytes:
    """``doc`` as compact UTF-8 JSON (msgpack values mapped as in the module docstring)."""
    try:
        return json.dumps(doc, allow_nan=False, ensure_ascii=False, separators=(",", ":"),
                          default=_default).encode()
    except (ValueError, TypeError):  # a non-finite float or a bytes key: the slow path
        return json.dumps(_plain(doc), allow_nan=False, ensure_ascii=False,
                          separators=(",", ":")).encode()
