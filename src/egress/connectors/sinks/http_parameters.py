"""Parameters of the async HTTP sink, with upstream's defaults, ranges and exact messages.

Source: seed 000 (``NYT::NFlow::TAsyncHttpSink``) and the upstream spec tests
(``ParsesStaticCombinations``, ``RejectsInvalidStaticParameters``, ``RejectsInvalidDynamicParameters``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from egress.httpclient import BackoffPolicy
from egress.httpclient.redirects import normalise_url
from egress.spec import Duration, format_duration
from egress.spec.urls import endpoint_url_problem

_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")
HOP_BY_HOP = frozenset({
    "connection", "content-length", "host", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade",
})


class _AtLeastOnceOnly(BaseModel):
    """The common sink schema has ``at_most_once_strategy``; this sink rejects enabling it.
    ``sink_kind`` names the sink in the messages (a subclass for another HTTP sink sets its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sink_kind: ClassVar[str] = "Async HTTP sink"

    at_most_once_strategy: Any = None

    @field_validator("at_most_once_strategy")
    @classmethod
    def _reject_at_most_once(cls, value: Any) -> Any:
        if value not in (None, {}):
            raise ValueError(f"{cls.sink_kind} does not support at_most_once_strategy")
        return value


class AsyncHttpSinkParameters(_AtLeastOnceOnly):
    """Static parameters (``Spec``): changing them needs a pipeline stop.

    Beyond upstream: ``max_in_flight`` caps the deliveries running at once (attempts, pauses and
    all; default unlimited, as upstream), bounding concurrency and memory; ``tls_ca_file`` is a
    PEM bundle of certificate authorities to trust for ``https`` (a private CA), instead of the
    default ones. Verification itself is always on. ``throttler_id`` (and ``throttler_class_id``)
    name a DynamicSpec throttler from which every POST attempt, retries and redirects included,
    takes one unit first, so all callers of an endpoint share one global rate. ``dead_letter_path``
    (opt-in) is a JSON-lines file that receives a delivery which failed for good, after which it is
    acknowledged and the partition goes on (``egress.connectors.dead_letters``); without it such a
    delivery blocks the partition, as upstream.
    """

    url: str
    payload_column: str = Field(min_length=1)
    headers: dict[str, str] = {}
    idempotency_header: str = "Idempotency-Key"
    keep_alive: bool = True
    max_redirect_count: int = Field(default=0, ge=0)
    max_idle_connections: int = Field(default=8, ge=0)
    # Beyond upstream (egress): both optional, absent by default.
    max_in_flight: int | None = Field(default=None, ge=1)
    tls_ca_file: str | None = None
    throttler_id: str | None = Field(default=None, min_length=1)
    throttler_class_id: str | None = Field(default=None, min_length=1)
    dead_letter_path: str | None = Field(default=None, min_length=1)
    # With tracing on (egress.observe.tracing), each request carries the W3C traceparent of its message.
    propagate_trace_context: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = endpoint_url_problem(value)
        if problem is not None:
            raise ValueError(f"{cls.sink_kind} URL {problem}")
        return normalise_url(value)  # no fragment, no "?" for an empty query on the wire

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        kind = cls.sink_kind
        if not all(_TOKEN.fullmatch(name) for name in value):
            raise ValueError(f"{kind} header names must be valid HTTP tokens")
        if any("\r" in v or "\n" in v for v in value.values()):
            raise ValueError(f"{kind} header values must not contain carriage returns or newlines")
        if any(name.lower() in HOP_BY_HOP for name in value):
            raise ValueError(f"{kind} headers must not contain hop-by-hop or transport-managed names")
        if len({name.lower() for name in value}) != len(value):
            raise ValueError(f"{kind} header names must be unique case-insensitively")
        return value

    @field_validator("idempotency_header")
    @classmethod
    def _idempotency_header(cls, value: str) -> str:
        if value and not _TOKEN.fullmatch(value):
            raise ValueError(f"{cls.sink_kind} idempotency_header must be empty or a valid HTTP header name")
        if value.lower() in HOP_BY_HOP:
            raise ValueError(f"{cls.sink_kind} idempotency_header must not be hop-by-hop or transport-managed")
        return value

    @model_validator(mode="after")
    def _no_override(self) -> AsyncHttpSinkParameters:
        name = self.idempotency_header.lower()
        if name and any(h.lower() == name for h in self.headers):
            raise ValueError(f"{self.sink_kind} headers must not override idempotency_header")
        if self.throttler_class_id is not None and self.throttler_id is None:
            raise ValueError(f"{self.sink_kind} throttler_class_id needs throttler_id")
        return self


class AsyncHttpSinkDynamicParameters(_AtLeastOnceOnly):
    """Dynamic parameters (``DynamicSpec`` at ``computations/<c>/sinks/<s>/parameters``), applied to
    every later retry decision, including deliveries already retrying. Durations are seconds.

    Beyond upstream: ``respect_retry_after`` (default on) makes a 429 or 503 with ``Retry-After``
    (RFC 9110 §10.2.3) pause its endpoint and set the next attempt's delay to at least that value, at
    most ``retry_after_maximum_delay`` (default: ``retry_maximum_delay``); see ``docs/http-sink.md``.
    Both apply to responses that arrive after the change.
    """

    request_timeout: Duration = Field(default=60.0, gt=0)
    attempt_timeout: Duration = Field(default=10.0, gt=0)
    retry_initial_delay: Duration = Field(default=1.0, gt=0)
    retry_minimum_delay: Duration = Field(default=0.1, gt=0)
    retry_multiplier: float = Field(default=2.0, ge=1.01, le=100.0)
    retry_maximum_delay: Duration = Field(default=30.0, gt=0)
    retry_jitter_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    max_attempt_count: int = Field(default=5, ge=1, le=100)
    # Beyond upstream (egress).
    respect_retry_after: bool = True
    retry_after_maximum_delay: Duration | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _orders(self) -> AsyncHttpSinkDynamicParameters:
        for low, high in (("attempt_timeout", "request_timeout"), ("retry_minimum_delay", "retry_initial_delay"),
                          ("retry_initial_delay", "retry_maximum_delay")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} must not exceed {high}: {self._given(low)} > {self._given(high)}; "
                                 f"lower {low} or raise {high}")
        return self

    def _given(self, name: str) -> str:
        """``name``'s value as written, and whether it is the default (one given alone can clash with one left out)."""
        value = format_duration(getattr(self, name))
        return f"{name} {value}" if name in self.model_fields_set else f"{name} {value} (the default)"

    @property
    def retry_after_cap(self) -> float:
        """The longest wait a ``Retry-After`` may ask for, in seconds: ``retry_after_maximum_delay``,
        or ``retry_maximum_delay`` when it is not set."""
        if self.retry_after_maximum_delay is None:
            return self.retry_maximum_delay
        return self.retry_after_maximum_delay

    def backoff_policy(self) -> BackoffPolicy:
        return BackoffPolicy(
            initial_delay=self.retry_initial_delay,
            minimum_delay=self.retry_minimum_delay,
            maximum_delay=self.retry_maximum_delay,
            multiplier=self.retry_multiplier,
            jitter_ratio=self.retry_jitter_ratio,
        )
