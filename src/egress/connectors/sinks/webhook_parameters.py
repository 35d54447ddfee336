"""Parameters of the ``webhook_http`` sink (``docs/webhooks.md``).

Static (``Spec``): where a message names its endpoint (``endpoint_column``: a name of the
DynamicSpec's endpoint table; or ``url_column``: the URL itself), the payload column, the pool,
the memory bound per endpoint and the dead-letter file. Dynamic (``DynamicSpec``, live): the
endpoint table, the retry rules of the async HTTP sink (same names, same defaults) and the breaker.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from egress.connectors.base import single_input_stream
from egress.connectors.dead_letters import check_dead_letter_path
from egress.connectors.sinks.http_parameters import (
    AsyncHttpSinkDynamicParameters,
    AsyncHttpSinkParameters,
    _AtLeastOnceOnly,
)
from egress.errors import SpecError, SpecErrors
from egress.httpclient.redirects import normalise_url
from egress.spec import Duration, StreamSpec
from egress.spec.urls import endpoint_url_problem
from egress.webhook_signatures import read_secrets

SINK_KIND = "Webhook HTTP sink"


class WebhookSinkParameters(_AtLeastOnceOnly):
    """Static parameters. Exactly one of ``endpoint_column`` (a string column naming an entry of the
    DynamicSpec's ``endpoints``) and ``url_column`` (a string column holding the URL, one endpoint per
    distinct URL). ``max_buffered_per_endpoint``: messages of one endpoint kept in memory; the rest of
    its backlog stays in the outbox and is read again when it drains (engines with an outbox reader:
    SQLite). ``idempotency_header`` (default none) repeats the key that ``webhook-id`` carries.
    ``propagate_trace_context`` (default true): with tracing on, requests carry ``traceparent``."""

    sink_kind = SINK_KIND

    payload_column: str = Field(min_length=1)
    endpoint_column: str | None = Field(default=None, min_length=1)
    url_column: str | None = Field(default=None, min_length=1)
    idempotency_header: str = ""
    max_buffered_per_endpoint: int = Field(default=256, ge=1)
    keep_alive: bool = True
    tls_ca_file: str | None = None
    dead_letter_path: str | None = Field(default=None, min_length=1)
    # With tracing on (egress.observe.tracing), each request carries the W3C traceparent of its message.
    propagate_trace_context: bool = True

    @model_validator(mode="after")
    def _one_column(self) -> WebhookSinkParameters:
        if (self.endpoint_column is None) == (self.url_column is None):
            raise ValueError(f"{SINK_KIND} needs exactly one of endpoint_column and url_column")
        return self


class EndpointDefaults(BaseModel):
    """What an endpoint shares with the others unless its entry says otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    headers: dict[str, str] = {}
    secret_file: str | None = Field(default=None, min_length=1)
    secret_env: str | None = Field(default=None, min_length=1)
    max_in_flight: int = Field(default=1, ge=1, le=1024)
    throttler_id: str | None = Field(default=None, min_length=1)
    throttler_class_id: str | None = Field(default=None, min_length=1)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        lowered = {name.lower() for name in value}
        if lowered & {"webhook-id", "webhook-timestamp", "webhook-signature"}:
            raise ValueError("headers must not set webhook-id, webhook-timestamp or webhook-signature: the sink does")
        return _HeaderRules._headers(value)

    @model_validator(mode="after")
    def _secret(self) -> EndpointDefaults:
        if self.secret_file is not None and self.secret_env is not None:
            raise ValueError("give secret_file or secret_env, not both")
        if self.throttler_class_id is not None and self.throttler_id is None:
            raise ValueError("throttler_class_id needs throttler_id")
        # Read now, so a missing file or a malformed secret is the DynamicSpec's error (it is then
        # ignored, the endpoint keeps its secrets); the keys themselves are not kept in the model. A
        # relative file is read once it starts at the Spec's folder (WebhookSinkDynamicParameters.files_in).
        if self.secret_file is not None and not Path(self.secret_file).is_absolute():
            return self
        try:
            read_secrets(file=self.secret_file, env=self.secret_env)
        except SpecError as error:  # a ValueError for pydantic: the message gets the entry's path
            raise ValueError(error.message) from None
        return self

    def _files_in(self, base_dir: Path, path: str, problems: list[SpecError]) -> EndpointDefaults:
        """A copy whose relative ``secret_file`` starts at ``base_dir``, its secrets checked (a
        problem at ``path/secret_file`` appended to ``problems``)."""
        if self.secret_file is None or Path(self.secret_file).is_absolute():
            return self
        resolved = self.model_copy(update={"secret_file": str(base_dir / self.secret_file)})
        try:
            read_secrets(file=resolved.secret_file)
        except SpecError as error:
            problems.append(SpecError(error.message, path=f"{path}/secret_file"))
        return resolved


class EndpointSpec(EndpointDefaults):
    """One entry of the endpoint table. ``resume``: raise it to resume an endpoint its breaker paused
    (``egress endpoint resume NAME`` does the same on a running pipeline)."""

    url: str
    resume: int = Field(default=0, ge=0)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = endpoint_url_problem(value)
        if problem is not None:
            raise ValueError(f"{SINK_KIND} URL {problem}")
        return normalise_url(value)


class BreakerSpec(BaseModel):
    """The circuit breaker of each endpoint: open once at least ``minimum_requests`` attempts ended in
    the last ``window`` seconds and ``failure_ratio`` of them failed; after ``open_for`` seconds,
    half-open: ``half_open_probes`` attempts may go, a success closes it, a failure opens it again;
    an endpoint not closed for ``disable_after`` seconds is paused until resumed (``None``: never)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: Duration = Field(default=30.0, gt=0)
    minimum_requests: int = Field(default=5, ge=1)
    failure_ratio: float = Field(default=0.5, gt=0.0, le=1.0)
    open_for: Duration = Field(default=5.0, gt=0)
    half_open_probes: int = Field(default=1, ge=1)
    disable_after: Duration | None = Field(default=None, gt=0)


class WebhookSinkDynamicParameters(AsyncHttpSinkDynamicParameters):
    """Dynamic parameters: the async HTTP sink's retry rules for one delivery (after
    ``max_attempt_count`` attempts or ``request_timeout`` a message is dead-lettered with
    ``dead_letter_path``, else it is tried again after ``retry_maximum_delay``, holding only its own
    endpoint), ``endpoints`` (name → :class:`EndpointSpec`), ``defaults`` for ``url_column``
    endpoints, and the ``breaker``."""

    sink_kind = SINK_KIND

    endpoints: dict[str, EndpointSpec] = Field(default_factory=dict)
    defaults: EndpointDefaults = Field(default_factory=EndpointDefaults)
    breaker: BreakerSpec = Field(default_factory=BreakerSpec)

    def files_in(self, base_dir: Path) -> WebhookSinkDynamicParameters:
        """A copy whose relative ``secret_file`` paths start at ``base_dir`` (the Spec's folder, as
        the other files a sink names), each read to check it. Raises :class:`SpecErrors` with a
        problem per file that cannot be read or holds no valid secret (paths
        ``endpoints/NAME/secret_file``, ``defaults/secret_file``)."""
        problems: list[SpecError] = []
        endpoints = {name: entry._files_in(base_dir, f"endpoints/{name}", problems)
                     for name, entry in self.endpoints.items()}
        defaults = self.defaults._files_in(base_dir, "defaults", problems)
        if problems:
            raise SpecErrors(problems)
        return self.model_copy(update={"endpoints": endpoints, "defaults": defaults})


def check_streams(parameters: WebhookSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
    """The construction checks: one input stream with the payload column and the endpoint or URL
    column, both strings; the dead-letter path."""
    stream = single_input_stream(SINK_KIND, input_streams)
    if isinstance(stream, SpecError):
        return [stream]
    types = {column.name: column.type for column in stream.columns}
    problems: list[SpecError] = []
    named = [("payload_column", parameters.payload_column),
             ("endpoint_column" if parameters.endpoint_column else "url_column",
              parameters.endpoint_column or parameters.url_column or "")]
    for field, column in named:
        if types.get(column) != "string":
            problems.append(SpecError(f'{SINK_KIND} {field} "{column}" must be a String column of the input stream '
                                      f"(columns: {', '.join(types) or 'none'})", path=f"parameters/{field}"))
    return problems + check_dead_letter_path(parameters.dead_letter_path)


class _HeaderRules(AsyncHttpSinkParameters):
    """Borrows the async HTTP sink's header rules (tokens, no CR/LF, no hop-by-hop names)."""

    sink_kind = SINK_KIND


__all__ = [
    "BreakerSpec",
    "EndpointDefaults",
    "EndpointSpec",
    "WebhookSinkDynamicParameters",
    "WebhookSinkParameters",
    "check_streams",
]
