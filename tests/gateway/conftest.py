"""A real cluster of ``tests.gateway.shop`` and gateways in front of it, started the way a
user starts one: ``sfaas gateway`` as a subprocess."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.runtime.settings import Settings
from tests.runtime.test_recovery import chaos_settings, log_tails

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.gateway.shop:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    """A running ``sfaas gateway`` subprocess and how to talk to it."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    token: str = ""

    def request(self, method: str, path: str, body: bytes | str | dict[str, Any] | None = None,
                headers: dict[str, str] | None = None, auth: bool = True,
                timeout: float = 30.0) -> tuple[int, dict[str, str], Any]:
        """``(status, headers, JSON body or text)`` of one request."""
        h = dict(headers or {})
        if auth and self.token:
            h.setdefault("Authorization", f"Bearer {self.token}")
        if isinstance(body, dict):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            rh = {k.lower(): v for k, v in r.getheaders()}
        finally:
            conn.close()
        try:
            doc: Any = json.loads(data)
        except ValueError:
            doc = data.decode("latin-1")
        return r.status, rh, doc

    def call(self, op: str, key: str, fn: str, *args: Any, **kw: Any) -> tuple[int, Any]:
        status, _, doc = self.request("POST", f"/v1/gwshop/{op}/{key}/{fn}", {"args": list(args)},
                                      **kw)
        return status, doc

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


@contextlib.contextmanager
def gateway(cs: Settings, tmp: Path, *flags: str, token: str = "",
            listen: str | None = None, env: dict[str, str] | None = None,
            app: str = APP) -> Iterator[Gateway]:
    """``sfaas gateway`` of ``app`` for the cluster whose client settings are ``cs``, until
    /healthz answers; stopped (SIGTERM) afterwards."""
    port = free_port()
    log = tmp / f"gateway-{port}.log"
    e = {**os.environ, "SFAAS_GATEWAY_TOKEN": token, **(env or {})}
    cmd = [sys.executable, "-m", "sfaas", "gateway", "--app", app,
           "--listen", listen or f"127.0.0.1:{port}", "--kafka", cs.kafka,
           "--namespace", cs.namespace, *flags]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=out, stderr=subprocess.STDOUT)
    gw = Gateway(proc, port, log, token)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the gateway exited with {proc.returncode}:\n{gw.tail()}")
            with contextlib.suppress(OSError):
                if gw.request("GET", "/healthz", timeout=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not answer in 60 s:\n{gw.tail()}")
            time.sleep(0.1)
        yield gw
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def app_cluster(kafka: Any, minio: Any, tmp: Path, app: str) -> Iterator[Settings]:
    """A 2-worker cluster of ``app`` (memonly stores); its client settings. Its process
    logs are printed when the block fails."""
    s = chaos_settings(kafka, minio, tmp, store="memonly")
    cluster.up(s, app, 2, timeout=90)
    try:
        yield cluster.cluster_settings(s)[1]
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


@pytest.fixture(scope="module")
def shop(kafka: Any, minio: Any, tmp_path_factory: pytest.TempPathFactory) \
        -> Iterator[tuple[Settings, Path]]:
    """A 2-worker cluster of the shop app; its client settings and a scratch directory."""
    tmp = tmp_path_factory.mktemp("gateway")
    with app_cluster(kafka, minio, tmp, APP) as cs:
        yield cs, tmp


@pytest.fixture(scope="module")
def gw(shop: tuple[Settings, Path]) -> Iterator[Gateway]:
    """A gateway with a token, in front of the shop cluster."""
    cs, tmp = shop
    with gateway(cs, tmp, token="t0ken-" + "x" * 26) as g:
        yield g
