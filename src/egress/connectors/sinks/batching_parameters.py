"""Parameters of the batching HTTP sink (``batching_http``): the async HTTP sink's, plus the batch.

Everything the async HTTP sink takes (``egress.connectors.sinks.http_parameters``: URL, headers,
idempotency header, keep-alive and pool, redirects, ``max_in_flight``, TLS, throttler, dead letters;
and in the DynamicSpec its retry policy and ``Retry-After`` handling) means the same here, per batch
instead of per message. Beyond it: the batch's bounds (``max_events``, ``max_bytes``, ``max_delay``,
after Vector's ``batch.*``), its ``encoding`` and its ``content_encoding``. See ``docs/http-sink.md``,
"The batching HTTP sink".
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.spec import Duration
from egress.spec.sizes import size_within

KIND = "Batching HTTP sink"
MIB = 1024 * 1024
MAX_BATCH_BYTES = 64 * MIB
MAX_DELAY_SECONDS = 900.0
ENCODING_CONTENT_TYPES = {"json_lines": "application/x-ndjson", "json_array": "application/json", "raw": None}


class BatchingHttpSinkParameters(AsyncHttpSinkParameters):
    """Static parameters (``Spec``): the async HTTP sink's (same names, same meaning, per batch), and:

    ``max_events`` (1..1,000,000, default 1,000): records per batch at most. ``max_bytes`` (bytes, or
    ``512KiB``/``1MiB``/``10MB``: ``egress.spec.sizes``; 1..64 MiB, default 1 MiB): the encoded body
    before compression at most;
    a single record larger than that is sent alone. ``max_delay`` (a duration, 0..15m, default 1s): a
    batch closes this long after its first record; 0 sends what each commit brings at once.
    ``encoding``: ``json_lines`` (default: each payload one line, ``\\n`` after each;
    ``Content-Type: application/x-ndjson``), ``json_array`` (``[p1,p2,...]``; ``application/json``) or
    ``raw`` (the payloads concatenated; no Content-Type unless ``headers`` sets one). The payloads are
    put in byte for byte and not parsed. ``content_encoding``: ``none`` (default) or ``gzip`` (the body
    is gzip'd at ``compression_level`` 1..9, default 6, and sent with ``Content-Encoding: gzip``).
    ``max_in_flight`` here counts batches (default: the client's concurrency, ``max_idle_connections``).
    """

    sink_kind: ClassVar[str] = KIND

    max_events: int = Field(default=1000, ge=1, le=1_000_000)
    max_bytes: Annotated[int, size_within(1, MAX_BATCH_BYTES)] = MIB
    max_delay: Duration = Field(default=1.0, ge=0, le=MAX_DELAY_SECONDS)
    encoding: Literal["json_lines", "json_array", "raw"] = "json_lines"
    content_encoding: Literal["none", "gzip"] = "none"
    compression_level: int = Field(default=6, ge=1, le=9)

    @model_validator(mode="after")
    def _headers_leave_the_body_to_the_sink(self) -> BatchingHttpSinkParameters:
        if any(name.lower() == "content-encoding" for name in self.headers):
            raise ValueError(f"{KIND} headers must not set Content-Encoding: it describes the body the sink "
                             "makes; set content_encoding: gzip to compress it")
        return self

    @property
    def content_type(self) -> str | None:
        """The ``Content-Type`` the sink sends: the one ``headers`` sets, else the encoding's (none for raw)."""
        given = next((value for name, value in self.headers.items() if name.lower() == "content-type"), None)
        return given if given is not None else ENCODING_CONTENT_TYPES[self.encoding]


class BatchingHttpSinkDynamicParameters(AsyncHttpSinkDynamicParameters):
    """Dynamic parameters (``DynamicSpec``): the async HTTP sink's retry policy and ``Retry-After``
    handling, applied per batch (``request_timeout`` counts from a batch's first attempt)."""

    sink_kind: ClassVar[str] = KIND


__all__ = ["BatchingHttpSinkDynamicParameters", "BatchingHttpSinkParameters"]
