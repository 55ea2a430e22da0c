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
request record's ``traceparent`` field from a client to the worker, a peer ``Call``'s from
the worker running the request to the workers it calls (``sfaas/runtime/FORMAT.md``).

**Epoch traces.** Each epoch is a trace of its own whose ids every process derives from
what it already knows of the epoch (:func:`epoch_ids`: the namespace, the epoch number and
its ``now``, which the ``Begin`` carries): the coordinator's epoch span is the trace's root,
each worker's epoch span its child — no id travels on the wire, and the sampler (by trace
id) keeps or drops an epoch alike in every process. A request's span links to the epoch
span of the worker that ran it.

**Tail sampling.** A span recorded after the fact (:func:`record`) may be *kept* although
the sampler dropped its trace: a slow or aborted request, a slow epoch (the caller decides,
knowing the outcome; the sampler here then says yes for that one span).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.runtime.tracing")

__all__ = ["ON", "setup", "traceparent", "span", "record", "start", "end", "sampled", "epoch_ids",
           "epoch_parent", "root_keeps", "is_recording", "current_ids", "shutdown",
           "request_span_id", "child_of", "link_to"]

#: Whether this process traces (set once by :func:`setup`). Read it as ``tracing.ON``
#: (the module's attribute, not a copy imported by name).
ON = False
#: The W3C trace context headers a carrier may hold.
HEADERS = (b"traceparent", b"tracestate")
#: Values of ``OTEL_TRACES_EXPORTER`` this module knows.
EXPORTERS = ("otlp", "console", "none")

#: what an epoch's trace ids hash (its number and its Begin's now)
_EPOCH = struct.Struct("<qd")

_tracer: Any = None
_provider: Any = None
_propagator: Any = None
#: the sampler wrapping the configured one (``keep``: record the next span regardless)
_tail: Any = None
#: the id generator (``force``: the next root span's trace and span ids)
_ids: Any = None


def setup(settings: Settings, process: str) -> bool:
    """Start tracing in this process if ``settings.tracing`` is on; whether it traces.

    ``process`` names it (``worker-0``): the service name is ``sfaas-<process>`` unless
    ``OTEL_SERVICE_NAME`` says otherwise, and ``sfaas.process`` is ``process`` either way.
    A second call (a gateway's client, a test starting several clients) changes nothing.
    """
    global ON, _tracer, _provider, _propagator, _tail, _ids
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
    # (the sampler comes from OTEL_TRACES_SAMPLER, as the SDK reads it, wrapped for tail
    # sampling; the ids are random but for the epochs' root spans)
    tail, ids = _sampler_and_ids()
    provider = TracerProvider(resource=Resource.create(attributes), sampler=tail,
                              id_generator=ids)
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif exporter_name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    _provider, _tracer, _tail, _ids = provider, provider.get_tracer("sfaas"), tail, ids
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


def record(name: str, parent: str | None, start_ns: int, attributes: Mapping[str, Any],
           error: str | None = None, *, keep: bool = False, end_ns: int | None = None,
           links: Iterable[Any] = (), kind: str = "server", under: Any = None,
           span_id: int | None = None) -> Any:
    """A span ``name`` that began at ``start_ns`` (``time.time_ns()``) and ends at
    ``end_ns`` (default now); its parent the W3C ``traceparent`` ``parent`` (what a worker
    did for a request of that trace), or ``under`` (a span or span context of this
    process), or none (a new trace). ``error``: its status is an error with that
    description; ``keep``: recorded even if the sampler would drop it (tail sampling);
    ``links``: span contexts it links to. Returns the span (ended), whose
    ``get_span_context()`` others may link to or parent under; ``span_id``: its span id
    (:func:`request_span_id`, which spans recorded before it were parented under), else a
    random one. Only when :data:`ON`."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    if span_id is not None:
        _ids.force = (0, span_id)  # (a child takes its parent's trace id: only the span id)
    try:
        done = _start(name, parent, under, start_ns, attributes, keep, links,
                      SpanKind[kind.upper()])
    finally:
        _ids.force = None
    if error is not None:
        done.set_status(Status(StatusCode.ERROR, error))
    done.end(end_ns)
    return done


def start(name: str, start_ns: int, attributes: Mapping[str, Any], *, under: Any = None,
          keep: bool = False, ids: tuple[int, int] | None = None) -> Any:
    """A span ``name`` begun at ``start_ns``, not ended (the caller ends it, with
    ``span.end(end_ns)``, after its children): a child of ``under`` (a span, or a span
    context), else a root — with the trace and span ids ``ids`` when given
    (:func:`epoch_ids`). ``keep``: see :func:`record`. Only when :data:`ON`."""
    from opentelemetry.trace import SpanKind

    if ids is not None:
        _ids.force = ids
    try:
        return _start(name, None, under, start_ns, attributes, keep, (), SpanKind.INTERNAL)
    finally:
        _ids.force = None


def _start(name: str, parent: str | None, under: Any, start_ns: int,
           attributes: Mapping[str, Any], keep: bool, links: Iterable[Any], kind: Any) -> Any:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, NonRecordingSpan, set_span_in_context

    if parent is not None:
        context = _context({"traceparent": parent})
    elif under is not None:
        span_ = under if hasattr(under, "get_span_context") else NonRecordingSpan(under)
        context = set_span_in_context(span_)
    else:  # (a new trace, whatever span is current)
        context = Context()
    _tail.keep = keep
    try:
        return _tracer.start_span(name, context=context, kind=kind, start_time=start_ns,
                                  attributes=dict(attributes),
                                  links=[Link(c) for c in links if c is not None])
    finally:
        _tail.keep = False


def end(span_: Any, end_ns: int | None = None, error: str | None = None) -> None:
    """End a span from :func:`start` (at ``end_ns``, default now); ``error``: its status
    is an error with that description."""
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span_.set_status(Status(StatusCode.ERROR, error[:200]))
    span_.end(end_ns)


def sampled(traceparent_: str | None) -> bool:
    """Whether a W3C ``traceparent`` says its trace is sampled (its flags' lowest bit)."""
    # (version 00's flags end at 55; a later version may append fields after them)
    return traceparent_ is not None and len(traceparent_) >= 55 \
        and traceparent_[54] in "13579bdf"


def request_span_id(rid: str, recovery: int) -> int:
    """The span id of a worker's ``execute`` span of request ``rid`` (made after its
    commit), known before it is made: the spans of its calls, re-runs and effects on any
    worker are its children (:func:`child_of`). ``recovery``: the worker's recovery count
    (a replay's span is another span)."""
    digest = hashlib.blake2b(f"{recovery}\x00{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def child_of(traceparent_: str, span_id: int) -> str:
    """The ``traceparent`` of span ``span_id`` in the (sampled) trace of ``traceparent_``."""
    return f"00-{traceparent_[3:35]}-{span_id:016x}-01"


def link_to(traceparent_: str) -> Any:
    """The span context a ``traceparent`` names, to link a span to (:func:`record`)."""
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(int(traceparent_[3:35], 16), int(traceparent_[36:52], 16),
                       is_remote=True, trace_flags=TraceFlags(int(traceparent_[53:55], 16)))


def epoch_ids(namespace: str, epoch: int, now: float) -> tuple[int, int]:
    """``(trace id, root span id)`` of epoch ``epoch`` begun at ``now`` (its ``Begin``'s):
    the same in every process that knows the epoch, and for its replay."""
    digest = hashlib.blake2b(_EPOCH.pack(epoch, now), digest_size=24,
                             key=namespace.encode()[:64]).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


def epoch_parent(namespace: str, epoch: int, now: float) -> Any:
    """The span context of the coordinator's span of that epoch (:func:`epoch_ids`), to
    parent a worker's epoch span under; sampled as the sampler decides for the trace."""
    from opentelemetry.trace import SpanContext, TraceFlags

    trace_id, span_id = epoch_ids(namespace, epoch, now)
    flags = TraceFlags.SAMPLED if _tail.root_keeps(trace_id) else TraceFlags.DEFAULT
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def root_keeps(trace_id: int) -> bool:
    """Whether the sampler keeps a new trace with this id (an epoch's: :func:`epoch_ids`) —
    asked first, so an epoch nobody keeps costs no span object."""
    return bool(_tail.root_keeps(trace_id))


def is_recording(span_: Any) -> bool:
    """Whether ``span_`` (from :func:`start`/:func:`record`) is recorded (exported)."""
    return bool(span_.get_span_context().trace_flags.sampled)


def _sampler_and_ids() -> tuple[Any, Any]:
    """The configured sampler, wrapped so a caller may keep one span (tail sampling), and
    an id generator whose next root ids a caller may choose (epoch traces)."""
    from opentelemetry.sdk.trace import TracerProvider, sampling
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class TailSampler(sampling.Sampler):
        def __init__(self, inner: sampling.Sampler) -> None:
            self.inner, self.keep = inner, False
            #: the sampler of a trace's root (a parent-based sampler's ``root``)
            self.root: sampling.Sampler = getattr(inner, "_root", inner)
            self.bound: int | None = self.root.bound \
                if isinstance(self.root, sampling.TraceIdRatioBased) else None

        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None,
                          trace_state: Any = None) -> sampling.SamplingResult:
            if self.keep:
                return sampling.SamplingResult(sampling.Decision.RECORD_AND_SAMPLE, attributes)
            return self.inner.should_sample(parent_context, trace_id, name, kind, attributes,
                                            links, trace_state)

        def root_keeps(self, trace_id: int) -> bool:
            if self.bound is not None:  # (a trace id ratio: its rule, without its objects)
                return bool(trace_id & 0xFFFFFFFFFFFFFFFF < self.bound)
            decision = self.root.should_sample(None, trace_id, "epoch").decision
            return bool(decision == sampling.Decision.RECORD_AND_SAMPLE)

        def get_description(self) -> str:
            return f"sfaas.Tail{{{self.inner.get_description()}}}"

    class Ids(RandomIdGenerator):
        force: tuple[int, int] | None = None

        def generate_trace_id(self) -> int:
            return self.force[0] if self.force and self.force[0] else super().generate_trace_id()

        def generate_span_id(self) -> int:
            return self.force[1] if self.force else super().generate_span_id()

    # (the SDK's own reading of OTEL_TRACES_SAMPLER and its argument: a provider made
    # without a sampler reads them)
    return TailSampler(TracerProvider(shutdown_on_exit=False).sampler), Ids()


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
