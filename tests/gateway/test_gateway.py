"""The HTTP gateway against a real cluster: each status it answers, the Idempotency-Key,
the bearer token, /openapi.json and /metrics — through ``sfaas gateway`` subprocesses."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import MAX_BODY
from sfaas.runtime.settings import Settings
from tests.gateway.conftest import APP, ROOT, Gateway, free_port, gateway

INT = {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1}


def _key() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


def test_a_call_commits_and_its_state_reads_back(gw: Gateway) -> None:
    k = _key()
    assert gw.call("accounts", k, "deposit", 30) == (200, {"result": 30})
    assert gw.call("accounts", k, "deposit", 12) == (200, {"result": 42})
    status, headers, doc = gw.request("GET", f"/v1/gwshop/accounts/{k}")
    assert (status, doc) == (200, {"value": 42}) and headers["content-type"] == "application/json"
    assert gw.request("GET", "/v1/gwshop/accounts/never-written")[2] == {"value": None}
    status, _, doc = gw.request("GET", f"/v1/gwshop/accounts?prefix={k}&limit=5")
    assert (status, doc) == (200, {"items": [[k, 42]]})
    # a key with a '/' and non-ASCII text travels percent-encoded
    assert gw.call("accounts", "a%2Fb%C3%A9", "deposit", 1)[0] == 200
    assert gw.request("GET", "/v1/gwshop/accounts?prefix=a%2Fb")[2] == {"items": [["a/bé", 1]]}


def test_an_abort_is_409_with_its_reason(gw: Gateway) -> None:
    status, doc = gw.call("accounts", _key(), "withdraw", 5)
    assert status == 409 and "insufficient funds" in doc["aborted"], doc


def test_bad_input_is_400_with_the_sdks_message(gw: Gateway) -> None:
    cases = {
        ("/v1/gwshop/nope/k/deposit", b'{"args":[1]}'): ("UnknownOperator", "no operator 'nope'"),
        ("/v1/gwshop/accounts/k/nope", b'{"args":[1]}'): ("UnknownFunction", "no function 'nope'"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":[1,2]}'): ("BadArguments", "got 2 argument"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":[18446744073709551616]}'): ("BadArguments", "argument 1 (amount) must be an integer from -9223372036854775808 to 18446744073709551615, got 18446744073709551616"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":["1"]}'): ("BadArguments", "must be an integer"),
        ("/v1/gwshop/misc/k/echo", b'{"args":["n",["t",2]]}'): ("BadArguments", "misc.echo argument 2 (tags)[1] must be a string, got 2"),
        ("/v1/gwshop/misc/k/echo", b'{"args":["n",[],{"$base64":"AA=="}]}'): ("BadArguments", 'argument 3 (meta) must be an object'),
        ("/v1/gwshop/misc/k/untyped", b'{"args":[[{"$base64":"A"}]]}'): ("BadArguments", 'argument 1 (a)[0] must be bytes as {"$base64": "<standard base64>"}, got {"$base64":"A"}'),
        ("/v1/gwshop/misc/k/untyped", b'{"args":' + b"[" * 70 + b"]" * 70 + b"}"): ("NotSerializable", "nests lists/dicts more than 64"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":'): ("BadRequest", "not JSON"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":{"a":1}}'): ("BadRequest", '"args" must be a JSON array'),
        ("/v1/gwshop/accounts/k/deposit", b'[1]'): ("BadRequest", "must be a JSON object"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":[NaN]}'): ("BadRequest", "NaN is not a JSON value"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":[1],"x":2}'): ("BadRequest", "only hold \"args\""),
        ("/v1/gwshop/accounts/k/deposit", b'\xff\xfe'): ("BadRequest", "not UTF-8"),
        ("/v1/gwshop/accounts/k/deposit", b'{"args":["\\ud800"]}'): ("BadRequest", "surrogate"),
        ("/v1/gwshop/accounts/k/deposit", b"[" * 5000 + b"]" * 5000): ("BadRequest", "nests deeper"),
        ("/v1/gwshop/accounts/%00k/deposit", b'{"args":[1]}'): ("BadKey", "must not start with"),
        ("/v1/gwshop/accounts/%ff/deposit", b'{"args":[1]}'): ("BadRequest", "key in the path is not"),
    }
    for (path, body), (kind, text) in cases.items():
        status, _, doc = gw.request("POST", path, body, {"Content-Type": "application/json"})
        assert status == 400 and doc["type"] == kind and text in doc["error"], (path, body[:40], doc)
    for headers, text in (({"Content-Type": "text/plain"}, "must be application/json"),
                          ({}, "needs 'Content-Type: application/json'"),
                          ({"Content-Type": "application/json", "Idempotency-Key": "x" * 300},
                           "idempotency key must be a str of 1 to 256")):
        status, _, doc = gw.request("POST", "/v1/gwshop/accounts/k/deposit", b'{"args":[1]}', headers)
        assert status == 400 and text in doc["error"], (headers, doc)
    for path, text in (("/v1/gwshop/accounts?limit=0", "limit must be an int from 1 to 10000"),
                       ("/v1/gwshop/accounts?limit=abc", "limit must be an integer"),
                       ("/v1/gwshop/accounts?prefx=a", "unknown query parameter"),
                       ("/v1/gwshop/nope/k", "no operator 'nope'")):
        status, _, doc = gw.request("GET", path)
        assert status == 400 and text in doc["error"], (path, doc)


def test_unknown_paths_404_wrong_methods_405_big_bodies_413(gw: Gateway) -> None:
    for path in ("/v1/otherapp/accounts/k/deposit", "/v1/gwshop", "/v1/gwshop/a/b/c/d",
                 "/nothing", "/v1", "/v1/"):
        status, _, doc = gw.request("POST", path, b"{}", {"Content-Type": "application/json"})
        assert status == 404 and doc["type"] == "NotFound", (path, doc)
    assert "this gateway serves app 'gwshop'" in gw.request("GET", "/v1/x/accounts/k")[2]["error"]
    for method, path, allow in (("GET", "/v1/gwshop/accounts/k/deposit", "POST"),
                                ("POST", "/v1/gwshop/accounts/k", "GET"),
                                ("DELETE", "/v1/gwshop/accounts", "GET"),
                                ("POST", "/healthz", "GET")):
        status, headers, doc = gw.request(method, path)
        assert (status, headers["allow"], doc["type"]) == (405, allow, "MethodNotAllowed"), (method, path)
    # what HTTP cannot parse is refused by the parser, in JSON too
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"GARBAGE /v1 HTTP/1.1\r\n\r\n")
        answer = s.makefile("rb").read()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["type"] == "BadHttp", answer
    body = b'{"args":["' + b"x" * MAX_BODY + b'"]}'
    status, _, doc = gw.request("POST", "/v1/gwshop/accounts/k/deposit", body,
                                {"Content-Type": "application/json"})
    assert status == 413 and str(MAX_BODY) in doc["error"], doc
    # under the body limit, but 2.25 times larger in msgpack than in JSON: more than a record
    status, _, doc = gw.request("POST", "/v1/gwshop/misc/k/untyped",
                                {"args": [[1.5] * 200_000]})
    assert status == 413 and "more than a request record holds" in doc["error"], doc
    # just under both limits: it reaches the function
    status, _, doc = gw.request("POST", "/v1/gwshop/misc/big/size",
                                {"args": ["x" * (MAX_BODY - 10_000)]})
    assert (status, doc) == (200, {"result": MAX_BODY - 10_000}), doc


def test_the_same_idempotency_key_runs_once_and_gets_the_first_outcome(gw: Gateway) -> None:
    k, ik = _key(), f"ik-{uuid.uuid4().hex}"
    first = gw.call("accounts", k, "deposit", 7, headers={"Idempotency-Key": ik})
    again = gw.call("accounts", k, "deposit", 7, headers={"Idempotency-Key": ik})
    assert first == again == (200, {"result": 7})
    assert gw.request("GET", f"/v1/gwshop/accounts/runs:{k}")[2] == {"value": 1}
    assert gw.call("accounts", k, "deposit", 7) == (200, {"result": 14})  # no key: runs


def test_a_timeout_is_504_and_a_retry_with_the_key_is_safe(gw: Gateway,
                                                           shop: tuple[Settings, Path]) -> None:
    cs, tmp = shop
    k, ik = _key(), f"ik-{uuid.uuid4().hex}"
    with gateway(cs, tmp, "--timeout", "0.001") as hasty:
        status, doc = hasty.call("accounts", k, "deposit", 5, headers={"Idempotency-Key": ik})
    assert status == 504 and doc["type"] == "GatewayTimeout", doc
    assert "may still commit" in doc["error"] and "Idempotency-Key" in doc["error"], doc
    assert gw.call("accounts", k, "deposit", 5, headers={"Idempotency-Key": ik}) == (200, {"result": 5})
    assert gw.request("GET", f"/v1/gwshop/accounts/runs:{k}")[2] == {"value": 1}


def test_the_in_flight_limit_answers_429_at_once(shop: tuple[Settings, Path]) -> None:
    cs, tmp = shop
    with gateway(cs, tmp, "--max-in-flight", "2") as g, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(g.call, "misc", f"s{i}", "slow", 1.5) for i in range(8)]
        outcomes = [f.result() for f in futs]
        statuses = sorted(s for s, _ in outcomes)
        assert statuses.count(200) >= 2 and statuses.count(429) >= 4, outcomes
        doc = next(d for s, d in outcomes if s == 429)
        assert "SFAAS_GATEWAY_MAX_IN_FLIGHT" in doc["error"], doc
        assert g.request("GET", "/healthz")[0] == 200


def test_results_json_cannot_hold_are_mapped(gw: Gateway) -> None:
    status, doc = gw.call("misc", "x", "odd")
    assert status == 200, doc
    assert doc["result"] == {"raw": {"$base64": "AP9vaw=="}, "inf": "-Infinity", "n": {"1": "one"}}
    # bytes go in the same way they come out
    assert gw.call("misc", "x", "untyped", {"$base64": "AP8="}) == (
        200, {"result": [{"$base64": "AP8="}, 2]})


def test_the_token_is_required_and_checked(gw: Gateway) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-of-some-length"},
                    {"Authorization": f"Basic {gw.token}"}):
        status, h, doc = gw.request("POST", "/v1/gwshop/accounts/k/deposit", {"args": [1]},
                                    headers=headers, auth=False)
        assert status == 401 and h["www-authenticate"].startswith("Bearer"), doc
        assert gw.token not in json.dumps(doc)
    assert gw.request("GET", "/openapi.json", auth=False)[0] == 401
    assert gw.request("GET", "/healthz", auth=False)[0] == 200
    assert gw.token not in gw.tail()


def test_listening_beyond_loopback_needs_a_token(shop: tuple[Settings, Path]) -> None:
    cs, _ = shop
    out = subprocess.run([sys.executable, "-m", "sfaas", "gateway", "--app", APP, "--listen",
                          "0.0.0.0:0", "--kafka", cs.kafka, "--namespace", cs.namespace],
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "SFAAS_GATEWAY_TOKEN": ""})
    assert out.returncode == 2, out
    assert "refusing to serve HTTP on 0.0.0.0 without a bearer token" in out.stderr
    out = subprocess.run([sys.executable, "-m", "sfaas", "gateway", "--app", APP, "--listen",
                          "0.0.0.0:0"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "SFAAS_GATEWAY_TOKEN": "short-secret"})
    assert out.returncode == 2 and "at least 16" in out.stderr and "short-secret" not in out.stderr


def test_openapi_describes_every_function_from_its_signature(gw: Gateway) -> None:
    status, _, doc = gw.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    for fn in ("deposit", "bump", "withdraw"):
        assert "post" in paths[f"/v1/gwshop/accounts/{{key}}/{fn}"]
    for fn in ("slow", "odd", "echo", "untyped", "size"):
        assert "post" in paths[f"/v1/gwshop/misc/{{key}}/{fn}"]
    assert "get" in paths["/v1/gwshop/accounts/{key}"] and "get" in paths["/v1/gwshop/accounts"]
    dep = paths["/v1/gwshop/accounts/{key}/deposit"]["post"]
    body = dep["requestBody"]
    assert body["required"] and body["content"]["application/json"]["schema"]["required"] == ["args"]
    args = body["content"]["application/json"]["schema"]["properties"]["args"]
    assert args == {"type": "array", "prefixItems": [{"title": "amount", **INT}],
                    "minItems": 1, "items": False, "maxItems": 1}
    assert dep["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["result"] == {"type": "integer"}
    assert set(dep["responses"]) == {"200", "400", "401", "409", "413", "429", "503", "504"}
    assert dep["responses"]["401"]["headers"]["WWW-Authenticate"]["required"]
    bump = paths["/v1/gwshop/accounts/{key}/bump"]["post"]["requestBody"]
    assert not bump["required"] and bump["content"]["application/json"]["schema"]["properties"]["args"] == {
        "type": "array", "minItems": 0, "items": False, "maxItems": 0}  # (no prefixItems: [])
    echo = paths["/v1/gwshop/misc/{key}/echo"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["args"]
    assert echo["minItems"] == 2 and echo["items"] == {"title": "rest", "anyOf": [INT, {"type": "null"}]}
    not_bytes = {"required": ["$base64"], "maxProperties": 1}
    assert echo["prefixItems"] == [
        {"title": "name", "type": "string"},
        {"title": "tags", "type": "array", "items": {"type": "string"}},
        {"title": "meta", "anyOf": [{"type": "object", "additionalProperties": INT, "not": not_bytes},
                                    {"type": "null"}], "default": None},
        {"title": "flag", "type": "boolean", "default": False},
        {"title": "ratio", "type": "number", "default": 1.5}]
    untyped = paths["/v1/gwshop/misc/{key}/untyped"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["args"]
    value = {"$ref": "#/components/schemas/Value"}
    assert untyped["prefixItems"] == [{"title": "a", **value}, {"title": "b", **value, "default": 2}]
    assert set(doc["components"]["schemas"]) == {"Value", "Object", "Bytes"}
    assert doc["security"] == [{"bearer": []}]
    status, doc = gw.call("misc", "e", "echo", "n", ["t"], None, True, 2.5, 1, None)
    assert doc == {"result": ["n", ["t"], None, True, 2.5, [1, None]]}


def test_metrics_count_requests_by_route_and_status(gw: Gateway) -> None:
    gw.call("accounts", _key(), "deposit", 1)
    gw.request("GET", "/v1/gwshop/nope/k")
    status, _, text = gw.request("GET", "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = {(s.labels["route"], s.labels["status"]): s.value
            for s in fams["sfaas_gateway_requests"].samples if s.name.endswith("_total")}
    assert reqs[("/v1/{app}/{operator}/{key}/{function}", "200")] >= 1
    assert reqs[("/v1/{app}/{operator}/{key}", "400")] >= 1
    assert any(s.labels.get("route") == "/v1/{app}/{operator}/{key}/{function}"
               for s in fams["sfaas_gateway_request_seconds"].samples)
    assert "sfaas_gateway_in_flight" in fams and "process_cpu_seconds" in fams


def test_sigterm_stops_the_gateway_cleanly(shop: tuple[Settings, Path]) -> None:
    cs, tmp = shop
    with gateway(cs, tmp) as g:
        assert g.call("accounts", _key(), "deposit", 1)[0] == 200
        g.proc.send_signal(signal.SIGTERM)
        g.proc.wait(30)
        assert g.proc.returncode == 0, g.tail()
        assert "Traceback" not in g.tail() and "gateway: stopped" in g.tail()


def test_metrics_are_also_on_the_metrics_port_like_every_process(shop: tuple[Settings, Path]) -> None:
    cs, tmp = shop
    port = free_port()
    with gateway(cs, tmp, "--metrics-port", str(port)) as g:
        g.request("GET", "/healthz")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    assert 'sfaas_gateway_requests_total{route="/healthz",status="200"}' in text

