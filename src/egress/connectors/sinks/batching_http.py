"""The batching HTTP sink (``batching_http``, alias ``NYT::NFlow::TBatchingHttpSink``): committed
messages POSTed in batches, for endpoints that take many events per request (log and search
services, bulk APIs), as Vector's and Fluent Bit's HTTP outputs do.

Each non-null value of the payload column is one record. Records are batched in ``seq`` order up to
``max_events`` records and ``max_bytes`` of encoded body, and for at most ``max_delay`` after a batch's
first record (``egress.connectors.sinks.batches``, shared with the Firehose sink); a batch's body is
its records as JSON lines, a JSON array or concatenated (``encoding``), gzip'd when
``content_encoding`` is ``gzip``. Every attempt of a batch carries one ``Idempotency-Key``:
:func:`batch_idempotency_key` of its first and last message ids. Batch boundaries are committed state
(``SinkProgress.sink_state``): a closed batch is POSTed only once the epoch carrying its last ``seq``
has committed, and a new instance re-forms the committed batches exactly, so a batch has the same
records, body and key after a restart too.

Delivery follows the async HTTP sink's rules per batch, in the same loop (``egress.connectors.sinks.delivery``,
``docs/http-sink.md``): a 2xx acknowledges the batch; anything else is retried with the DynamicSpec's
backoff within ``max_attempt_count`` attempts and ``request_timeout`` (from the batch's first
attempt), each attempt within ``attempt_timeout``; redirects are followed up to ``max_redirect_count``
(never HTTPS to HTTP); a 429 or 503 with ``Retry-After`` pauses every attempt to its endpoint; with
``throttler_id`` every POST takes one unit first. A batch that fails for good goes, one line per
record under the batch's key, to ``dead_letter_path`` and is then acknowledged; without one it is a
terminal failure of the instance (nothing later is sent or acknowledged until a restart). Batches
run concurrently up to ``max_in_flight``; acknowledgements advance as a contiguous prefix in ``seq``
order.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from typing import Any, ClassVar

from egress.connectors.base import SINKS, SinkContext, single_input_stream
from egress.connectors.dead_letters import check_dead_letter_path
from egress.connectors.sinks import http_attempts
from egress.connectors.sinks.batches import Batch, BatchedSink, BatchLimits, UnfitRecord
from egress.connectors.sinks.batching_parameters import BatchingHttpSinkDynamicParameters, BatchingHttpSinkParameters
from egress.connectors.sinks.delivery import NO_DEADLINE, DeliveryHooks, DeliveryLoop, PolicyRetries, exhausted_error
from egress.connectors.sinks.http_attempts import client_concurrency, curl_transport
from egress.engines import SinkProgress
from egress.errors import SpecError
from egress.httpclient import Request, Response
from egress.httpclient.outcomes import AttemptFailure
from egress.httpclient.transport import HttpTransport
from egress.keys import idempotency_key
from egress.spec import StreamSpec

KIND = "Batching HTTP sink"
STATUS_SUFFIX = "batching_http_sink"
SINK_CLASS = "batching_http"  # the sink_class label of its metrics
PAYLOAD_TYPE_ERROR = f"{KIND} payload column must contain a String or null value"
POLICY_EXHAUSTED = "Batching HTTP POST retry policy exhausted"
DEADLINE_EXHAUSTED = "Batching HTTP POST retry deadline exhausted"
NEWLINE_IN_JSON_LINE = (f"{KIND}: a payload contains a newline, so it is not one JSON line; emit compact JSON "
                        "(orjson.dumps, json.dumps without indent) or use encoding json_array or raw")
EMPTY_JSON_VALUE = f"{KIND}: an empty payload is not a JSON value; emit null (no record) or use encoding raw"

TransportFactory = Callable[[str, BatchingHttpSinkParameters], HttpTransport]


def batch_idempotency_key(first_message_id: bytes, last_message_id: bytes) -> str:
    """A batch's ``Idempotency-Key``: the async HTTP sink's key (upper-case hex) of its first and of
    its last message id, joined by ``-``. Deterministic, so a batch with the same boundaries has the
    same key in every process; readable, so the endpoint sees which messages a batch spans."""
    return f"{idempotency_key(first_message_id)}-{idempotency_key(last_message_id)}"


def encode_body(records: list[bytes], encoding: str) -> bytes:
    """The body of a batch of ``records``: ``json_lines`` (each record and ``\\n``), ``json_array``
    (``[r1,r2,...]``) or ``raw`` (concatenated)."""
    if encoding == "json_lines":
        return b"\n".join(records) + b"\n"
    if encoding == "json_array":
        return b"[" + b",".join(records) + b"]"
    return b"".join(records)


def encoded_limits(parameters: BatchingHttpSinkParameters) -> BatchLimits:
    """The batch bounds in body bytes as ``encode_body`` makes them: a record of n bytes adds n + 1 to
    JSON lines (its newline) and to a JSON array (its comma, one fewer than records, and the brackets:
    a frame of 1), n to raw."""
    separated = parameters.encoding != "raw"
    return BatchLimits(max_records=parameters.max_events, max_bytes=parameters.max_bytes,
                       max_delay=parameters.max_delay,
                       record_bytes=(lambda size: size + 1) if separated else (lambda size: size),
                       frame_bytes=1 if parameters.encoding == "json_array" else 0)


@SINKS.register("batching_http", "NYT::NFlow::TBatchingHttpSink")
class BatchingHttpSink(BatchedSink):
    """One instance per sink per partition job. See the module docs for the contract; batch formation,
    committed boundaries and acknowledgement are :class:`~egress.connectors.sinks.batches.BatchedSink`'s."""

    kind: ClassVar[str] = KIND
    payload_type_error: ClassVar[str] = PAYLOAD_TYPE_ERROR
    parameters_model: ClassVar[type[BatchingHttpSinkParameters]] = BatchingHttpSinkParameters
    dynamic_parameters_model: ClassVar[type[BatchingHttpSinkDynamicParameters]] = BatchingHttpSinkDynamicParameters

    @classmethod
    def check(cls, parameters: BatchingHttpSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """One input stream with the payload column as a String column (other columns are not sent)."""
        stream = single_input_stream(KIND, input_streams)
        if isinstance(stream, SpecError):
            return [stream]
        column = next((c for c in stream.columns if c.name == parameters.payload_column), None)
        if column is None or column.type != "string":
            names = ", ".join(c.name for c in stream.columns if c.type == "string") or "none"
            return [SpecError(f'{KIND} payload column "{parameters.payload_column}" must be a String column of '
                              f"the input stream (its String columns: {names})", path="parameters/payload_column")]
        return check_dead_letter_path(parameters.dead_letter_path)

    @classmethod
    def create(cls, context: SinkContext, parameters: BatchingHttpSinkParameters,
               dynamic_parameters: BatchingHttpSinkDynamicParameters, progress: SinkProgress) -> BatchingHttpSink:
        return cls(context, parameters, dynamic_parameters, progress)

    def __init__(
        self,
        context: SinkContext,
        parameters: BatchingHttpSinkParameters,
        dynamic_parameters: BatchingHttpSinkDynamicParameters,
        progress: SinkProgress,
        *,
        transport_factory: TransportFactory = curl_transport,
    ) -> None:
        path = parameters.dead_letter_path
        super().__init__(context, progress, payload_column=parameters.payload_column,
                         limits=encoded_limits(parameters),
                         max_in_flight=parameters.max_in_flight or client_concurrency(parameters),
                         status_path=f"/sinks/{context.sink_id}/{STATUS_SUFFIX}",
                         dead_letters=context.dead_letters.open(path) if path is not None else None)
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._transports = http_attempts.ClientsByScheme(lambda scheme: transport_factory(scheme, parameters))
        self._json = parameters.encoding != "raw"
        self._json_lines = parameters.encoding == "json_lines"
        self._headers = self._fixed_headers(parameters)
        labels = (context.sink_id, SINK_CLASS)
        metrics = context.metrics.sink
        self._m_batches = metrics.batches.labels(*labels)
        self._m_records = metrics.records.labels(*labels)
        self._m_bytes = metrics.bytes.labels(*labels)
        self._m_dead_letters = metrics.dead_letters.labels(*labels)
        self._responses = http_attempts.ResponseCounters(metrics, labels)
        self._loop = DeliveryLoop(
            context.clock, DeliveryHooks(self._request, self._judge, self._attempt_failed, self._give_up,
                                         self._succeed, self._stopped_before, self._pause_until),
            kind=KIND, url=lambda: parameters.url, transport=self._transports.get, dynamic=lambda: self._dynamic,
            pauses=http_attempts.EndpointPauses(context.clock, metrics.retry_after.labels(*labels),
                                                metrics.retry_after_invalid.labels(*labels)),
            throttle=http_attempts.sink_throttler(context, parameters.throttler_id, parameters.throttler_class_id),
            max_redirects=parameters.max_redirect_count, requests=metrics.requests.labels(*labels),
            retries=metrics.retries.labels(*labels),
            attempt_seconds=context.metrics.attempt_duration.labels(context.sink_id))

    @staticmethod
    def _fixed_headers(parameters: BatchingHttpSinkParameters) -> tuple[str, ...]:
        """The headers of every request: the Spec's, the encoding's ``Content-Type`` unless the Spec
        sets one, and ``Content-Encoding: gzip`` with gzip."""
        headers = [f"{name}: {value}" for name, value in parameters.headers.items()]
        content_type = parameters.content_type
        if content_type is not None and not any(name.lower() == "content-type" for name in parameters.headers):
            headers.append(f"Content-Type: {content_type}")
        if parameters.content_encoding == "gzip":
            headers.append("Content-Encoding: gzip")
        return tuple(headers)

    def reconfigure(self, dynamic_parameters: BatchingHttpSinkDynamicParameters) -> None:
        """Apply new dynamic parameters to every later decision, batches already retrying included."""
        self._dynamic = dynamic_parameters

    # -- hooks of BatchedSink --------------------------------------------------------------

    def _record_of(self, payload: Any) -> bytes | UnfitRecord:
        if isinstance(payload, str):
            record = payload.encode()
        elif isinstance(payload, bytes):
            record = payload
        else:
            return UnfitRecord(PAYLOAD_TYPE_ERROR)
        if self._json:
            if not record:
                return UnfitRecord(EMPTY_JSON_VALUE, record)
            if self._json_lines and b"\n" in record:
                return UnfitRecord(NEWLINE_IN_JSON_LINE, record)
        return record

    def _batch_key(self, batch: Batch) -> str:
        return batch_idempotency_key(batch.first_record_id(), batch.last_record_id())

    def takes_chunks(self, column: str) -> bool:
        """``ChunkSink``: byte chunks of ``column``'s lines are sliced into bodies when that column is the
        payload and the encoding JSON lines (where a body is each record and its newline)."""
        return self._json_lines and column == self._payload_column

    def _closed(self) -> None:
        self._transports.close()

    # -- one batch ---------------------------------------------------------------------------

    async def _body(self, batch: Batch) -> bytes:
        """The batch's request body, encoded once for all its attempts (gzip off the event loop)."""
        parameters = self._parameters
        if batch.lines:
            body = batch.line_body()
            if parameters.content_encoding != "gzip":
                return body
            return await asyncio.to_thread(gzip.compress, body, parameters.compression_level, mtime=0)
        if parameters.content_encoding != "gzip":
            return encode_body(batch.records, parameters.encoding)
        return await asyncio.to_thread(_gzip_body, batch.records, parameters.encoding, parameters.compression_level)

    async def _deliver(self, batch: Batch) -> None:
        """Attempts until a 2xx or the budget ends (:class:`~egress.connectors.sinks.delivery.DeliveryLoop`).
        A pause of the endpoint before the first attempt does not use the budget."""
        batch.body = await self._body(batch)
        await self._loop.wait_for_endpoint(batch, self._parameters.url, NO_DEADLINE)
        self._m_batches.inc()
        await self._loop.run(batch, PolicyRetries(lambda: self._dynamic, self._context.clock.monotonic()))

    # -- the hooks of its DeliveryLoop ------------------------------------------------------

    def _request(self, batch: Batch, url: str, timeout: float) -> Request:
        name = self._parameters.idempotency_header
        headers = (*self._headers, f"{name}: {self._batch_key(batch)}") if name else self._headers
        assert batch.body is not None
        return Request(url, batch.body, headers, timeout=timeout,
                       capture_location=self._parameters.max_redirect_count > 0,
                       capture_retry_after=self._dynamic.respect_retry_after)

    def _judge(self, batch: Batch, response: Response) -> AttemptFailure | None:
        """Count ``response`` in the metrics and judge it (``http_attempts.response_error``)."""
        self._responses.count(response)
        return http_attempts.response_error(response, follow_redirects=self._parameters.max_redirect_count > 0)

    def _attempt_failed(self, batch: Batch, failure: AttemptFailure) -> None:
        batch.attempts.append(http_attempts.failed_attempt(self._context.clock.now(), failure))
        self._context.status.set_error(self._status_path, batch.first_seq,
                                       f"Batching HTTP POST of {self._batch_key(batch)} failed: {failure}")

    def _succeed(self, batch: Batch) -> None:
        self._m_records.inc(batch.record_count)
        self._m_bytes.inc(batch.body_bytes)
        self._acknowledge(batch)

    async def _pause_until(self, batch: Batch, when: float) -> None:
        clock = self._context.clock
        while clock.monotonic() < when:
            await clock.sleep_until(when)

    def _give_up(self, batch: Batch, exhausted: str, attempts: int, last_error: AttemptFailure | None) -> None:
        """The batch failed for good: its records to the dead-letter file (then acknowledged), or, with
        none, a terminal failure of this instance."""
        reason = POLICY_EXHAUSTED if exhausted == "policy" else DEADLINE_EXHAUSTED
        error = exhausted_error(reason, attempts, last_error)
        if self._dead_letters is None:
            self._fail(batch, error)
            return
        self._dead_letter(batch, self._batch_key(batch), batch.attempts, error)

    def _count_dead_letters(self, lines: int) -> None:
        self._m_dead_letters.inc(lines)


def _gzip_body(records: list[bytes], encoding: str, level: int) -> bytes:
    """``encode_body`` gzip'd (``mtime`` 0, so the same batch gives the same bytes in every process)."""
    return gzip.compress(encode_body(records, encoding), compresslevel=level, mtime=0)


__all__ = ["BatchingHttpSink", "BatchingHttpSinkDynamicParameters", "BatchingHttpSinkParameters",
           "batch_idempotency_key", "encode_body"]
