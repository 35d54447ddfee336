"""A real OTLP/HTTP trace receiver in the test process: an aiohttp application on ``/v1/traces``
decoding each ``ExportTraceServiceRequest`` (protobuf, ``opentelemetry-proto``) into :class:`Span`s."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Span:
    """One received span: ids as hex, times in nanoseconds, attributes as Python values."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start: int
    end: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind is not None else None


class OtlpReceiver:
    """Collects every span POSTed to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(Span(
                        str(resource.get("service.name")), span.name, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(), span.start_time_unix_nano, span.end_time_unix_nano,
                        {a.key: _value(a.value) for a in span.attributes}, span.status.code))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans if span.name == name]

    def children(self, parent: Span) -> list[Span]:
        return [s for s in self.spans if s.trace_id == parent.trace_id and s.parent_span_id == parent.span_id]
