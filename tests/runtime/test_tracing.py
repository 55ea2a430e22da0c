"""Tracing (issue 50) without a cluster: off costs no import; on, the W3C trace context
goes from a span into a request record and back out of it; the JSON log lines name the
current span; the request record stays readable by and for peers that predate it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from sfaas.errors import BadRequest, ConfigError
from sfaas.runtime import wire
from sfaas.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter of this checkout; its standard output."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OTEL_", "SFAAS_TRACING", "SFAAS_LOG_FORMAT"))}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_tracing_off_imports_no_opentelemetry_module() -> None:
    loaded = json.loads(_python(
        "import sys, json\n"
        "import sfaas, sfaas.client, gateway.app, worker.epochs, launcher.commands\n"
        "from sfaas.runtime import tracing\n"
        "from sfaas.runtime.settings import Settings\n"
        "from sfaas.client import Client\n"
        "assert tracing.setup(Settings.load(), 'probe') is False\n"
        "Client('bank')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))",
        SFAAS_TRACING="0").splitlines()[-1])
    assert loaded == []


def test_tracing_on_carries_the_callers_trace_into_the_request_and_the_log_line() -> None:
    out = _python(
        "import logging, sys, time\n"
        "from sfaas.runtime import tracing, wire\n"
        "from sfaas.runtime.jsonlog import JsonLines\n"
        "from sfaas.runtime.settings import Settings\n"
        "h = logging.StreamHandler(sys.stdout); h.setFormatter(JsonLines())\n"
        "logging.basicConfig(level=logging.INFO, handlers=[h])\n"
        "assert tracing.setup(Settings.load(), 'probe') is True\n"
        f"with tracing.span('POST /v1', 'server', {{'traceparent': {TRACEPARENT!r}}}):\n"
        "    tp = tracing.traceparent()\n"
        "    rec = wire.Request('r1', 'op', 'k', 'f', [], 0, 1.0, None, tp).encode()\n"
        "    logging.getLogger('probe').info('sent', extra={'worker': 3})\n"
        "req = wire.Request.decode(rec)\n"
        "tracing.record('execute op.f', req.traceparent, time.time_ns(), {'sfaas.epoch': 1})\n"
        "print('TP', req.traceparent)\n",
        SFAAS_TRACING="1", OTEL_TRACES_EXPORTER="none")
    line = json.loads(next(x for x in out.splitlines() if '"sent"' in x))
    tp = next(x for x in out.splitlines() if x.startswith("TP ")).split()[1]
    trace_id = TRACEPARENT.split("-")[1]
    # the span joined the caller's trace, and the request record carries it on
    assert tp.split("-")[1] == trace_id and tp.split("-")[2] != TRACEPARENT.split("-")[2]
    assert (line["trace_id"], line["span_id"]) == (trace_id, tp.split("-")[2])
    assert (line["message"], line["level"], line["logger"], line["worker"]) == \
        ("sent", "INFO", "probe", 3)


def test_a_request_without_a_trace_context_encodes_as_before() -> None:
    plain = wire.Request("r", "op", "k", "f", [1], 2, 3.0)
    keyed = wire.Request("r", "op", "k", "f", [1], 2, 3.0, "idem")
    assert msgpack.unpackb(plain.encode()) == ["r", "op", "k", "f", [1], 2, 3.0]
    assert msgpack.unpackb(keyed.encode()) == ["r", "op", "k", "f", [1], 2, 3.0, "idem"]
    traced = wire.Request("r", "op", "k", "f", [1], 2, 3.0, None, TRACEPARENT)
    assert msgpack.unpackb(traced.encode())[7:] == [None, TRACEPARENT]
    for req in (plain, keyed, traced):
        assert wire.Request.decode(req.encode()) == req


@pytest.mark.parametrize("bad", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    TRACEPARENT + "x",  # more, without the '-' a later version puts first
    "0" * 300, 17,
])
def test_a_malformed_trace_context_is_a_bad_request_naming_it(bad: object) -> None:
    record = msgpack.packb(["r", "op", "k", "f", [], 0, 1.0, None, bad])
    with pytest.raises(BadRequest, match="traceparent must be a W3C traceparent"):
        wire.Request.decode(record)
    later = wire.Request.decode(msgpack.packb(["r", "op", "k", "f", [], 0, 1.0, None,
                                               TRACEPARENT + "-more"]))
    assert later.traceparent == TRACEPARENT + "-more"


def test_the_log_format_setting_is_checked() -> None:
    assert Settings.load(env={"SFAAS_LOG_FORMAT": "json"}).log_format == "json"
    assert Settings.load(env={"SFAAS_TRACING": "1"}).tracing is True
    with pytest.raises(ConfigError, match="log_format .SFAAS_LOG_FORMAT. must be 'text' or"):
        Settings.load(env={"SFAAS_LOG_FORMAT": "yaml"})


SPANS = (
    "import json, time\n"
    "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
    "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
    "from sfaas.runtime import tracing, wire\n"
    "from sfaas.runtime.settings import Settings\n"
    "assert tracing.setup(Settings.load(), 'probe')\n"
    "mem = InMemorySpanExporter()\n"
    "tracing._provider.add_span_processor(SimpleSpanProcessor(mem))\n"
    "def dump():\n"
    "    for s in mem.get_finished_spans():\n"
    "        print(json.dumps({'name': s.name, 'trace': f'{s.context.trace_id:032x}',\n"
    "            'span': f'{s.context.span_id:016x}',\n"
    "            'parent': s.parent and f'{s.parent.span_id:016x}',\n"
    "            'links': [f'{x.context.span_id:016x}' for x in s.links],\n"
    "            'attrs': dict(s.attributes)}))\n"
)


def _spans(code: str, **env: str) -> list[dict[str, object]]:
    out = _python(SPANS + code + "dump()\n", SFAAS_TRACING="1", OTEL_TRACES_EXPORTER="none",
                  **env)
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_a_slow_or_aborted_request_keeps_its_span_though_its_trace_was_not_sampled() -> None:
    unsampled = TRACEPARENT[:-2] + "00"
    spans = _spans(
        "from sfaas.runtime.txn.loop import Fate\n"
        "from worker.state import Pending\n"
        "from worker.traces import EpochTraces\n"
        "from coordinator import traces\n"
        "traces.configure('ns', 0.1)\n"
        "def fate(rid, ok, age, tp):\n"
        "    req = wire.Request(rid, 'accounts', 'k', 'f', [], 0, time.time() - age, None, tp)\n"
        "    return Fate(7, Pending(req, partition=0), ok, 1 if ok else ('Abort', 'no'))\n"
        "t = EpochTraces('ns', 0.1)\n"
        "t.began(5, 1234.5); t.reported(5); t.committing(5)\n"
        f"t.committed(5, [fate('fast', True, 0.001, {unsampled!r}),\n"
        f"               fate('slow', True, 0.5, {unsampled!r}),\n"
        f"               fate('aborted', False, 0.001, {unsampled!r}),\n"
        f"               fate('head', True, 0.001, {TRACEPARENT!r})], False, 1)\n"
        "n = time.time_ns()\n"
        "traces.epoch_span(6, 99.0, (n, n, n), {})\n"  # (a fast epoch the sampler drops)
        "print('IDS', *tracing.epoch_ids('ns', 5, 1234.5))\n",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
    requests = {s["attrs"]["sfaas.request_id"]: s for s in spans
                if s["name"] == "execute accounts.f"}
    assert sorted(requests) == ["aborted", "head", "slow"]
    assert {k: s["attrs"]["sfaas.kept"] for k, s in requests.items()} == \
        {"aborted": "aborted", "head": "head", "slow": "slow"}
    epoch = [s for s in spans if s["name"] == "epoch"]
    assert len(epoch) == 1 and epoch[0]["attrs"]["sfaas.epoch"] == 5  # (not epoch 6)
    assert all(s["links"] == [epoch[0]["span"]] for s in requests.values())
    assert all(s["trace"] == TRACEPARENT.split("-")[1] for s in requests.values())
    children = sorted(s["name"] for s in spans if s["parent"] == epoch[0]["span"])
    assert children == ["commit", "execute"]


def test_the_coordinators_and_a_workers_epoch_spans_are_one_trace() -> None:
    spans = _spans(
        "from sfaas.runtime.txn.loop import Fate\n"
        "from worker.traces import EpochTraces\n"
        "from coordinator import traces\n"
        "traces.configure('ns', 0.1)\n"
        "n = time.time_ns()\n"
        "traces.epoch_span(5, 1234.5, (n, n + 1000, n + 2000), {'sfaas.roots': 3})\n"
        "t = EpochTraces('ns', 0.1)\n"
        "t.began(5, 1234.5); t.committed(5, [], False, 1)\n")
    by = {(s["name"], s["parent"] is None): s for s in spans}
    root, worker = by[("epoch", True)], by[("epoch", False)]
    assert worker["trace"] == root["trace"] and worker["parent"] == root["span"]
    assert (root["attrs"]["sfaas.epoch"], worker["attrs"]["sfaas.epoch"]) == (5, 5)
    assert worker["attrs"]["sfaas.worker"] == 1
    assert {s["name"] for s in spans if s["parent"] == root["span"]} >= {"barrier", "commit"}


def test_a_recovery_is_kept_with_a_span_per_step_whatever_the_sampler() -> None:
    spans = _spans(
        "from coordinator.traces import steps_span\n"
        "n = time.time_ns()\n"
        "steps_span('recovery', n, [('detect+restart', n, n + 10), ('restore', n + 10, n + 20),\n"
        "                           ('replay', n + 20, n + 30)], {'sfaas.attempt': 2})\n",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
    (root,) = [s for s in spans if s["parent"] is None]
    assert root["name"] == "recovery" and root["attrs"] == {"sfaas.attempt": 2}
    assert sorted(s["name"] for s in spans if s["parent"] == root["span"]) == \
        ["detect+restart", "replay", "restore"]


def _call(traceparent: str | None = None) -> wire.Call:
    return wire.Call(3, 1, 9, 42, 1.5, "accounts", "k", "deposit", [5], 1, 0, False, "r1", {},
                     traceparent)


def test_a_call_without_a_trace_context_has_no_more_bytes_and_decodes_as_none() -> None:
    plain = wire.encode_frame([_call()])
    assert len(msgpack.unpackb(plain)[0]) == 1 + 14  # (the tag and the fields before it)
    assert wire.decode_frame(plain) == [_call()]
    assert wire.decode_frame(plain)[0].traceparent is None
    traced = wire.encode_frame([_call(TRACEPARENT)])
    assert msgpack.unpackb(traced)[0][-1] == TRACEPARENT
    assert wire.decode_frame(traced) == [_call(TRACEPARENT)]
    # (the channels pack message by message: the same bytes)
    assert wire.join_frame([wire.encode_message(_call())]) == plain


@pytest.mark.parametrize("bad", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    TRACEPARENT + "-" + "0" * 250,  # longer than MAX_TRACEPARENT
    "x" * 55,
])
def test_a_call_with_a_malformed_or_too_long_trace_context_is_refused_naming_it(
        bad: str) -> None:
    frame = msgpack.packb([[21, *msgpack.unpackb(wire.encode_frame([_call()]))[0][1:], bad]])
    with pytest.raises(wire.ProtocolError, match="Call.traceparent must be a W3C traceparent"):
        wire.decode_frame(frame)


def test_a_call_with_a_trace_context_of_the_wrong_type_or_too_many_fields_is_refused() -> None:
    fields = msgpack.unpackb(wire.encode_frame([_call()]))[0][1:]
    with pytest.raises(wire.ProtocolError, match="Call.traceparent has the wrong type"):
        wire.decode_frame(msgpack.packb([[21, *fields, 17]]))
    with pytest.raises(wire.ProtocolError, match=r"Call needs 15 fields \(the last 1 optional\)"):
        wire.decode_frame(msgpack.packb([[21, *fields, TRACEPARENT, "more"]]))
    with pytest.raises(wire.ProtocolError, match=r"Call needs 15 fields"):
        wire.decode_frame(msgpack.packb([[21, *fields[:-1]]]))


def test_a_requests_calls_reruns_fallback_and_effects_are_spans_under_its_span() -> None:
    spans = _spans(
        "from sfaas.runtime.txn.loop import Fate\n"
        "from worker.state import Pending\n"
        "from worker.traces import EpochTraces, TraceContexts, WorldSpans, call_span\n"
        f"req = wire.Request('r1', 'accounts', 'k', 'transfer', [], 0, time.time(), None,\n"
        f"                   {TRACEPARENT!r})\n"
        "item = Pending(req, partition=0)\n"
        "t, ctx = EpochTraces('ns', 0.1), TraceContexts()\n"
        "t.timers = ctx.timers\n"
        # epoch 5: the request conflicts, re-runs in the fallback phase, deviates: later
        "t.began(5, 100.0); ctx.begin([(7, item)], 0); n = time.time_ns()\n"
        "t.logged(5, n); t.reported(5); t.committing(5)\n"
        "msg = wire.Call(5, 0, 1, 7, 100.0, 'accounts', 'bob', 'deposit', [], 1, 0, False,\n"
        "                'r1', {}, ctx.of[7])\n"
        "call_span(msg, time.time_ns(), True, 1, 1)\n"
        "world = WorldSpans(ctx, lambda: 0)\n"
        "world.effect_ran(world.effect_context(7), 'r1:accounts:k:0', 'notify', n,\n"
        "                 (False, ['OSError', 'down']))\n"
        "ctx.on_record('\\x00a7.0\\x00k', b'x')\n"
        "world.action_ran(world.action_context('\\x00a7.0\\x00k'), 'mail', n, 2)\n"
        "t.phase(5, time.time_ns(), time.time_ns())\n"
        "item.attempts = 1\n"
        "t.committed(5, [], False, 0, [(7, item)], {7: 3}, 0)\n"
        # epoch 6: it re-runs, conflicts again and commits in the fallback phase
        "t.began(6, 101.0); t.reported(6); t.committing(6)\n"
        "t.phase(6, time.time_ns(), time.time_ns())\n"
        "item.attempts = 1\n"
        "t.committed(6, [Fate(7, item, True, 1, fallback=True)], False, 0, [(7, item)],\n"
        "            {7: 3}, 0)\n"
        "print('SPAN', f'{tracing.request_span_id(\"r1\", 0):016x}')\n")
    by_name: dict[str, list[dict[str, object]]] = {}
    for s in spans:
        by_name.setdefault(str(s["name"]), []).append(s)
    (execute,) = by_name["execute accounts.transfer"]
    trace_id = TRACEPARENT.split("-")[1]
    assert execute["trace"] == trace_id and execute["attrs"]["sfaas.first_epoch"] == 5
    # the call served on the other worker, the effect: children of the request's span
    (call,) = by_name["call accounts.deposit"]
    assert (call["trace"], call["parent"]) == (trace_id, execute["span"])
    assert (call["attrs"]["sfaas.epoch"], call["attrs"]["sfaas.tid"]) == (5, 7)
    (effect,) = by_name["effect notify"]
    assert effect["parent"] == execute["span"]
    # an action runs in a trace of its own, linked to the request's span
    (action,) = by_name["after_commit mail"]
    assert action["trace"] != trace_id and action["links"] == [execute["span"]]
    # the re-run (epoch 6) and the two fallback phases it ran in, under it
    (rerun,) = by_name["re-run"]
    assert rerun["parent"] == execute["span"]
    assert (rerun["attrs"]["sfaas.epoch"], rerun["attrs"]["sfaas.attempt"]) == (6, 1)
    fallbacks = sorted((s["attrs"]["sfaas.epoch"], s["attrs"]["sfaas.outcome"])
                       for s in by_name["fallback"] if s["parent"] == execute["span"])
    assert fallbacks == [(5, "again later"), (6, "committed")]
    # the worker's epoch span has the epoch-log write and the fallback phase
    epoch5 = next(s for s in by_name["epoch"] if s["attrs"]["sfaas.epoch"] == 5)
    assert {str(s["name"]) for s in spans if s["parent"] == epoch5["span"]} == \
        {"execute", "commit", "epoch-log write", "fallback phase"}
