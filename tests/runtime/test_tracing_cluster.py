"""One request's trace on a real cluster (issue 50): Jaeger started the way a user starts it
(``launcher.services``, what ``sfaas services up --tracing`` runs), a 2-worker cluster and
a gateway with ``SFAAS_TRACING=1``, a call through the gateway carrying a W3C
``traceparent``; Jaeger's query API must then hold one trace with that id: the gateway's
server span (a child of the caller's span), the client's span, and the worker's span of the
request's execution, with its epoch, worker and request id — linked to the span of that
epoch on the worker, in the epoch's own trace, under the coordinator's span of the same
epoch."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster, services
from launcher.services import Endpoints, ServiceError
from tests.gateway.conftest import APP, app_cluster, gateway

#: Seconds the spans may take from the processes to Jaeger's query API (the processes
#: export every 200 ms here: OTEL_BSP_SCHEDULE_DELAY).
ARRIVAL = 30.0


@pytest.fixture(scope="module")
def jaeger() -> Iterator[Endpoints]:
    """A running local Jaeger (stopped afterwards if this fixture started it)."""
    cm = services.using(tracing=True)
    try:
        ep = cm.__enter__()
    except ServiceError as e:
        pytest.fail(f"could not start Jaeger: {e}", pytrace=False)
    try:
        yield ep
    finally:
        cm.__exit__(None, None, None)


def _trace(jaeger: Endpoints, trace_id: str) -> dict[str, Any] | None:
    """The trace ``trace_id`` as Jaeger's query API gives it (None: not there yet)."""
    try:
        with urllib.request.urlopen(f"{jaeger.jaeger_url}/api/traces/{trace_id}",
                                    timeout=5) as resp:
            traces = json.loads(resp.read())["data"] or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return traces[0] if traces else None


def _spans(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's spans, each with ``service`` (its process's service name) and ``tags``
    as a dict."""
    out = []
    for sp in trace["spans"]:
        out.append({**sp, "service": trace["processes"][sp["processID"]]["serviceName"],
                    "tags": {t["key"]: t["value"] for t in sp["tags"]}})
    return out


def _wait_for_spans(jaeger: Endpoints, trace_id: str) -> list[dict[str, Any]]:
    """The trace's spans once it holds the gateway's and a worker's (or what it holds
    after :data:`ARRIVAL` seconds)."""
    deadline = time.monotonic() + ARRIVAL
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        trace = _trace(jaeger, trace_id)
        spans = _spans(trace) if trace else []
        services_seen = {s["service"] for s in spans}
        if "sfaas-gateway" in services_seen \
                and any(s.startswith("sfaas-worker-") for s in services_seen):
            return spans
        time.sleep(0.3)
    return spans


def _round_spans(jaeger: Endpoints, namespace: str) -> list[dict[str, Any]]:
    """The spans of a snapshot round of this cluster (its coordinator's process has its
    namespace), the round's first: what Jaeger's search finds within ARRIVAL s."""
    query = urllib.parse.urlencode({"service": "sfaas-coordinator",
                                    "operation": "snapshot round", "limit": 20})
    deadline = time.monotonic() + ARRIVAL
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{jaeger.jaeger_url}/api/traces?{query}",
                                    timeout=5) as resp:
            traces = json.loads(resp.read())["data"] or []
        for trace in traces:
            tags = {t["key"]: t["value"] for p in trace["processes"].values() for t in p["tags"]}
            spans = sorted(_spans(trace), key=lambda s: bool(s["references"]))
            if tags.get("sfaas.namespace") == namespace and len(spans) == 3:
                return spans
        time.sleep(0.5)
    return []


def _slow_view_link(status_json: str, trace_id: str) -> list[str] | None:
    """The request cell of the status page's slow-request view that links to trace
    ``trace_id`` (the workers send their view on their next heartbeat; None: none came)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with urllib.request.urlopen(status_json, timeout=5) as resp:
            tables = {t["id"]: t for t in json.loads(resp.read())["tables"]}
        for row in tables["slow"]["rows"]:
            if isinstance(row[0], list) and row[0][1].endswith(trace_id):
                return list(row[0])
        time.sleep(0.3)
    return None


def _openmetrics(url: str) -> str:
    """A scrape of ``url`` asking for OpenMetrics, the format that carries exemplars."""
    req = urllib.request.Request(url, headers={
        "Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        return str(resp.read().decode())


def _refs(span: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    return [(r["traceID"], r["spanID"]) for r in span["references"] if r["refType"] == kind]


def _epoch_spans(jaeger: Endpoints, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans of the epoch trace the worker's request span links to, once it holds
    the coordinator's and a worker's epoch span (or what it holds after ARRIVAL s)."""
    executed = [s for s in spans if s["operationName"].startswith("execute ")]
    links = _refs(executed[0], "FOLLOWS_FROM") if executed else []
    if not links:
        return []
    deadline = time.monotonic() + ARRIVAL
    got: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        trace = _trace(jaeger, links[0][0])
        got = _spans(trace) if trace else []
        if {"sfaas-coordinator"} <= {s["service"] for s in got if s["operationName"] == "epoch"} \
                and any(s["spanID"] == links[0][1] for s in got):
            return got
        time.sleep(0.3)
    return got


def _assert_epoch_trace(epoch_spans: list[dict[str, Any]], executed: dict[str, Any]) -> None:
    """The request's link leads to its worker's span of its epoch, a child of the
    coordinator's span of the same epoch, each with children for its phases."""
    brief = [(s["service"], s["operationName"], s["tags"].get("sfaas.epoch"))
             for s in epoch_spans]
    [(_, linked)] = _refs(executed, "FOLLOWS_FROM")
    worker = next((s for s in epoch_spans if s["spanID"] == linked), None)
    assert worker is not None and worker["operationName"] == "epoch", brief
    epoch = executed["tags"]["sfaas.epoch"]
    assert worker["service"] == executed["service"], brief
    assert (worker["tags"]["sfaas.epoch"], worker["tags"]["sfaas.worker"]) == \
        (epoch, executed["tags"]["sfaas.worker"]), worker["tags"]
    coordinator = next((s for s in epoch_spans if s["service"] == "sfaas-coordinator"
                        and s["operationName"] == "epoch"), None)
    assert coordinator is not None and coordinator["tags"]["sfaas.epoch"] == epoch, brief
    assert not coordinator["references"], coordinator["references"]  # (the trace's root)
    assert _refs(worker, "CHILD_OF") == [(coordinator["traceID"], coordinator["spanID"])]
    phases = {(s["service"], s["operationName"]) for s in epoch_spans
              if _refs(s, "CHILD_OF") and _refs(s, "CHILD_OF")[0][1] in
              (worker["spanID"], coordinator["spanID"])}
    assert phases >= {(worker["service"], "execute"), (worker["service"], "commit"),
                      ("sfaas-coordinator", "barrier"), ("sfaas-coordinator", "commit")}, phases


@pytest.mark.timeout(900)  # (a first run builds Jaeger: several minutes)
def test_a_call_through_the_gateway_is_one_trace_from_the_caller_to_the_worker(
        kafka: Any, minio: Any, jaeger: Endpoints, tmp_path: Path) -> None:
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    with pytest.MonkeyPatch.context() as mp:
        # (read by sfaas up's coordinator and workers and by the gateway, as a user sets them)
        mp.setenv("SFAAS_TRACING", "1")
        mp.setenv("SFAAS_LOG_FORMAT", "json")
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint)
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        mp.setenv("SFAAS_JAEGER_UI", jaeger.jaeger_url)
        mp.delenv("OTEL_SERVICE_NAME", raising=False)
        mp.delenv("OTEL_TRACES_SAMPLER", raising=False)
        with app_cluster(kafka, minio, tmp_path, APP) as cs, gateway(cs, tmp_path) as gw:
            status, doc = gw.call("accounts", "traced-alice", "deposit", 5,
                                  headers={"traceparent": f"00-{trace_id}-{caller}-01"})
            assert (status, doc) == (200, {"result": 5})
            spans = _wait_for_spans(jaeger, trace_id)
            epoch_spans = _epoch_spans(jaeger, spans)
            exposition = {p.index: _openmetrics(p.metrics)
                          for p in cluster.ps(cs) if p.role == "worker" and p.metrics}
            (status,) = [p.metrics.rsplit("/", 1)[0] + "/status.json"
                         for p in cluster.ps(cs) if p.role == "coordinator"]
            link = _slow_view_link(status, trace_id)
            rounds = _round_spans(jaeger, cs.namespace)
            worker_log = "\n".join(p.read_text() for p in cluster.state_dir(cs).glob("w*.log"))

    brief = [(s["service"], s["operationName"]) for s in spans]
    assert all(s["traceID"] == trace_id for s in spans), brief
    by_name = {s["operationName"]: s for s in spans}
    server = by_name.get("POST /v1/{app}/{operator}/{key}/{function}")
    assert server is not None and server["service"] == "sfaas-gateway", brief
    assert [r["spanID"] for r in server["references"]] == [caller]  # the caller's child
    assert (server["tags"]["http.response.status_code"], server["tags"]["span.kind"],
            server["tags"]["url.path"]) == (200, "server", "/v1/gwshop/accounts/traced-alice/deposit")
    client = by_name.get("call accounts.deposit")
    assert client is not None and client["service"] == "sfaas-gateway", brief
    assert [r["spanID"] for r in client["references"]] == [server["spanID"]]
    executed = by_name.get("execute accounts.deposit")
    assert executed is not None and executed["service"].startswith("sfaas-worker-"), brief
    assert _refs(executed, "CHILD_OF") == [(trace_id, client["spanID"])]
    tags = executed["tags"]
    assert tags["sfaas.request_id"] == client["tags"]["sfaas.request_id"]
    assert isinstance(tags["sfaas.epoch"], int) and tags["sfaas.epoch"] >= 1, tags
    assert tags["sfaas.worker"] in (0, 1) and tags["sfaas.outcome"] == "committed", tags
    assert tags["sfaas.kept"] == "head", tags
    _assert_epoch_trace(epoch_spans, executed)
    # a snapshot round (one a second here) is a span of the coordinator, a child per step
    assert rounds and rounds[0]["tags"]["sfaas.round"] >= 1, rounds
    assert {s["operationName"] for s in rounds[1:]} == {"workers' snapshots", "publish"}
    # the status page's slow-request view links the request to its trace in Jaeger
    assert link == [tags["sfaas.request_id"], f"{jaeger.jaeger_url}/trace/{trace_id}"], link
    # the request's latency bucket on its worker names its trace (an OpenMetrics exemplar)
    text = exposition[tags["sfaas.worker"]]
    assert any(line.startswith("sfaas_request_latency_seconds_bucket{")
               and f'# {{trace_id="{trace_id}"}}' in line for line in text.splitlines()), \
        [x for x in text.splitlines() if "latency_seconds_bucket" in x]
    # the workers logged JSON lines (SFAAS_LOG_FORMAT=json), through the structured fields
    lines = [json.loads(x) for x in worker_log.splitlines() if x.startswith("{")]
    assert any(x["logger"].startswith("sfaas") and "message" in x for x in lines), \
        worker_log[-2000:]
