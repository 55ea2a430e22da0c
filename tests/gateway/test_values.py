"""The gateway's pieces that need no cluster: JSON mapping both ways, its settings."""

from __future__ import annotations

import json

import pytest

from gateway.settings import GatewaySettings
from gateway.values import dumps, parse_args
from sfaas.errors import BadRequest, ConfigError


def test_msgpack_values_json_cannot_hold_are_mapped_as_documented() -> None:
    assert json.loads(dumps({"b": b"\x01", "nan": float("nan"), "inf": float("inf"),
                             "keys": {1: 2, None: 3, b"k": 4}, "t": (1, 2)})) == {
        "b": {"$base64": "AQ=="}, "nan": "NaN", "inf": "Infinity",
        "keys": {"1": 2, "null": 3, "aw==": 4}, "t": [1, 2]}
    assert dumps({"s": "é"}) == '{"s":"é"}'.encode()


@pytest.mark.parametrize("body, text", [
    (b"nul", "not JSON"), (b"\n", "not JSON"), (b'{"args": [Infinity]}', "Infinity is not a JSON value"),
    (b'"x"', "must be a JSON object"), (b'{"args": 1}', "must be a JSON array"),
    (b'{"args": [], "kwargs": {}}', "may only hold"), (b"\xc3", "not UTF-8"),
    (b'{"args": ' + b"{\"a\":" * 200 + b"1" + b"}" * 200 + b"}", "nests deeper than 100"),
    (b'{"args": ["\\udfff"]}', "lone UTF-16 surrogate"),
    (b'{"args": [{"$base64": "not base64!"}]}', "must hold standard base64"),
    (b'{"args": [{"$base64": 5}]}', "must hold standard base64"),
    (b'{"args": [{"$base64": "AAAA="}]}', "must hold standard base64"),
    (b'{"args": [[{"$base64": "A"}]]}', "must hold standard base64"),
])
def test_bad_bodies_are_refused_naming_the_problem(body: bytes, text: str) -> None:
    with pytest.raises(BadRequest, match=text):
        parse_args(body)


def test_good_bodies_give_the_arguments() -> None:
    assert parse_args(b"") == [] and parse_args(b"{}") == []
    assert parse_args(b'{"args": [1, "a", null, [true], {"k": 1.5}]}') == [
        1, "a", None, [True], {"k": 1.5}]
    assert parse_args(b'{"args": ["[[[{{{", "\\ud83d\\ude00"]}') == ["[[[{{{", "😀"]
    # bytes both ways as {"$base64": ...}
    assert parse_args(b'{"args": [{"$base64": "AP8="}, [{"k": {"$base64": ""}}]]}') == [
        b"\x00\xff", [{"k": b""}]]
    assert parse_args(dumps({"args": [b"\x01\x02"]})) == [b"\x01\x02"]
    # a JSON number is a number: one msgpack cannot hold as an int is the nearest float
    assert parse_args(b'{"args": [18446744073709551615, -9223372036854775808, 2.0]}') == [
        (1 << 64) - 1, -(1 << 63), 2.0]
    big = parse_args(b'{"args": [18446744073709551616, -9223372036854775809, ' + b"9" * 5000
                     + b"]}")
    assert big == [2.0 ** 64, -(2.0 ** 63), float("inf")] and {type(v) for v in big} == {float}


def test_settings_refuse_bad_values_without_echoing_the_token() -> None:
    assert GatewaySettings.load(env={}).listen == "127.0.0.1:8080"
    s = GatewaySettings.load(env={"SFAAS_GATEWAY_TOKEN": "a" * 20,
                                  "SFAAS_GATEWAY_MAX_IN_FLIGHT": "5"}, overrides={"listen": "0.0.0.0:1"})
    assert s.max_in_flight == 5 and "a" * 20 not in repr(s)
    for env, text in (({"SFAAS_GATEWAY_MAX_IN_FLIGHT": "0"}, "max_in_flight"),
                      ({"SFAAS_GATEWAY_TIMEOUT": "x"}, "must be a number"),
                      ({"SFAAS_GATEWAY_LISTEN": "nohost"}, "host:port"),
                      ({"SFAAS_GATEWAY_LISTEN": "10.0.0.1:80"}, "without a bearer token"),
                      ({"SFAAS_GATEWAY_TOKEN": "secret token with blanks"}, "printable ASCII")):
        with pytest.raises(ConfigError, match=text) as e:
            GatewaySettings.load(env=env)
        assert "secret token" not in str(e.value)
