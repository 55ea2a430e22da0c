"""One request's trace on a real cluster (issue 50): Jaeger started the way a user starts it
(``launcher.services``, what ``sfaas services up --tracing`` runs), a 2-worker cluster and
a gateway with ``SFAAS_TRACING=1``, a call through the gateway carrying a W3C
``traceparent``; Jaeger's query API must then hold one trace with that id: the gateway's
server span (a child of the caller's span), the client's span, and the worker's span of the
request's execution, with its epoch, worker and request id — linked to the span of that
epoch on the worker, in the epoch's own trace, under the coordinator's span of the same
epoch.

The same cluster runs (``tests.runtime.traced_shop``) a transfer whose root runs on one
worker and calls a key of the other — a span on each worker in the one trace, the callee's
``call`` span a child of the root's ``execute`` span — bursts of transfers into one hot key
until one conflicts and shows its ``fallback``/``re-run`` span, and a function whose
``ctx.run`` effect is a span of its request, whose ``after_commit`` action and timer are
spans linked to it."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster, services
from launcher.services import Endpoints, ServiceError
from sfaas.runtime.partitioning import default_owners, partition_of
from tests.gateway.conftest import app_cluster, gateway
from tests.runtime.test_recovery import PARTITIONS

#: the shop of the gateway's tests, with a transfer and a function touching the world
APP = "tests.runtime.traced_shop:app"
#: bursts of concurrent transfers into one key sent at most, until one of them conflicts
BURSTS = 8

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
    """The trace's spans once it holds the gateway's and a worker's request span (or what
    it holds after :data:`ARRIVAL` seconds; a worker's span of a call the request made
    comes before, at the call)."""
    deadline = time.monotonic() + ARRIVAL
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        trace = _trace(jaeger, trace_id)
        spans = _spans(trace) if trace else []
        if "sfaas-gateway" in {s["service"] for s in spans} \
                and any(s["service"].startswith("sfaas-worker-")
                        and s["operationName"].startswith("execute ") for s in spans):
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


def _parent(trace_id: str) -> dict[str, str]:
    """A caller's sampled ``traceparent`` header in trace ``trace_id``."""
    return {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}


def _names(spans: list[dict[str, Any]]) -> set[str]:
    return {s["operationName"] for s in spans}


def _wait_until(jaeger: Endpoints, trace_id: str,
                done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The trace's spans once ``done`` says they are all there (or what Jaeger holds after
    :data:`ARRIVAL` seconds)."""
    deadline = time.monotonic() + ARRIVAL
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        trace = _trace(jaeger, trace_id)
        spans = _spans(trace) if trace else []
        if spans and done(spans):
            return spans
        time.sleep(0.3)
    return spans


def _worker_key(worker: int, prefix: str) -> str:
    """A key of the operator ``accounts`` on worker ``worker`` of a new 2-worker cluster."""
    owners = default_owners(PARTITIONS, 2)
    return next(k for k in (f"{prefix}{i}" for i in range(1000))
                if owners[partition_of("accounts", k, PARTITIONS)] == worker)


def _linked(jaeger: Endpoints, prefix: str, span: dict[str, Any]) -> dict[str, Any] | None:
    """A worker's span whose operation starts with ``prefix`` and that links to ``span``
    (in a trace of its own); None: none within :data:`ARRIVAL` seconds."""
    deadline = time.monotonic() + ARRIVAL
    while time.monotonic() < deadline:
        for service in ("sfaas-worker-0", "sfaas-worker-1"):
            with urllib.request.urlopen(f"{jaeger.jaeger_url}/api/services/{service}/operations",
                                        timeout=5) as resp:
                operations = json.loads(resp.read())["data"] or []
            for op in (o for o in operations if o.startswith(prefix)):
                query = urllib.parse.urlencode({"service": service, "operation": op,
                                                "limit": 50})
                with urllib.request.urlopen(f"{jaeger.jaeger_url}/api/traces?{query}",
                                            timeout=5) as resp:
                    traces = json.loads(resp.read())["data"] or []
                for trace in traces:
                    for sp in _spans(trace):
                        if (span["traceID"], span["spanID"]) in _refs(sp, "FOLLOWS_FROM"):
                            return sp
        time.sleep(0.5)
    return None


def _settled(spans: list[dict[str, Any]]) -> bool:
    """Whether a transfer's trace holds its request's span and, if it re-ran, the spans of
    its re-runs or fallback phase."""
    executed = [s for s in spans if s["operationName"] == "execute accounts.transfer"]
    if not executed:
        return False
    tags = executed[0]["tags"]
    return not (tags["sfaas.attempts"] or tags["sfaas.fallback"]) \
        or bool(_names(spans) & {"re-run", "fallback"})


def _conflict(gw: Any, jaeger: Endpoints, hot: str) -> list[dict[str, Any]]:
    """The spans of a transfer into ``hot`` that conflicted with another one: bursts of
    six at once until one did (at most :data:`BURSTS`); [] if none did."""
    for burst in range(BURSTS):
        ids = [secrets.token_hex(16) for _ in range(6)]
        with ThreadPoolExecutor(len(ids)) as pool:
            answers = list(pool.map(
                lambda i, b=burst, t=ids: gw.call("accounts", f"burst{b}-{i}", "transfer", hot, 1,
                                                  headers=_parent(t[i])), range(len(ids))))
        assert all(status == 200 for status, _ in answers), answers
        for trace_id in ids:
            spans = _wait_until(jaeger, trace_id, _settled)
            if _names(spans) & {"re-run", "fallback"}:
                return spans
    return []


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
        with app_cluster(kafka, minio, tmp_path, APP) as cs, \
                gateway(cs, tmp_path, app=APP) as gw:
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
            transfer, audited, conflicted = _transfer_world_and_conflict(gw, jaeger)

    _assert_a_transfer_is_a_span_on_each_worker(*transfer)
    _assert_the_world_in_the_trace(*audited)
    _assert_a_conflict_shows_its_rerun(conflicted)

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


def _transfer_world_and_conflict(gw: Any, jaeger: Endpoints) -> tuple[Any, Any, Any]:
    """What the cluster's traces show of a transfer from a key of worker 0 to one of worker
    1 (its spans, its epoch's), of a function with an effect, an action and a timer (its
    spans, the action's span, the timer's), and of a transfer that conflicted."""
    transfer_id = secrets.token_hex(16)
    assert gw.call("accounts", _worker_key(0, "from-"), "transfer", _worker_key(1, "to-"), 2,
                   headers=_parent(transfer_id)) == (200, {"result": -2})
    transfer = _wait_until(jaeger, transfer_id, lambda sp: {
        "execute accounts.transfer", "call accounts.deposit"} <= _names(sp))
    transfer_epoch = _epoch_spans(jaeger, transfer)
    audited_id = secrets.token_hex(16)
    assert gw.call("accounts", "audit-1", "audited", 3, headers=_parent(audited_id)) \
        == (200, {"result": 3})
    audited = _wait_until(jaeger, audited_id, lambda sp: {
        "execute accounts.audited", "effect _note"} <= _names(sp))
    audit = next((s for s in audited if s["operationName"] == "execute accounts.audited"), None)
    action = _linked(jaeger, "after_commit ", audit) if audit else None
    timer = _linked(jaeger, "timer ", audit) if audit else None
    conflicted = _conflict(gw, jaeger, _worker_key(1, "hot-"))
    return (transfer, transfer_epoch), (audited, action, timer), conflicted


def _assert_a_transfer_is_a_span_on_each_worker(spans: list[dict[str, Any]],
                                                epoch_spans: list[dict[str, Any]]) -> None:
    """The root's span on worker 0, the call's on worker 1, a child of it; the root's epoch
    span has its epoch-log write."""
    brief = [(s["service"], s["operationName"], s["references"]) for s in spans]
    assert len({s["traceID"] for s in spans}) == 1, brief
    (root,) = [s for s in spans if s["operationName"] == "execute accounts.transfer"]
    calls = [s for s in spans if s["operationName"] == "call accounts.deposit"
             and s["service"].startswith("sfaas-worker-")]  # (not a client's span)
    # (slot 0 and 1; a process's service name is its own, whichever slot it took)
    assert (root["tags"]["sfaas.worker"], root["tags"]["sfaas.outcome"]) == (0, "committed")
    assert [(c["tags"]["sfaas.worker"], c["service"] != root["service"]) for c in calls] == \
        [(1, True)], brief
    (call,) = calls
    assert _refs(call, "CHILD_OF") == [(root["traceID"], root["spanID"])], brief
    assert (call["tags"]["sfaas.epoch"], call["tags"]["sfaas.tid"], call["tags"]["sfaas.worker"],
            call["tags"]["sfaas.caller"]) == (root["tags"]["sfaas.epoch"],
                                              root["tags"]["sfaas.tid"], 1, 0), call["tags"]
    assert {"sfaas-worker-0", "sfaas-worker-1"} <= {s["service"] for s in spans}
    # its worker's span of the epoch it committed in: the phases and the epoch-log write
    _assert_epoch_trace(epoch_spans, root)
    [(_, linked)] = _refs(root, "FOLLOWS_FROM")
    phases = {s["operationName"] for s in epoch_spans if _refs(s, "CHILD_OF")
              and _refs(s, "CHILD_OF")[0][1] == linked}
    assert {"execute", "commit", "epoch-log write"} <= phases, phases


def _assert_the_world_in_the_trace(spans: list[dict[str, Any]], action: dict[str, Any] | None,
                                   timer: dict[str, Any] | None) -> None:
    """The effect is a child of its request's span, which re-ran once it finished; the
    action and the timer, in traces of their own, link to it."""
    brief = [(s["service"], s["operationName"]) for s in spans]
    executed = [s for s in spans if s["operationName"] == "execute accounts.audited"]
    effects = [s for s in spans if s["operationName"] == "effect _note"]
    assert len(executed) == 1 and len(effects) == 1, brief
    root, effect = executed[0], effects[0]
    assert _refs(effect, "CHILD_OF") == [(root["traceID"], root["spanID"])]
    assert effect["duration"] >= 0 and effect["tags"]["sfaas.effect_key"].startswith(
        root["tags"]["sfaas.request_id"]), effect["tags"]
    reruns = [s for s in spans if s["operationName"] == "re-run"]
    assert [(r["tags"]["sfaas.after"], _refs(r, "CHILD_OF")) for r in reruns] == \
        [("effect", [(root["traceID"], root["spanID"])])], brief
    assert action is not None and action["operationName"] == \
        "after_commit tests.runtime.traced_shop:mail", action
    assert action["traceID"] != root["traceID"]
    assert timer is not None and timer["operationName"] == "timer accounts", timer


def _assert_a_conflict_shows_its_rerun(spans: list[dict[str, Any]]) -> None:
    """A transfer that conflicted has its fallback phase (or re-runs) under its span."""
    assert spans, f"no transfer of {BURSTS} bursts into one key conflicted"
    (root,) = [s for s in spans if s["operationName"] == "execute accounts.transfer"]
    assert root["tags"]["sfaas.fallback"] or root["tags"]["sfaas.attempts"] > 0, root["tags"]
    again = [s for s in spans if s["operationName"] in ("re-run", "fallback")]
    assert again and all(_refs(s, "CHILD_OF") == [(root["traceID"], root["spanID"])]
                         for s in again), again
    assert all(isinstance(s["tags"]["sfaas.epoch"], int)
               and isinstance(s["tags"]["sfaas.attempt"], int) for s in again), again
