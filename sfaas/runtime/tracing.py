"""OpenTelemetry traces of a process: off unless the setting ``tracing`` is on (issue 50).

Every process calls :func:`setup` once as it starts, with its settings and its name
(``client``, ``gateway``, ``worker-0``, ``coordinator``). Off — the default — it imports
nothing and :data:`ON` stays False; instrumented code tests that one module-level flag
(``if tracing.ON:``) and does nothing else, so tracing off costs one attribute read.

On, the OpenTelemetry SDK is configured by the standard variables, as any OpenTelemetry
program is: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
OTLP over HTTP/protobuf, default ``http://localhost:4318``), ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` (default ``parentbased_always_on``), ``OTEL_SERVICE_NAME``
(default ``sfaas-<process>``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` (the batch
span processor's delay and queue) and ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console`` or
``none``). Spans are exported in the background and flushed when the process exits.

A trace context travels as a W3C ``traceparent``: the HTTP header at the gateway, the
request record's ``traceparent`` field from a client to the worker
(``sfaas/runtime/FORMAT.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.runtime.tracing")

__all__ = ["ON", "setup", "traceparent", "span", "record", "current_ids", "shutdown"]

#: Whether this process traces (set once by :func:`setup`). Read it as ``tracing.ON``
#: (the module's attribute, not a copy imported by name).
ON = False
#: The W3C trace context headers a carrier may hold.
HEADERS = (b"traceparent", b"tracestate")
#: Values of ``OTEL_TRACES_EXPORTER`` this module knows.
EXPORTERS = ("otlp", "console", "none")

_tracer: Any = None
_provider: Any = None
_propagator: Any = None


def setup(settings: Settings, process: str) -> bool:
    """Start tracing in this process if ``settings.tracing`` is on; whether it traces.

    ``process`` names it (``worker-0``): the service name is ``sfaas-<process>`` unless
    ``OTEL_SERVICE_NAME`` says otherwise, and ``sfaas.process`` is ``process`` either way.
    A second call (a gateway's client, a test starting several clients) changes nothing.
    """
    global ON, _tracer, _provider, _propagator
    if not settings.tracing or ON:
        return ON
    exporter_name = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if exporter_name not in EXPORTERS:
        from sfaas.errors import ConfigError

        raise ConfigError(f"OTEL_TRACES_EXPORTER must be one of {', '.join(EXPORTERS)} for "
                          f"sfaas, got {exporter_name!r:.40}")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    attributes = {"sfaas.process": process, "sfaas.namespace": settings.namespace}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"sfaas-{process}"
    # (the sampler comes from OTEL_TRACES_SAMPLER: TracerProvider reads it)
    provider = TracerProvider(resource=Resource.create(attributes))
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif exporter_name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    _provider, _tracer = provider, provider.get_tracer("sfaas")
    _propagator = TraceContextTextMapPropagator()
    ON = True
    log.info("tracing on: service %s, exporter %s", provider.resource.attributes.get(
        "service.name"), exporter_name)
    return True


def shutdown() -> None:
    """Export the spans still queued and stop tracing (tests; a process exiting does this
    by itself)."""
    global ON, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ON, _tracer, _provider = False, None, None


def _context(carrier: Mapping[str, str] | None) -> Any:
    return None if carrier is None else _propagator.extract(carrier)


def carrier_of(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace context headers among ASGI ``headers`` (lower-case names), as a carrier."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in HEADERS}


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (None: there is none, or it is not
    sampled-in-context, e.g. tracing is off)."""
    if not ON:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def span(name: str, kind: str = "internal", carrier: Mapping[str, str] | None = None,
         attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A current span ``name`` around the block (``kind``: ``internal``, ``server``,
    ``client``); its parent is the trace context in ``carrier`` (headers: ``traceparent``,
    ``tracestate``) when given, else the current span. Only when :data:`ON`."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(name, context=_context(carrier),
                                       kind=SpanKind[kind.upper()],
                                       attributes=dict(attributes or {})) as current:
        yield current


def record(name: str, parent: str, start_ns: int, attributes: Mapping[str, Any],
           error: str | None = None) -> None:
    """A span ``name`` that began at ``start_ns`` (``time.time_ns()``) and ends now, a
    server span under the W3C ``traceparent`` ``parent`` (what a worker did for a request
    of that trace); ``error``: its status is an error with that description. Only when
    :data:`ON`."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    done = _tracer.start_span(name, context=_context({"traceparent": parent}),
                              kind=SpanKind.SERVER, start_time=start_ns,
                              attributes=dict(attributes))
    if error is not None:
        done.set_status(Status(StatusCode.ERROR, error))
    done.end()


def current_ids() -> tuple[str, str] | None:
    """``(trace id, span id)`` of the current span in hex (None: none, or tracing off) —
    what a log line carries to find its trace."""
    if not ON:
        return None
    from opentelemetry.trace import get_current_span

    ctx = get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
