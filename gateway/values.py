"""JSON in, JSON out: request bodies to function arguments, msgpack values to JSON text.

Arguments arrive as strict JSON (RFC 8259: no ``NaN``/``Infinity`` literals) and are
exactly the values a function sees: null, bool, int, float, str, list, dict — and bytes,
written as ``{"$base64": "<standard base64>"}`` (an object of that one key is always read
as bytes). A JSON number is a number whatever its spelling: an integer msgpack cannot hold
(beyond -2**63 .. 2**64-1) reaches a function as the nearest float, as JavaScript reads it
(where its schema takes any number: an ``int`` parameter refuses it, see
:mod:`gateway.schemas`).

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

__all__ = ["B64_PATTERN", "arguments", "dumps", "parse_args", "parse_body"]

#: Deepest nesting of a request body (a deeper one is refused before it is parsed, so a
#: pathological body cannot exhaust the parser's recursion).
MAX_DEPTH = 100
#: A JSON escape of a UTF-16 surrogate: a lone one makes a str no UTF-8 encoder takes.
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
#: Standard base64 (RFC 4648 §4, padded), all of it: what ``{"$base64": …}`` holds.
_B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
#: :data:`_B64` as a JSON Schema pattern.
B64_PATTERN = f"^{_B64.pattern}$"
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
#: Longest JSON integer read as an int: twice the digits of the largest msgpack holds.
_MAX_DIGITS = 40
_FLAT = (str, float, bool, type(None))


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


def _int(text: str) -> int | float:
    """A JSON integer: exactly, or, when it is far beyond msgpack's (and int() of thousands
    of digits would cost), the nearest float (or infinity)."""
    return int(text) if len(text) <= _MAX_DIGITS else float(text)


def parse_args(body: bytes) -> list[Any]:
    """The arguments of a request body ``{"args": [...]}`` (an empty body: none), as the
    function gets them; :class:`BadRequest` naming what is wrong."""
    return arguments(parse_body(body))


def parse_body(body: bytes) -> list[Any]:
    """The ``args`` list of a request body as JSON has it (what the schemas of
    :mod:`gateway.schemas` describe; :func:`arguments` makes the function's arguments of
    it); :class:`BadRequest` naming what is wrong."""
    if not body:  # (no body; one of blanks only is no JSON)
        return []
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8: {exc}") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # (the depth check should leave none)
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
    return args


def arguments(args: list[Any]) -> list[Any]:
    """The function's arguments of ``args`` as JSON has them: each ``{"$base64": "…"}``
    decoded to bytes (:class:`BadRequest` for one that does not hold standard base64 text),
    each integer msgpack cannot hold made the nearest float."""
    return _argument(args)  # type: ignore[no-any-return]


def _argument(value: Any) -> Any:
    """``value`` with each ``{"$base64": "…"}`` decoded to bytes, each int beyond
    msgpack's a float (ints have at most :data:`_MAX_DIGITS` digits: no overflow)."""
    if type(value) is int:
        return value if _INT_MIN <= value <= _INT_MAX else float(value)
    if isinstance(value, dict):
        if len(value) == 1 and "$base64" in value:
            text = value["$base64"]
            if not isinstance(text, str) or _B64.fullmatch(text) is None:
                raise BadRequest(f'{{"$base64": …}} must hold standard base64 text, got '
                                 f"{text!r:.80}")
            return base64.b64decode(text)
        return {k: _argument(v) for k, v in value.items()}
    if isinstance(value, list):
        if all(type(v) in _FLAT or type(v) is int and _INT_MIN <= v <= _INT_MAX
               for v in value):
            return value  # (nothing to decode, nothing to copy)
        return [_argument(v) for v in value]
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
