"""Fuzz: 10,000 seeded HTTP requests against one ``sfaas gateway`` in front of a real
cluster — bad JSON, huge bodies, bad paths, methods, headers and unicode, garbage request
lines, and valid calls and reads among them.

Outcomes: a valid request gets 200 (or 409 for an abort); every other one a 4xx whose JSON
body names the problem (``{"error": …, "type": …}``) — also a request HTTP itself cannot
parse (a garbage request line, a method llhttp does not know, raw non-ASCII bytes or
controls in the target, a malformed header), which the HTTP parser refuses before the
gateway's routes see it (``BadHttp``). Never a 5xx, a
connection closed without an answer, or a gateway that stops answering: afterwards it
still commits a good request, and its log holds no traceback. ``SFAAS_GATEWAY_FUZZ_SEED``
reproduces a run (the seed is printed).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.settings import MAX_BODY
from sfaas.runtime.settings import Settings
from tests.gateway.conftest import Gateway, gateway, shop  # noqa: F401  (the cluster fixture)

SEED = int(os.environ.get("SFAAS_GATEWAY_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
REQUESTS = 10_000
TOKEN = "fuzz-token-" + "z" * 24
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO", "post"]
OPS = ["accounts", "misc", "nope", "", "accounts.x", "../accounts", "%00", "%ff%fe", "ü", "a" * 300]
FNS = ["deposit", "withdraw", "slow", "odd", "echo", "untyped", "nope", "", "__init__", "bump"]
UNICODE = ["é", "😀", "\u202e", "\x00", "\ud800", "中文", "\uffff", " ", "\t", "'\"<>"]

Spec = tuple[str, str, list[tuple[bytes, bytes]], bytes, str]  # method, path, headers, body, kind


def _text(rnd: random.Random, n: int = 12) -> str:
    return "".join(rnd.choice(UNICODE + list("abcxyz019/%?#&=+.")) for _ in range(rnd.randrange(n)))


def _pct(text: str) -> str:
    from urllib.parse import quote

    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _json_noise(rnd: random.Random) -> bytes:
    good = json.dumps({"args": [rnd.randrange(100)]}).encode()
    choices: list[Callable[[], bytes]] = [
        lambda: good[: rnd.randrange(len(good))],                          # truncated
        lambda: bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64))),  # bytes
        lambda: good.replace(b"[", b"{", 1),
        lambda: b'{"args": [' + b"[" * rnd.randrange(50, 3000) + b"]}",
        lambda: b'{"args": ' + json.dumps(_text(rnd)).encode() + b"}",
        lambda: b'{"args": [NaN, Infinity]}',
        lambda: b'{"args": [1e999999]}',
        lambda: b'{"args": [' + b"9" * rnd.randrange(20, 6000) + b"]}",
        lambda: b'{"args": ["\\ud800"]}',
        lambda: b'{"args": [1], "kw": {}}',
        lambda: json.dumps({"args": [{"k": list(range(rnd.randrange(300)))}] * rnd.randrange(300)}).encode(),
        lambda: b"null", lambda: b"[]", lambda: b'"args"', lambda: b"\xef\xbb\xbf{}",
        lambda: json.dumps({"args": list(range(rnd.choice([2, 257, 1000])))}).encode(),
    ]
    return rnd.choice(choices)()


def make_request(rnd: random.Random, i: int) -> Spec:
    """One request: its kind says what must come back (``valid``, ``raw`` or ``bad``)."""
    key = f"f{rnd.randrange(50)}"
    path = f"/v1/gwshop/accounts/{key}/deposit"
    headers = [(b"Content-Type", b"application/json"), (b"Authorization", f"Bearer {TOKEN}".encode())]
    body = json.dumps({"args": [rnd.randrange(1, 10)]}).encode()
    method, kind = "POST", "bad"
    roll = rnd.random()
    if roll < 0.06:  # valid calls and reads
        kind = "valid"
        pick = rnd.randrange(4)
        if pick == 1:
            path = f"/v1/gwshop/accounts/{key}/withdraw"
            body = json.dumps({"args": [rnd.randrange(1, 1000)]}).encode()
        elif pick == 2:
            method, path, body = "GET", f"/v1/gwshop/accounts/{key}", b""
        elif pick == 3:
            method, path, body = "GET", f"/v1/gwshop/accounts?prefix=f{rnd.randrange(10)}&limit={rnd.randrange(1, 50)}", b""
        if rnd.random() < 0.3:
            headers.append((b"Idempotency-Key", f"fz-{rnd.randrange(200)}".encode()))
    elif roll < 0.30:
        body = _json_noise(rnd)
    elif roll < 0.32:  # huge: declared or chunked, or under the limit but larger in msgpack
        body = b'{"args": ["' + b"x" * (MAX_BODY + rnd.randrange(1, MAX_BODY)) + b'"]}'
        if rnd.random() < 0.2:
            body = json.dumps({"args": [[1.5] * rnd.randrange(200_000, 250_000)]}).encode()
        elif rnd.random() < 0.5:
            headers.append((b"Transfer-Encoding", b"chunked"))
    elif roll < 0.50:  # paths
        segs = ["v1", rnd.choice(["gwshop", "other", "", "GWSHOP", _pct(_text(rnd))]),
                rnd.choice(OPS), _pct(_text(rnd)) if rnd.random() < 0.5 else key, rnd.choice(FNS)]
        segs = segs[: rnd.randrange(1, 7)] + [_text(rnd) for _ in range(rnd.randrange(2))]
        path = "/" + "/".join(s.replace(" ", "%20").replace("#", "%23").replace("?", "%3F")
                              .replace("\x00", "%00").replace("\t", "%09") for s in segs)
        if rnd.random() < 0.2:
            path += "?" + _pct(_text(rnd)) + "=" + _pct(_text(rnd))
        if rnd.random() < 0.3:
            path = path.replace("gwshop", rnd.choice(["gwshop", "..", "."]))
    elif roll < 0.60:  # methods
        method = rnd.choice(METHODS)
        if method in ("GET", "HEAD") and rnd.random() < 0.5:
            path = f"/v1/gwshop/accounts/{key}"
            kind = "valid" if method == "GET" else "bad"
        if method == "GET" and kind == "bad":
            body = b""
    elif roll < 0.80:  # headers
        bad: list[tuple[bytes, bytes]] = rnd.choice([
            [(b"Content-Type", rnd.choice([b"text/plain", b"application/json; charset=latin-1",
                                           b"application/jsonx", b"", b"*/*", b"multipart/form-data"]))],
            [(b"Content-Type", b"application/json")],
            [(b"Idempotency-Key", rnd.choice([b"", b"x" * 257, "é".encode("latin-1"), b"a\x01b"]))],
            [(b"Idempotency-Key", b"a"), (b"Idempotency-Key", b"b")],
            [(b"Authorization", rnd.choice([b"Bearer", b"Bearer x", b"Basic abc",
                                            f"bearer {TOKEN}x".encode(), b"\xff" * 40]))],
            [(b"Authorization", f"Bearer {TOKEN}".encode())] * 2,
            [(b"X-Junk-" + str(rnd.randrange(9)).encode(), b"v" * rnd.randrange(1, 20_000))],
        ])
        names = {k.lower() for k, _ in bad}
        headers = [h for h in headers if h[0].lower() not in names] + bad
        if b"Content-Type" in names and b"Content-Type" in dict(bad) and dict(bad)[b"Content-Type"] == b"application/json":
            headers = [h for h in headers if h[0] != b"Content-Type"]  # no content type at all
        if any(k.startswith(b"X-Junk") for k, _ in bad):
            path = f"/v1/gwshop/accounts/{key}/nope"
    elif roll < 0.88:  # unicode in the arguments and keys
        path = f"/v1/gwshop/accounts/{_pct(_text(rnd)) or 'k'}/{rnd.choice(['deposit', 'echo'])}"
        body = json.dumps({"args": [_text(rnd) for _ in range(rnd.randrange(3))]}).encode()
        if rnd.random() < 0.3:
            path = path.replace("accounts", "misc")
    else:  # what HTTP itself cannot parse
        kind = "raw"
        raw = rnd.choice([
            b"GARBAGE\r\n\r\n", b"GET /v1 HTTP/9.9\r\n\r\n", b"GET  HTTP/1.1\r\n\r\n",
            b"POST /v1/gwshop/accounts/k/deposit HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/gwshop/accounts/k/deposit HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET /v1/gwshop/accounts/k HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
        ])
        return "RAW", raw.decode("latin-1"), [], b"", kind
    if kind == "bad" and (method not in _PARSED or not all(33 <= ord(c) < 127 for c in path)
                          or any(b < 32 and b != 9 or b == 127 for _, v in headers for b in v)):
        kind = "raw"  # a method llhttp does not know, raw non-ASCII or controls in the target,
        # controls in a header value
    return method, path, headers, body, kind


#: The methods uvicorn's HTTP parser (llhttp) takes; others it answers with its own 400.
_PARSED = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"}


def send(port: int, spec: Spec) -> tuple[int, dict[bytes, bytes], bytes]:
    """Send one request on a new connection; ``(status, headers, body)`` of the answer."""
    method, path, headers, body, _ = spec
    if method == "RAW":
        data = path.encode("latin-1")
    else:
        chunked = any(k == b"Transfer-Encoding" for k, _ in headers)
        head = [f"{method} {path} HTTP/1.1".encode("utf-8", "surrogatepass"), b"Host: 127.0.0.1",
                b"Connection: close", *(k + b": " + v for k, v in headers)]
        if chunked:
            payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in
                               (body[i:i + 65536] for i in range(0, len(body), 65536))) + b"0\r\n\r\n"
        else:
            head.append(b"Content-Length: %d" % len(body))
            payload = body
        data = b"\r\n".join(head) + b"\r\n\r\n" + payload
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (413) and closed: read what it said
        chunks = []
        while True:
            try:
                c = s.recv(65536)
            except ConnectionResetError:
                break
            if not c:
                break
            chunks.append(c)
    resp = b"".join(chunks)
    head_b, _, rest = resp.partition(b"\r\n\r\n")
    lines = head_b.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 "):
        return 0, {}, resp[:200]
    hdrs = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
    return int(lines[0].split()[1]), hdrs, rest


@pytest.mark.timeout(300)
def test_ten_thousand_fuzzed_requests_each_get_a_named_4xx_or_their_answer(
        shop: tuple[Settings, Path]) -> None:  # noqa: F811
    cs, tmp = shop
    print(f"gateway fuzz seed: SFAAS_GATEWAY_FUZZ_SEED={SEED}")
    rnd = random.Random(SEED)
    specs = [make_request(rnd, i) for i in range(REQUESTS)]
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    wrong: list[str] = []
    t0 = time.monotonic()
    with gateway(cs, tmp, token=TOKEN) as g:
        def one(spec: Spec) -> None:
            status, hdrs, body = send(g.port, spec)
            kind = spec[4]
            seen[kind, status] += 1
            problem = _check(kind, spec[0], status, hdrs, body)
            if problem and len(wrong) < 20:
                wrong.append(f"{problem}: {spec[0]} {spec[1][:120]!r} {spec[2]!r:.200} "
                             f"body {spec[3][:80]!r} -> {status} {body[:300]!r}")

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(one, specs))
        elapsed = time.monotonic() - t0
        # still alive and still working
        assert g.proc.poll() is None, g.tail()
        assert g.call("accounts", "after-fuzz", "deposit", 1) == (200, {"result": 1})
        log = g.log.read_text()
    print(f"{REQUESTS} requests in {elapsed:.1f} s; (kind, status) counts: "
          f"{dict(sorted(seen.items()))}")
    assert not wrong, f"seed {SEED}:\n" + "\n".join(wrong)
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    assert sum(n for (k, s), n in seen.items() if k == "valid" and s == 200) > 100, seen
    assert {413, 404, 405, 401, 400} <= {s for _, s in seen}, seen


def _check(kind: str, method: str, status: int, hdrs: dict[bytes, bytes], body: bytes) -> str:
    """What is wrong with an answer ("" when nothing)."""
    if status == 0:
        return "no HTTP answer"
    if status >= 500:
        return "a 5xx"
    if kind == "valid":
        return "" if status in (200, 409) else "a valid request refused"
    if kind == "raw" and not 400 <= status < 500:
        return "garbage accepted"
    if status in (200, 409):
        return ""  # a mutation can stay valid (409: {"aborted": …} from the function)
    if not 400 <= status < 500:
        return "not a 4xx"
    if method == "HEAD":
        return ""  # no body by definition
    try:
        doc = json.loads(body)
    except ValueError:
        return "a 4xx without a JSON body"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str) or not doc["error"]:
        return "a 4xx whose JSON names no error"
    return ""
