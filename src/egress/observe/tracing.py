"""OpenTelemetry tracing of a run: off by default, and then it costs a module attribute read.

Turned on for the process by :func:`configure` (``egress run --otlp-endpoint URL``, or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``/``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): spans go through the
OpenTelemetry SDK's batch processor to its OTLP/HTTP exporter (the ``egress[tracing]`` extra; nothing
of OpenTelemetry is imported while tracing is off). :data:`active` is then the process's
:class:`Tracing`, else ``None``: every hook in the runtime, the sinks, the sources and the throttler
reads it once and does nothing more when it is ``None``.

Sampling follows the standard ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``, decided here
rather than by the SDK's sampler so that an unsampled epoch or delivery creates no span object at all:
a root (an epoch, a delivery of a message without an origin trace, a batch) is sampled with the
ratio; a span with a parent (a delivery of a message that carries its source event's trace context)
follows the parent's sampled flag under the ``parentbased_*`` samplers, the ratio otherwise.

Spans take their times from the run's clock (``egress.clock``), so on a virtual clock they are exact
(the ``Input.Throttle`` span lasts what the throttler made the batch wait).

A message's trace context is a W3C ``traceparent`` value, optionally followed by ``"\\n"`` and the
``tracestate`` value (:func:`context_of_headers`, :func:`headers_of_context`): what the sources
receive, the log and the outbox keep, and the sinks send on.
"""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from egress.errors import TracingConfigError

SERVICE_NAME = "egress"
THROTTLER_SERVICE_NAME = "egress-throttler"  # the throttler controller's decisions, a service of their own
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT = re.compile(r"\A00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")

active: Tracing | None = None
"""The process's tracing once :func:`configure` turned it on; ``None`` (off) otherwise."""


class Sampling:
    """A sampling decision made without the SDK: ``ratio`` for a root (0..1), and whether a span with a
    parent follows the parent's sampled flag (``follows_parent``, the ``parentbased_*`` samplers)."""

    __slots__ = ("follows_parent", "ratio")

    def __init__(self, ratio: float, *, follows_parent: bool) -> None:
        self.ratio = ratio
        self.follows_parent = follows_parent

    def root(self) -> bool:
        """Whether a new trace is sampled."""
        ratio = self.ratio
        return ratio >= 1.0 or (ratio > 0.0 and random.random() < ratio)

    def child(self, parent: str | None) -> bool:
        """Whether a span under ``parent`` (a carried context, ``None``: a root) is sampled."""
        if parent is None or not self.follows_parent:
            return self.root()
        return parent[54] in "13579bdf"  # the traceparent's flags: bit 0, sampled

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Sampling:
        """``OTEL_TRACES_SAMPLER`` (default ``parentbased_always_on``, the SDK's) and its
        ``OTEL_TRACES_SAMPLER_ARG`` (the ratio, 0..1, default 1). Raises :class:`TracingConfigError`
        naming the variable and the fix for another sampler or a ratio that is not a number in 0..1."""
        name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
        if name not in _SAMPLERS:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER={name!r} is not a sampler egress knows: use one of {', '.join(_SAMPLERS)} "
                "(e.g. OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01)")
        follows = name.startswith("parentbased_")
        if name.endswith("always_on"):
            return cls(1.0, follows_parent=follows)
        if name.endswith("always_off"):
            return cls(0.0, follows_parent=follows)
        text = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio: give a number from 0 to 1 "
                                     "(0.01 samples 1 % of the traces)")
        return cls(ratio, follows_parent=follows)


class Tracing:
    """The process's tracer providers (the run's and the throttler controller's service) and the
    sampling decision. Times given to its methods are seconds of the run's clock: ``clock.now()``
    (seconds since the Unix epoch on the real clock), turned into the nanoseconds OTLP carries."""

    def __init__(self, endpoint: str, sampling: Sampling, *, service_name: str = SERVICE_NAME,
                 resource_attributes: Mapping[str, str] | None = None) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        except ImportError as error:
            raise TracingConfigError(f"tracing needs OpenTelemetry ({error.name} is missing): "
                                     "pip install 'egress[tracing]'") from None
        self.endpoint = traces_url(endpoint)
        self.sampling = sampling
        self._lock = threading.Lock()
        self._providers: list[Any] = []
        self._tracers: dict[str, Any] = {}

        def provider(name: str) -> Any:
            made = TracerProvider(resource=Resource.create({"service.name": name, **(resource_attributes or {})}),
                                  sampler=ALWAYS_ON)  # sampled here, before a span is made (Sampling)
            made.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint)))
            self._providers.append(made)
            return made.get_tracer("egress")

        self._tracers = {name: provider(name) for name in dict.fromkeys((service_name, THROTTLER_SERVICE_NAME))}
        self._service = service_name

    def tracer(self, service: str | None = None) -> Any:
        """The OpenTelemetry tracer of ``service`` (the run's by default, or :data:`THROTTLER_SERVICE_NAME`)."""
        return self._tracers[service or self._service]

    def span(self, name: str, start: float, end: float, *, parent: Any = None, attributes: Mapping[str, Any] | None
             = None, service: str | None = None, error: str | None = None) -> Any:
        """A finished span ``name`` from ``start`` to ``end`` (clock seconds) under ``parent`` (a span,
        a carried context string, or ``None``: a new trace), with ``attributes``; an ``error``
        sets its status to ERROR with that description. Returns the span (ended)."""
        from opentelemetry.trace import Status, StatusCode

        made = self.tracer(service).start_span(name, context=parent_context(parent), attributes=attributes,
                                               start_time=nanoseconds(start))
        if error is not None:
            made.set_status(Status(StatusCode.ERROR, error))
        made.end(end_time=nanoseconds(end))
        return made

    def start(self, name: str, start: float, *, parent: Any = None, attributes: Mapping[str, Any] | None = None,
              service: str | None = None, links: Sequence[str] = ()) -> Any:
        """A span ``name`` started at ``start`` (clock seconds), ended by :func:`end`; ``links`` are
        carried contexts it is linked to (a batch's messages' traces)."""
        made_links = None
        if links:
            from opentelemetry.trace import Link

            made_links = [Link(_span_context(context)) for context in links]
        return self.tracer(service).start_span(name, context=parent_context(parent), attributes=attributes,
                                               start_time=nanoseconds(start), links=made_links)

    def flush(self, timeout_millis: int = 10_000) -> None:
        """Export every finished span now (the batch processor exports every few seconds otherwise)."""
        for provider in self._providers:
            provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is left and stop the exporters' threads."""
        with self._lock:
            providers, self._providers = self._providers, []
        for provider in providers:
            provider.shutdown()


def end(span: Any, when: float, *, attributes: Mapping[str, Any] | None = None, error: str | None = None) -> None:
    """End ``span`` (of :meth:`Tracing.start`) at ``when`` (clock seconds), adding ``attributes`` and an
    ERROR status described by ``error``."""
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=nanoseconds(when))


def configure(endpoint: str | None = None, *, environ: Mapping[str, str] | None = None,
              service_name: str = SERVICE_NAME, resource_attributes: Mapping[str, str] | None = None) -> Tracing | None:
    """Turn tracing on for this process when ``endpoint`` (the OTLP/HTTP base URL, ``/v1/traces`` added
    unless given) or the environment's ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_ENDPOINT``
    names a receiver, and ``OTEL_SDK_DISABLED`` is not ``true``; returns :data:`active` (``None``: off).
    Raises :class:`TracingConfigError` for a sampler egress does not know, or without the extra."""
    global active
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    url = endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise TracingConfigError(f"OTLP endpoint {url!r} is not an http(s) URL: give the OTLP/HTTP receiver's URL, "
                                 "e.g. --otlp-endpoint http://127.0.0.1:4318")
    shutdown()
    active = Tracing(url, Sampling.from_environment(environ), service_name=service_name,
                     resource_attributes=resource_attributes)
    return active


def shutdown() -> None:
    """Export what is left and turn tracing off (:data:`active` back to ``None``)."""
    global active
    tracing, active = active, None
    if tracing is not None:
        tracing.shutdown()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint: the base URL plus ``/v1/traces``, as the standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is read (a URL already ending in ``/v1/traces`` as it is)."""
    url = endpoint.rstrip("/")
    return url if url.endswith("/v1/traces") else url + "/v1/traces"


def nanoseconds(seconds: float) -> int:
    """Clock seconds as the integer nanoseconds of OTLP timestamps."""
    return round(seconds * 1e9)


def context_of_headers(traceparent: str | None, tracestate: str | None = None) -> str | None:
    """The carried context of an incoming ``traceparent`` (and ``tracestate``) header, ``None`` when it
    is missing or not a valid version-00 W3C traceparent (an all-zero trace or span id included):
    the event then starts no trace of its own there."""
    if not traceparent:
        return None
    value = traceparent.strip().lower()
    found = _TRACEPARENT.match(value)
    if found is None or found.group(1) == "0" * 32 or found.group(2) == "0" * 16:
        return None
    state = (tracestate or "").strip()
    return f"{value}\n{state}" if state and "\n" not in state and "\r" not in state else value


def headers_of_context(context: str) -> list[str]:
    """The header lines (``traceparent: ...`` and ``tracestate: ...``) that send a carried context on."""
    parent, _, state = context.partition("\n")
    return [f"{TRACEPARENT}: {parent}", f"{TRACESTATE}: {state}"] if state else [f"{TRACEPARENT}: {parent}"]


def context_of_span(span: Any, carried: str | None = None) -> str:
    """The carried context naming ``span`` as the parent (its trace, its span id, sampled), keeping the
    ``tracestate`` of ``carried``."""
    spanned = span.get_span_context()
    parent = f"00-{spanned.trace_id:032x}-{spanned.span_id:016x}-{int(spanned.trace_flags):02x}"
    state = carried.partition("\n")[2] if carried else ""
    return f"{parent}\n{state}" if state else parent


def trace_id_of(context: str) -> str:
    """The 32 hex digits of a carried context's trace id."""
    return context[3:35]


def parent_context(parent: Any) -> Any:
    """An OpenTelemetry ``Context`` whose current span is ``parent`` (a span, or a carried context string
    whose span is remote), or ``None`` for a new trace."""
    if parent is None:
        return None
    from opentelemetry import trace

    if isinstance(parent, str):
        parent = trace.NonRecordingSpan(_span_context(parent))
    return trace.set_span_in_context(parent)


def _span_context(context: str) -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    parent, _, state = context.partition("\n")
    entries: list[tuple[str, str]] = []
    for member in state.split(","):
        key, sep, value = member.strip().partition("=")
        if sep and key:
            entries.append((key, value))
    return SpanContext(int(parent[3:35], 16), int(parent[36:52], 16), is_remote=True,
                       trace_flags=TraceFlags(int(parent[53:55], 16)), trace_state=TraceState(entries))


def parts_attributes(parts: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per part of ``(part, start, end)`` marks, summed by part (the epoch span's attributes)."""
    totals: dict[str, float] = {}
    for part, start, stop in parts:
        totals[part] = totals.get(part, 0.0) + (stop - start)
    return totals


__all__ = ["SERVICE_NAME", "THROTTLER_SERVICE_NAME", "Sampling", "Tracing", "active", "configure",
           "context_of_headers", "context_of_span", "end", "headers_of_context", "nanoseconds", "shutdown",
           "trace_id_of", "traces_url"]
