"""The Firehose HTTP sink (``firehose_http``): committed messages delivered as Firehose requests.

Each non-null value of the payload column is one record. Records are batched in ``seq`` order up to
the protocol's limits (10,000 records, 1,024,000 bytes each, a 64 MiB body) and the buffering hints
(``size_in_mbs`` of record data, ``interval_in_seconds`` after a batch's first record), encoded as a
Firehose request (base64 records, gzip when configured) and POSTed with the protocol's headers. A
batch keeps one request id across all its attempts: a UUID derived from the sink and the batch's first
and last record's message ids. Batch boundaries are committed state: a closed batch is sent only once
the epoch carrying its last ``seq`` (in ``SinkProgress.sink_state``) has committed, and a new instance
re-forms the committed batches exactly, whatever closed them (size, count, interval or a flush) and
whatever the buffering hints are now, so a batch has the same records and the same request id after a
restart too.

Only a conforming 200 acknowledges a batch (see :func:`egress.firehose.protocol.check_response`:
JSON Content-Type, no Content-Encoding, a body of at most 1 MiB with the request's ``requestId`` and
an integer ``timestamp`` in ms; the HTTP client captures the response headers for it); a 413 is
permanent; everything else is retried with Firehose's backoff within ``retry_duration``
(:mod:`egress.firehose.retry`). Records that got a 413 or exhausted their retries go to the error
output (Firehose's format) and to the dead-letter file (``dead_letter_path``, for ``egress redrive``;
:mod:`egress.connectors.dead_letters`), whichever are set, and the batch counts as handled once they
are durable; with neither such a batch is a terminal failure of this sink instance, as in the async
HTTP sink (nothing later is acknowledged). Batches run
concurrently up to ``max_in_flight``; acknowledgements advance as a contiguous prefix in ``seq``
order (at-least-once, ordered progress). The URL and the access key are read before every attempt,
so DynamicSpec changes and rotated key files apply to the next attempt.

With tracing on (``egress.observe.tracing``) each attempt of a request may be a ``delivery attempt``
span (its record count, request id, attempt and status) under the trace context its first record
carries, and the request sends that span's context as ``traceparent`` (``propagate_trace_context``).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from egress.connectors.base import SINKS, SinkContext, single_input_stream
from egress.connectors.dead_letters import Attempt, DeadLetter, check_dead_letter_path
from egress.connectors.sinks.batches import Batch, BatchedSink, BatchLimits, redrive_progress_of
from egress.connectors.sinks.delivery import NO_DEADLINE, DeliveryHooks, DeliveryLoop
from egress.connectors.sinks.firehose_parameters import (
    AccessKeyUnavailable,
    FirehoseHttpSinkDynamicParameters,
    FirehoseHttpSinkParameters,
)
from egress.connectors.sinks.http_attempts import ClientsByScheme, ResponseCounters, RetryPlan
from egress.engines import SinkProgress
from egress.errors import DeliveryError, SpecError
from egress.firehose import error_output as eo
from egress.firehose import protocol as p
from egress.firehose.errors import ResponseNotAccepted
from egress.firehose.retry import JITTER_RATIO, RetryBudget
from egress.httpclient import CurlClient, Request, Response
from egress.httpclient.backoff import DoublingBackoff, draw
from egress.httpclient.outcomes import AttemptFailure, FailureKind, failure_of, status_failure
from egress.httpclient.transport import HttpTransport
from egress.observe import tracing as _tracing
from egress.spec import StreamSpec

STATUS_SUFFIX = "firehose_http_sink"
SINK_CLASS = "firehose_http"  # the sink_class label of its metrics
PAYLOAD_TYPE_ERROR = "Firehose HTTP sink payload column must contain a String or null value"
MIB = 1024 * 1024
BODY_FRAME_BYTES = 1024  # requestId, timestamp and braces around the records, generously


TransportFactory = Callable[[str, FirehoseHttpSinkParameters], HttpTransport]


def curl_transport(scheme: str, parameters: FirehoseHttpSinkParameters) -> HttpTransport:
    """One libcurl client per scheme, as many connections as batches may be in flight."""
    return CurlClient(max_connections=parameters.max_in_flight,
                      ca_file=parameters.tls_ca_file if scheme == "https" else None)


def batch_request_id(sink_key: str, first_message_id: bytes, last_message_id: bytes) -> str:
    """The ``X-Amz-Firehose-Request-Id`` of a batch: a version-4-shaped UUID from BLAKE2b over the
    sink key (``computation/sink``) and the batch's first and last message ids. Deterministic, so a
    batch with the same boundaries has the same id in every process."""
    digest = hashlib.blake2b(b"egress.firehose_http\0" + sink_key.encode() + b"\0" + first_message_id
                             + b"\0" + last_message_id, digest_size=16).digest()
    return str(uuid.UUID(bytes=digest, version=4))


def describe(failure: AttemptFailure) -> str:
    """For the status tree and the console: the status, the message, and a hint when the endpoint
    refused the access key."""
    text = f"HTTP {failure.status}: {failure.message[:500]}" if failure.status else failure.message[:500]
    if failure.status in (401, 403):
        text += " (the endpoint refused the access key: check the sink's access_key and its variable or file)"
    return text


class FirehoseRetries:
    """Firehose's rules for one batch: retries within ``retry_duration`` (:class:`RetryBudget`, which
    does not count the time spent waiting for responses) with Firehose's backoff (``retry_initial_delay``
    and ``retry_maximum_delay`` read at each retry); a permanent failure (a 413) is not retried."""

    __slots__ = ("_budget", "_dynamic", "_response_timeout", "_rng")

    def __init__(self, retry_duration: float, response_timeout: float, rng: random.Random,
                 dynamic: Callable[[], FirehoseHttpSinkDynamicParameters]) -> None:
        self._budget = RetryBudget(retry_duration)
        self._response_timeout = response_timeout
        self._rng = rng
        self._dynamic = dynamic

    def deadline(self) -> float:
        return NO_DEADLINE

    def budget_over(self, attempts: int, now: float) -> bool:
        return False

    def attempt_timeout(self, now: float) -> float:
        return self._response_timeout

    def attempt_finished(self, started: float, ended: float, *, failed: bool) -> None:
        self._budget.attempt_finished(started, ended, failed=failed)

    def after_failure(self, attempts: int, failure: AttemptFailure, retry_after: float, now: float) -> RetryPlan:
        if failure.permanent:
            return RetryPlan("policy")
        dynamic = self._dynamic()
        backoff = DoublingBackoff(dynamic.retry_initial_delay, dynamic.retry_maximum_delay, JITTER_RATIO)
        wait = draw(backoff, self._budget.attempts - 1, self._rng)
        if not self._budget.may_retry_after(now, wait):
            return RetryPlan("deadline")
        return RetryPlan(None, now + wait)


@SINKS.register("firehose_http", "NYT::NFlow::TFirehoseHttpSink")
class FirehoseHttpSink(BatchedSink):
    """One instance per sink per partition job. See the module docs for the contract; batch formation,
    committed boundaries and acknowledgement are :class:`~egress.connectors.sinks.batches.BatchedSink`'s."""

    kind: ClassVar[str] = "Firehose HTTP sink"
    payload_type_error: ClassVar[str] = PAYLOAD_TYPE_ERROR
    parameters_model: ClassVar[type[FirehoseHttpSinkParameters]] = FirehoseHttpSinkParameters
    dynamic_parameters_model: ClassVar[type[FirehoseHttpSinkDynamicParameters]] = FirehoseHttpSinkDynamicParameters

    @classmethod
    def check(cls, parameters: FirehoseHttpSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """One input stream with the payload column as a String column."""
        stream = single_input_stream("Firehose HTTP sink", input_streams)
        if isinstance(stream, SpecError):
            return [stream]
        if parameters.access_key is not None:
            try:
                parameters.access_key.resolve()  # fail before the run, not at its first attempt
            except AccessKeyUnavailable as error:
                return [SpecError(str(error), path="parameters/access_key")]
        column = next((c for c in stream.columns if c.name == parameters.payload_column), None)
        if column is None or column.type != "string":
            names = ", ".join(c.name for c in stream.columns if c.type == "string") or "none"
            return [SpecError(f'Firehose HTTP sink payload column "{parameters.payload_column}" must be a String '
                              f"column of the input stream (its String columns: {names})",
                              path="parameters/payload_column")]
        return check_dead_letter_path(parameters.dead_letter_path)

    @classmethod
    def redrive_progress(cls, letters: list[DeadLetter]) -> SinkProgress:
        """Where a new instance starts to re-send ``letters`` as messages ``seq`` 1..n (``egress
        redrive``): the letters of one batch (consecutive, one request id) as committed batch ends, so
        that they are re-formed into that batch and sent under the same request id, whatever the
        buffering hints are now."""
        return redrive_progress_of(letters)

    @classmethod
    def create(cls, context: SinkContext, parameters: FirehoseHttpSinkParameters,
               dynamic_parameters: FirehoseHttpSinkDynamicParameters, progress: SinkProgress) -> FirehoseHttpSink:
        return cls(context, parameters, dynamic_parameters, progress)

    def __init__(
        self,
        context: SinkContext,
        parameters: FirehoseHttpSinkParameters,
        dynamic_parameters: FirehoseHttpSinkDynamicParameters,
        progress: SinkProgress,
        *,
        transport_factory: TransportFactory = curl_transport,
        rng: random.Random | None = None,
    ) -> None:
        path = parameters.dead_letter_path
        hints = parameters.buffering_hints
        limits = BatchLimits(max_records=p.MAX_RECORDS_PER_REQUEST, max_bytes=p.MAX_REQUEST_BODY_BYTES,
                             max_delay=hints.interval_in_seconds, record_bytes=p.record_json_size,
                             frame_bytes=BODY_FRAME_BYTES, max_data_bytes=hints.size_in_mbs * MIB)
        super().__init__(context, progress, payload_column=parameters.payload_column, limits=limits,
                         max_in_flight=parameters.max_in_flight,
                         status_path=f"/sinks/{context.sink_id}/{STATUS_SUFFIX}",
                         dead_letters=context.dead_letters.open(path) if path is not None else None)
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._transports = ClientsByScheme(lambda scheme: transport_factory(scheme, parameters))
        self._rng = rng or random.Random()
        self._sink_key = f"{context.computation_id}/{context.sink_id}"
        self._attributes = parameters.common_attributes_header
        self._errors = eo.ErrorOutput(parameters.error_output) if parameters.error_output else None
        labels = (context.sink_id, SINK_CLASS)
        metrics = context.metrics.sink
        self._freshness = metrics.freshness
        self._freshness.sinks.add(self)
        self._m_batches = metrics.batches.labels(*labels)
        self._m_records = metrics.records.labels(*labels)
        self._m_bytes = metrics.bytes.labels(*labels)
        self._m_error_records = metrics.error_records.labels(*labels)
        self._m_dead_letters = metrics.dead_letters.labels(*labels)
        self._responses = ResponseCounters(metrics, labels)
        self._loop = DeliveryLoop(
            context.clock, DeliveryHooks(self._request, self._judge, self._attempt_failed, self._give_up,
                                         self._succeed, self._stopped_before, self._pause_until),
            kind=self.kind, url=lambda: self._dynamic.url or parameters.url, transport=self._transports.get,
            dynamic=lambda: self._dynamic, pauses=None, throttle=None, max_redirects=0,
            requests=metrics.requests.labels(*labels), retries=metrics.retries.labels(*labels),
            attempt_seconds=context.metrics.attempt_duration.labels(context.sink_id),
            trace=self._trace_of, propagate=parameters.propagate_trace_context)

    @property
    def computation_id(self) -> str:
        return self._context.computation_id

    @property
    def sink_id(self) -> str:
        return self._context.sink_id

    @property
    def sink_class(self) -> str:
        return SINK_CLASS

    @property
    def partition(self) -> int:
        return self._context.partition

    # -- hooks of BatchedSink --------------------------------------------------------------

    def _record_added(self, batch: Batch, record: bytes) -> None:
        batch.arrivals_ms.append(int(self._context.clock.now() * 1000))
        batch.oversized = batch.oversized or len(record) > p.MAX_RECORD_BYTES

    def _alone(self, record: bytes) -> bool:
        return len(record) > p.MAX_RECORD_BYTES  # never sent: a batch of its own, given up at once

    def _batch_key(self, batch: Batch) -> str:
        return batch_request_id(self._sink_key, batch.record_ids[0], batch.record_ids[-1])

    def _closed(self) -> None:
        self._transports.close()
        self._freshness.sinks.discard(self)

    def reconfigure(self, dynamic_parameters: FirehoseHttpSinkDynamicParameters) -> None:
        """Apply new dynamic parameters (URL, access key, backoff scale) from the next attempt on."""
        self._dynamic = dynamic_parameters

    def oldest_undelivered_age(self) -> float:
        """Seconds since the oldest unacknowledged record arrived (0 when there is none)."""
        for batch in self._batches:
            if not batch.done and batch.arrivals_ms:
                return max(0.0, self._context.clock.now() - batch.arrivals_ms[0] / 1000)
        return 0.0

    # -- one batch ---------------------------------------------------------------------------

    async def _deliver(self, batch: Batch) -> None:
        """Attempts until a conforming 200, a 413, or the end of ``retry_duration``
        (:class:`~egress.connectors.sinks.delivery.DeliveryLoop` with :class:`FirehoseRetries`)."""
        clock = self._context.clock
        parameters = self._parameters
        if batch.oversized:
            self._give_up(batch, "policy", 0, AttemptFailure(
                FailureKind.OTHER, f"a record is larger than {p.MAX_RECORD_BYTES} bytes, the protocol's limit",
                code=eo.RECORD_TOO_LARGE, permanent=True))
            return
        level = parameters.compression_level if parameters.content_encoding == "gzip" else 0
        batch.body = await asyncio.to_thread(_encode, self._batch_key(batch), int(clock.now() * 1000), batch.records,
                                             level)
        self._m_batches.inc()
        rules = FirehoseRetries(float(parameters.retry_duration), parameters.response_timeout, self._rng,
                                lambda: self._dynamic)
        await self._loop.run(batch, rules)

    def _trace_of(self, batch: Batch) -> tuple[str | None, bool, dict[str, Any]]:
        """What the delivery loop traces of the attempts of ``batch``'s request (``delivery.TraceOf``,
        tracing on): the context its first record carries (``None``: none, the attempts a trace of
        their own), whether they are sampled, and the attributes of their spans."""
        contexts, context = self._context.trace_contexts, self._context
        carried = contexts.get(batch.record_seqs[0]) if contexts and batch.record_seqs else None
        tracing = _tracing.active
        sampled = tracing is not None and tracing.sampling.child(carried)
        return carried, sampled, {
            "egress.computation_id": context.computation_id, "egress.sink_id": context.sink_id,
            "egress.partition": context.partition, "egress.first_seq": batch.first_seq,
            "egress.last_seq": batch.last_seq, "egress.records": len(batch.records),
            "egress.firehose_request_id": self._batch_key(batch)}

    # -- the hooks of its DeliveryLoop ------------------------------------------------------

    def _request(self, batch: Batch, url: str, timeout: float) -> Request | AttemptFailure:
        """The request of an attempt, with the access key read now (a rotated key file applies to the next
        attempt); the failure of the attempt when the key cannot be read."""
        reference = self._dynamic.access_key or self._parameters.access_key
        try:
            key = reference.resolve() if reference is not None else None
        except AccessKeyUnavailable as error:
            return AttemptFailure(FailureKind.OTHER, str(error), code=eo.DESTINATION_EXCEPTION)
        assert batch.body is not None
        headers = p.request_headers(self._batch_key(batch), source_arn=self._parameters.arn, access_key=key,
                                    common_attributes=self._attributes,
                                    gzip_body=self._parameters.content_encoding == "gzip")
        lines = tuple(f"{name}: {value}" for name, value in headers.items())
        return Request(url, batch.body, lines, timeout=self._parameters.response_timeout, capture_body=True,
                       capture_headers=True)

    def _judge(self, batch: Batch, response: Response) -> AttemptFailure | None:
        self._responses.count(response)
        return judge(response, self._batch_key(batch))

    def _attempt_failed(self, batch: Batch, failure: AttemptFailure) -> None:
        clock = self._context.clock
        batch.attempts.append(Attempt(clock.now(), failure.status or None, f"{failure.code}: {failure.message[:500]}"))
        self._context.status.set_error(self._status_path, batch.first_seq,
                                       f"Firehose HTTP request {self._batch_key(batch)} failed: {describe(failure)}")

    async def _pause_until(self, batch: Batch, when: float) -> None:
        clock = self._context.clock
        while clock.monotonic() < when:
            await clock.sleep_until(when)

    def _succeed(self, batch: Batch) -> None:
        self._m_records.inc(len(batch.records))
        self._m_bytes.inc(batch.data_bytes)
        self._acknowledge(batch)

    def _give_up(self, batch: Batch, exhausted: str, attempts: int, failure: AttemptFailure | None) -> None:
        """Error output and dead letters, whichever are set (then the batch counts as handled, once they
        are durable), or a terminal failure with neither."""
        assert failure is not None  # Firehose's rules end a batch only after a failed attempt
        error = str(DeliveryError("Firehose HTTP delivery failed", attempts=attempts,
                                  last_error=f"{failure.code}: {describe(failure)}"))
        if self._errors is None and self._dead_letters is None:
            self._fail(batch, error)
            return
        if self._errors is not None:
            lines = eo.error_lines(batch.records, batch.arrivals_ms, attempts=attempts, error_code=failure.code,
                                   error_message=failure.message, ending_ms=int(self._context.clock.now() * 1000))
            try:
                self._errors.write(lines)
            except OSError as problem:
                self._fail(batch, f"cannot write the error output {self._errors.path}: {problem.strerror}")
                return
            self._m_error_records.inc(len(batch.records))
        if self._dead_letters is None:
            self._acknowledge(batch)
            return
        # The dead letters of the batch's records: its request id is their idempotency key.
        self._dead_letter(batch, self._batch_key(batch), batch.attempts, error)

    def _count_dead_letters(self, lines: int) -> None:
        self._m_dead_letters.inc(lines)


def _encode(request_id: str, timestamp_ms: int, records: list[bytes], gzip_level: int) -> bytes:
    body = p.encode_request_body(request_id, timestamp_ms, records)
    return p.gzip_compress(body, gzip_level) if gzip_level else body


def judge(response: Response, request_id: str) -> AttemptFailure | None:
    """Firehose's acceptance rule applied to one response (docs/firehose.md, "Sender").

    ``None`` only for a conforming 200 (:func:`egress.firehose.protocol.check_response` on the status,
    the Content-Type and Content-Encoding headers and the body). Otherwise the failure, with the
    error-output code as ``code``: no response → ``RequestTimeout`` (curl error 28) or
    ``ConnectionFailed``; a body over 1 MiB → ``ResponseTooLarge``; a 413 → ``DestinationException``,
    permanent; a 200 that does not conform → ``InvalidResponseFromDestination``; any other status →
    ``DestinationException``. The message is the response body (cut to 8,192 characters) or, when
    there is none to show (a gzip'd body is not shown), the reason.
    """
    status = response.status
    failure = failure_of(response) if response.error is not None else None
    if status == 0:
        if failure is None:
            return AttemptFailure(FailureKind.OTHER, "no response", code=eo.CONNECTION_FAILED)
        return failure._replace(code=eo.REQUEST_TIMEOUT if "curl error 28" in failure.message else eo.CONNECTION_FAILED)
    if failure is not None:  # a body read failed after the status
        return failure._replace(message=f"HTTP {status}: {response.error}", status=0, code=eo.DESTINATION_EXCEPTION)
    body = response.body or b""
    if status == 413:
        return status_failure(status)._replace(message=_text(body) or "HTTP 413", code=eo.DESTINATION_EXCEPTION,
                                               permanent=True)
    if len(body) > p.MAX_RESPONSE_BODY_BYTES:
        return status_failure(status)._replace(message=f"response body of {len(body)} bytes is over 1 MiB",
                                               code=eo.RESPONSE_TOO_LARGE)
    headers = response.headers or {}
    try:
        p.check_response(response.status, body, request_id, content_type=headers.get("content-type"),
                         content_encoding=headers.get("content-encoding"))
    except ResponseNotAccepted as error:
        if status != 200:
            return status_failure(status)._replace(message=_text(body) or error.reason, code=eo.DESTINATION_EXCEPTION)
        return status_failure(status)._replace(message=_text(error.body) or error.reason, code=eo.INVALID_RESPONSE)
    return None


def _text(body: bytes) -> str:
    return body[:p.MAX_ERROR_MESSAGE_CHARS].decode("utf-8", "replace")


__all__ = ["FirehoseHttpSink", "FirehoseHttpSinkDynamicParameters", "FirehoseHttpSinkParameters", "batch_request_id"]
