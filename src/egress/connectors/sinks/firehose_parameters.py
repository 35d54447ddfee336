"""Parameters of the ``firehose_http`` sink, with Firehose's names, units, defaults and ranges.

Source: Firehose HTTP endpoint spec (seed 002), Firehose's ``HttpEndpointDestinationConfiguration``
(``BufferingHints.SizeInMBs`` 1..64 default 5, ``IntervalInSeconds`` 0..900 default 300,
``RetryOptions.DurationInSeconds`` 0..7200) and ``docs/firehose.md``. Units are Firehose's: MiB and whole seconds.
The access key is never a value in a spec: only a reference to an environment variable or a file,
read at every attempt (so a rotated file or variable is picked up by the next attempt).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator, model_validator

from egress.errors import SecretUnavailable
from egress.firehose import protocol as p
from egress.firehose.retry import INITIAL_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, MAX_RETRY_DURATION_SECONDS
from egress.secret_references import read_secret, variable
from egress.spec import Duration, format_duration, parse_duration
from egress.spec.urls import endpoint_url_problem

_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
_ARN = re.compile(r"arn:aws[a-z-]*:firehose:[a-z0-9-]*:\d*:deliverystream/[a-zA-Z0-9_.-]{1,64}")
LOCAL_ARN_PREFIX = "arn:aws:firehose:local:000000000000:deliverystream/"
KEY_AS_VALUE = ("access_key must be a reference, {env: VARIABLE} or {file: PATH}, never the key itself "
                "(a spec is not a place for secrets)")


class AccessKeyUnavailable(SecretUnavailable):
    """The referenced environment variable is unset or empty, or the file cannot be read or is empty,
    or the key is over 4096 bytes. The message names the variable or file, never a key."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"access key {where}", problem)


class AccessKeyReference(BaseModel):
    """Where the access key is: exactly one of ``env`` (a variable name) or ``file`` (a path whose
    content, without a trailing newline, is the key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    env: str | None = Field(default=None, min_length=1)
    file: str | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _not_a_value(cls, data: Any) -> Any:
        if isinstance(data, str | bytes | int):
            raise ValueError(KEY_AS_VALUE)
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> AccessKeyReference:
        if (self.env is None) == (self.file is None):
            raise ValueError("access_key needs exactly one of env or file")
        return self

    def resolve(self) -> str:
        """The key. Raises :class:`AccessKeyUnavailable` (see there)."""
        where = variable(self.env) if self.env is not None else f"file {self.file}"
        try:
            text = read_secret(env=self.env, file=self.file)
        except SecretUnavailable as error:  # an unset variable reads as an empty one: the same fix
            raise AccessKeyUnavailable(error.where, "is not set or empty" if self.env else error.problem) from None
        value = (text or "") if self.env is not None else (text or "").rstrip("\r\n")
        if not value:
            raise AccessKeyUnavailable(where, "is not set or empty")
        if len(value.encode()) > p.MAX_ACCESS_KEY_BYTES or "\r" in value or "\n" in value:
            raise AccessKeyUnavailable(where, f"must be one line of at most {p.MAX_ACCESS_KEY_BYTES} bytes")
        return value

    def __repr__(self) -> str:
        return f"AccessKeyReference(env={self.env!r})" if self.env else f"AccessKeyReference(file={self.file!r})"


class BufferingHints(BaseModel):
    """When a batch is sent: once its records reach ``size_in_mbs`` MiB (1..64, default 5) or
    ``interval_in_seconds`` after its first record (0..900, default 300; 0 sends what each commit
    brings at once). Setting one hint requires the other (Firehose's rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    size_in_mbs: int = Field(default=5, ge=1, le=64)
    interval_in_seconds: int = Field(default=300, ge=0, le=900)

    @model_validator(mode="before")
    @classmethod
    def _both_or_neither(cls, data: Any) -> Any:
        if isinstance(data, dict) and len({"size_in_mbs", "interval_in_seconds"} & set(data)) == 1:
            raise ValueError("buffering_hints: setting one of size_in_mbs and interval_in_seconds requires the other")
        return data


MAX_RESPONSE_TIMEOUT_SECONDS = 900
"""The longest ``response_timeout``: 5 × Firehose's 3 minutes. It also turns a count of milliseconds
(Flow's convention for a bare integer duration: 1 s and more is ≥ 1000) into an error, not 16 minutes."""


def _response_seconds(value: Any) -> float:
    """``response_timeout`` as seconds: a number is seconds (Firehose's unit, as ``retry_duration``), a
    string with units is a duration (``90s``, ``1m30s``, ``500ms``). Raises ``ValueError``."""
    bare = isinstance(value, str) and value.strip().replace(".", "", 1).isdigit()
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"response_timeout must be seconds (a number, or a duration such as 90s), got {value!r}")
    try:
        seconds = parse_duration(value) if isinstance(value, str) and not bare else float(value)
    except ValueError:
        raise ValueError(f"response_timeout must be seconds (a number, or a duration such as 90s or 500ms), "
                         f"got {value!r}") from None
    if not 0 < seconds <= MAX_RESPONSE_TIMEOUT_SECONDS:
        hint = f"; for milliseconds write '{value}ms'" if (bare or not isinstance(value, str)) and seconds > 0 else ""
        raise ValueError(f"response_timeout is in seconds, as retry_duration (Firehose waits 180): {value} is not "
                         f"in (0, {MAX_RESPONSE_TIMEOUT_SECONDS}]{hint}")
    return seconds


Seconds = Annotated[float, BeforeValidator(_response_seconds), PlainSerializer(format_duration)]
"""A number of seconds or a duration with units, as float seconds (written back as ``180s``)."""


def _check_url(value: str) -> str:
    problem = endpoint_url_problem(value)
    if problem is not None:
        raise ValueError(f"Firehose HTTP sink URL {problem}")
    return value


class FirehoseHttpSinkParameters(BaseModel):
    """Static parameters (``Spec``).

    ``url``: the endpoint, POSTed as written (Firehose itself allows only https on port 443; egress
    also allows http, for local use). ``payload_column``: the string column whose value is one
    record (null: no record). ``access_key``: see :class:`AccessKeyReference`. ``common_attributes``:
    sent in ``X-Amz-Firehose-Common-Attributes`` (≤ 50, key 1..256 chars, value ≤ 1024).
    ``content_encoding``: ``none`` or ``gzip``. ``buffering_hints``: :class:`BufferingHints`.
    ``retry_duration``: seconds, 0..7200, default 300 (0: one attempt, no retry). ``source_arn`` or
    ``stream_name`` (one of them): the ``X-Amz-Firehose-Source-Arn``; a stream name gives
    ``arn:aws:firehose:local:000000000000:deliverystream/<name>``. ``error_output``: a JSON-lines file
    receiving records that exhausted their retries or got a 413 (without it, such a batch stops the
    sink, as the async HTTP sink does). ``dead_letter_path``: a JSON-lines file receiving the same
    records as dead letters, one line per record with its message id, ``seq`` and the batch's request
    id, for ``egress redrive`` (``egress.connectors.dead_letters``); either file lets the partition go
    on. Beyond Firehose: ``max_in_flight`` batches sent at once
    (default 4), ``response_timeout`` per attempt, in seconds like ``retry_duration``
    (a number, or a duration with units such as ``90s`` or ``500ms``; 0 < … ≤ 900, default 180, the
    protocol's), ``compression_level``
    (gzip 1..9, default 6), ``tls_ca_file`` (a PEM bundle to trust for https),
    ``propagate_trace_context`` (default true: with tracing on, a request carries ``traceparent``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)  # a key must never show
    url: str
    payload_column: str = Field(min_length=1)
    access_key: AccessKeyReference | None = None
    common_attributes: dict[str, str] = {}
    content_encoding: Literal["none", "gzip"] = "none"
    buffering_hints: BufferingHints = BufferingHints()
    retry_duration: int = Field(default=300, ge=0, le=MAX_RETRY_DURATION_SECONDS)
    source_arn: str | None = None
    stream_name: str | None = None
    error_output: str | None = Field(default=None, min_length=1)
    dead_letter_path: str | None = Field(default=None, min_length=1)
    max_in_flight: int = Field(default=4, ge=1, le=64)
    response_timeout: Seconds = p.RESPONSE_TIMEOUT_SECONDS
    compression_level: int = Field(default=6, ge=1, le=9)
    tls_ca_file: str | None = None
    # With tracing on (egress.observe.tracing), each request carries the W3C traceparent of its first record.
    propagate_trace_context: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)

    @field_validator("common_attributes")
    @classmethod
    def _attributes(cls, value: dict[str, str]) -> dict[str, str]:
        p.encode_common_attributes(value)  # raises ValueError with the rule broken
        return value

    @field_validator("source_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not _ARN.fullmatch(value):
            raise ValueError("source_arn must look like arn:aws:firehose:<region>:<account>:deliverystream/<name>")
        return value

    @field_validator("stream_name")
    @classmethod
    def _stream_name(cls, value: str | None) -> str | None:
        if value is not None and not _STREAM_NAME.fullmatch(value):
            raise ValueError("stream_name must be 1..64 characters of letters, digits, '_', '.' and '-'")
        return value

    @model_validator(mode="after")
    def _arn_or_name(self) -> FirehoseHttpSinkParameters:
        if (self.source_arn is None) == (self.stream_name is None):
            raise ValueError("set exactly one of source_arn and stream_name")
        return self

    @property
    def arn(self) -> str:
        """The ``X-Amz-Firehose-Source-Arn`` value."""
        return self.source_arn if self.source_arn is not None else LOCAL_ARN_PREFIX + str(self.stream_name)

    @property
    def common_attributes_header(self) -> str | None:
        return p.encode_common_attributes(self.common_attributes) if self.common_attributes else None


class FirehoseHttpSinkDynamicParameters(BaseModel):
    """Dynamic parameters (``DynamicSpec``), read before every attempt.

    ``url`` and ``access_key`` override the Spec's (Firehose: "the access key and/or the destination
    may change between attempts"). ``retry_initial_delay`` and ``retry_maximum_delay`` (egress, for
    tests; default Firehose's 1 s and 120 s; durations, ``1s`` or ``100ms``, where a bare integer is
    milliseconds as in the other sinks' delays) scale the backoff. The other parameters are the Spec's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    url: str | None = None
    access_key: AccessKeyReference | None = None
    retry_initial_delay: Duration = Field(default=INITIAL_BACKOFF_SECONDS, gt=0)
    retry_maximum_delay: Duration = Field(default=MAX_BACKOFF_SECONDS, gt=0)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)


__all__ = ["MAX_RESPONSE_TIMEOUT_SECONDS", "AccessKeyReference", "AccessKeyUnavailable", "BufferingHints",
           "FirehoseHttpSinkDynamicParameters", "FirehoseHttpSinkParameters"]
