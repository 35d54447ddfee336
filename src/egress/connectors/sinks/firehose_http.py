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
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol
from urllib.parse import urlsplit

from egress.connectors.base import SINKS, SinkContext, single_input_stream
from egress.connectors.dead_letters import Attempt, DeadLetter, check_dead_letter_path
from egress.connectors.sinks.firehose_parameters import (
    AccessKeyReference,
    AccessKeyUnavailable,
    FirehoseHttpSinkDynamicParameters,
    FirehoseHttpSinkParameters,
)
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import DeliveryError, SpecError
from egress.firehose import error_output as eo
from egress.firehose import protocol as p
from egress.firehose.errors import ResponseNotAccepted
from egress.firehose.retry import RetryBudget, draw_backoff
from egress.httpclient import CurlClient, Request, Response
from egress.spec import StreamSpec

STATUS_SUFFIX = "firehose_http_sink"
PAYLOAD_TYPE_ERROR = "Firehose HTTP sink payload column must contain a String or null value"
MIB = 1024 * 1024
BODY_FRAME_BYTES = 1024  # requestId, timestamp and braces around the records, generously


class HttpTransport(Protocol):
    """What the sink needs of an HTTP client (``egress.httpclient.CurlClient`` in production)."""

    async def send(self, request: Request) -> Response: ...

    def close(self) -> None: ...


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


@dataclass(slots=True)
class _Batch:
    """Consecutive messages (``first_seq``..``last_seq``, nulls included) and their records."""

    first_seq: int
    last_seq: int = 0
    last_message_id: bytes = b""
    messages: int = 0
    records: list[bytes] = field(default_factory=list)
    record_ids: list[bytes] = field(default_factory=list)
    record_seqs: list[int] = field(default_factory=list)
    arrivals_ms: list[int] = field(default_factory=list)
    data_bytes: int = 0
    json_bytes: int = 0
    oversized: bool = False  # one record over the protocol's limit: never sent
    closed: bool = False
    boundary: bool = False  # closed with records: its last_seq is committed sink state until handled
    done: bool = False
    task: asyncio.Task[None] | None = None
    timer: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class _Failure:
    code: str
    message: str
    permanent: bool = False
    status: int = 0  # the HTTP status that failed the attempt (0: no response)

    def describe(self) -> str:
        """For the status tree and the console: the status, the message, and a hint when the
        endpoint refused the access key."""
        text = f"HTTP {self.status}: {self.message[:500]}" if self.status else self.message[:500]
        if self.status in (401, 403):
            text += " (the endpoint refused the access key: check the sink's access_key and its variable or file)"
        return text


@SINKS.register("firehose_http", "NYT::NFlow::TFirehoseHttpSink")
class FirehoseHttpSink:
    """One instance per sink per partition job. See the module docs for the contract."""

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
            return [SpecError(f'Firehose HTTP sink payload column "{parameters.payload_column}" must be a String '
                              "column of the input stream", path="parameters/payload_column")]
        return check_dead_letter_path(parameters.dead_letter_path)

    @classmethod
    def redrive_progress(cls, letters: list[DeadLetter]) -> SinkProgress:
        """Where a new instance starts to re-send ``letters`` as messages ``seq`` 1..n (``egress
        redrive``): the letters of one batch (consecutive, one request id) as committed batch ends, so
        that they are re-formed into that batch and sent under the same request id, whatever the
        buffering hints are now."""
        ends = [index for index, letter in enumerate(letters, start=1)
                if index == len(letters) or letters[index].idempotency_key != letter.idempotency_key]
        return SinkProgress(sink_state=encode_batch_ends(tuple(ends)))

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
        self._context = context
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._progress = progress
        self._transport_factory = transport_factory
        self._rng = rng or random.Random()
        self._sink_key = f"{context.computation_id}/{context.sink_id}"
        self._last_distributed_seq = progress.max_persisted_seq_no
        # Batch ends committed by an earlier instance, still to be re-formed; and the highest seq whose
        # batch boundary is committed (a batch ending at or below it may be sent).
        self._replay_ends = collections.deque(
            end for end in decode_batch_ends(progress.sink_state) if end > progress.max_persisted_seq_no)
        self._committed_end = self._replay_ends[-1] if self._replay_ends else progress.max_persisted_seq_no
        self._state_ends: tuple[int, ...] = tuple(self._replay_ends)
        self._uncommitted: collections.deque[_Batch] = collections.deque()  # closed, boundary not yet committed
        self._batches: collections.deque[_Batch] = collections.deque()  # in seq order; the last may be open
        self._open: _Batch | None = None
        self._waiting: collections.deque[_Batch] = collections.deque()  # closed, beyond max_in_flight
        self._running = 0
        self._unacknowledged = 0
        self._terminal: tuple[int, str] | None = None
        self._transports: dict[str, HttpTransport] = {}
        self._attributes = parameters.common_attributes_header
        self._errors = eo.ErrorOutput(parameters.error_output) if parameters.error_output else None
        path = parameters.dead_letter_path
        self._dead_letters = context.dead_letters.open(path) if path is not None else None
        self._status_path = f"/sinks/{context.sink_id}/{STATUS_SUFFIX}"
        self._size_limit = parameters.buffering_hints.size_in_mbs * MIB
        self._metrics = context.metrics.firehose
        self._metrics.freshness.sinks.add(self)
        sink_id = context.sink_id
        self._m_batches = self._metrics.batches.labels(sink_id)
        self._m_requests = self._metrics.requests.labels(sink_id)
        self._m_retries = self._metrics.retries.labels(sink_id)
        self._m_records = self._metrics.records.labels(sink_id)
        self._m_bytes = self._metrics.bytes.labels(sink_id)
        self._m_error_records = self._metrics.error_records.labels(sink_id)
        self._m_dead_letters = self._metrics.dead_letters.labels(sink_id)

    @property
    def sink_id(self) -> str:
        return self._context.sink_id

    @property
    def partition(self) -> int:
        return self._context.partition

    # -- the Sink protocol -------------------------------------------------------------------

    def distribute(self, messages: list[OutboxMessage]) -> None:
        """Take committed messages in ``seq`` order into batches; a full batch is closed at once and
        sent once its boundary is committed (:meth:`committed`).

        Messages at or below the persisted ``seq`` are skipped (a restart); messages up to the last
        committed batch end of an earlier instance are batched exactly as it committed them. Raises
        ``ValueError`` for a ``seq`` not above the last distributed one.
        """
        column = self._parameters.payload_column
        now_ms = int(self._context.clock.now() * 1000)
        for message in messages:
            if message.seq <= self._progress.max_persisted_seq_no:
                continue
            if message.seq <= self._last_distributed_seq:
                raise ValueError(
                    f"message seq {message.seq} is not greater than the last distributed {self._last_distributed_seq}")
            self._last_distributed_seq = message.seq
            payload = message.row.get(column)
            if payload is not None and not isinstance(payload, str | bytes):
                if self._open is not None:
                    self._close(self._open)
                batch = self._batch_for(0, 0)
                self._cover(batch, message)
                self._open = None
                batch.closed = True
                if batch.timer is not None:
                    batch.timer.cancel()
                self._fail(batch, PAYLOAD_TYPE_ERROR)
                continue
            if payload is None:
                if self._open is not None:
                    self._cover(self._open, message)
                else:  # nothing buffered before it: acknowledged in order without waiting for a batch
                    batch = self._batch_for(0, 0)
                    self._cover(batch, message)
                    self._close(batch)
                self._close_if_replayed_end(message.seq)
                continue
            data = payload.encode() if isinstance(payload, str) else payload
            if self._replay_ends:  # a batch an earlier instance committed: only its committed end closes it
                batch = self._open if self._open is not None else self._new_batch(timer=False)
                batch.oversized = batch.oversized or len(data) > p.MAX_RECORD_BYTES
            elif len(data) > p.MAX_RECORD_BYTES:
                if self._open is not None:
                    self._close(self._open)
                batch = self._batch_for(len(data), p.record_json_size(len(data)))
                batch.oversized = True
            else:
                batch = self._batch_for(len(data), p.record_json_size(len(data)))
            self._cover(batch, message)
            batch.records.append(data)
            batch.record_ids.append(message.message_id)
            batch.record_seqs.append(message.seq)
            batch.arrivals_ms.append(now_ms)
            batch.data_bytes += len(data)
            batch.json_bytes += p.record_json_size(len(data))
            if self._replay_ends:
                self._close_if_replayed_end(message.seq)
            elif (batch.oversized or batch.data_bytes >= self._size_limit
                    or len(batch.records) >= p.MAX_RECORDS_PER_REQUEST):
                self._close(batch)
        if self._open is not None and self._parameters.buffering_hints.interval_in_seconds == 0:
            self._close(self._open)
        self._start_waiting()
        self._notify_if_acknowledgeable()

    def take_acknowledged(self) -> SinkProgress:
        """Advance over the handled batches at the head (in ``seq`` order: one not yet handled stops it)
        and return the prefix and, as ``sink_state``, the ends of the closed batches not yet in it
        (:func:`encode_batch_ends`) and of those still to be re-formed."""
        batches = self._batches
        last: _Batch | None = None
        while batches and batches[0].done:
            last = batches.popleft()
            self._unacknowledged -= last.messages
        ends = (*(b.last_seq for b in batches if b.boundary), *self._replay_ends)
        if last is not None or ends != self._state_ends:
            self._state_ends = ends
            persisted = self._progress if last is None else SinkProgress(
                self._progress.producer_id, last.last_message_id, last.last_seq)
            self._progress = SinkProgress(persisted.producer_id, persisted.max_persisted_message_id,
                                          persisted.max_persisted_seq_no, encode_batch_ends(ends))
        return self._progress

    def progress(self) -> SinkProgress:
        return self._progress

    def committed(self, progress: SinkProgress) -> None:
        """The batch ends in ``progress.sink_state`` are durable: send the batches they close."""
        ends = decode_batch_ends(progress.sink_state)
        if ends and ends[-1] > self._committed_end:
            self._committed_end = ends[-1]
        uncommitted = self._uncommitted
        while uncommitted and uncommitted[0].last_seq <= self._committed_end:
            self._waiting.append(uncommitted.popleft())
        self._start_waiting()

    @property
    def unacknowledged(self) -> int:
        """Distributed messages not in :meth:`progress` (their batch handled since or not: acknowledged
        by a conforming 200, written to the error output, or only nulls), the open batch's included,
        as the protocol says."""
        return self._unacknowledged

    @property
    def terminal_error(self) -> str | None:
        return self._terminal[1] if self._terminal else None

    def flush(self) -> None:
        """Close the open batch now, whatever its size and age, and start sending it.

        For a caller that knows no more messages are coming soon: the end of a finite input (so
        ``egress run --until-drained`` does not wait ``interval_in_seconds`` for the last partial
        batch), or a partition job that stops reading because this sink holds its
        ``max_unacknowledged`` messages (a batch that cannot fill would otherwise wait for the
        interval). Like every boundary, this one is committed before the batch is sent, so the batch
        is the same after a restart. Does nothing without an open batch.
        """
        if self._open is not None:
            self._close(self._open)
            self._start_waiting()
            self._notify_if_acknowledgeable()

    def reconfigure(self, dynamic_parameters: FirehoseHttpSinkDynamicParameters) -> None:
        """Apply new dynamic parameters (URL, access key, backoff scale) from the next attempt on."""
        self._dynamic = dynamic_parameters

    async def close(self) -> None:
        self._waiting.clear()
        self._uncommitted.clear()
        tasks = [t for b in self._batches for t in (b.task, b.timer) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()
        self._metrics.freshness.sinks.discard(self)

    def oldest_undelivered_age(self) -> float:
        """Seconds since the oldest unacknowledged record arrived (0 when there is none)."""
        for batch in self._batches:
            if not batch.done and batch.arrivals_ms:
                return max(0.0, self._context.clock.now() - batch.arrivals_ms[0] / 1000)
        return 0.0

    # -- batching ----------------------------------------------------------------------------

    def _batch_for(self, data_bytes: int, json_bytes: int) -> _Batch:
        """The open batch if a record of this size fits in it, else a new open batch."""
        batch = self._open
        if batch is not None and data_bytes and batch.records and (
                len(batch.records) >= p.MAX_RECORDS_PER_REQUEST
                or batch.json_bytes + json_bytes + BODY_FRAME_BYTES > p.MAX_REQUEST_BODY_BYTES
                or batch.data_bytes + data_bytes > self._size_limit):
            self._close(batch)
            batch = None
        return batch if batch is not None else self._new_batch(timer=True)

    def _new_batch(self, *, timer: bool) -> _Batch:
        """A new open batch, closed by the interval after now when ``timer`` (and the interval is set)."""
        batch = self._open = _Batch(first_seq=self._last_distributed_seq)
        self._batches.append(batch)
        interval = self._parameters.buffering_hints.interval_in_seconds
        if timer and interval > 0:
            batch.timer = asyncio.get_running_loop().create_task(self._close_after(batch, interval))
        return batch

    def _close_if_replayed_end(self, seq: int) -> None:
        """Close the open batch where an earlier instance committed a batch end."""
        replay = self._replay_ends
        if replay and seq >= replay[0]:
            replay.popleft()
            if self._open is not None:
                self._close(self._open)

    def _cover(self, batch: _Batch, message: OutboxMessage) -> None:
        if not batch.last_seq:
            batch.first_seq = message.seq
        batch.last_seq = message.seq
        batch.last_message_id = message.message_id
        batch.messages += 1
        self._unacknowledged += 1

    async def _close_after(self, batch: _Batch, interval: float) -> None:
        await self._context.clock.sleep(interval)
        batch.timer = None
        if not batch.closed:
            self._close(batch)
            self._start_waiting()
            self._notify_if_acknowledgeable()

    def _close(self, batch: _Batch) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._open is batch:
            self._open = None
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if not batch.records:
            self._handled(batch)  # only null payloads: acknowledged in order without a request
            return
        batch.boundary = True
        if self._terminal is not None:
            return
        if batch.last_seq <= self._committed_end:
            self._waiting.append(batch)
        else:  # sent once the job has committed this boundary (committed())
            self._uncommitted.append(batch)
            self._context.on_progress()

    def _notify_if_acknowledgeable(self) -> None:
        if self._batches and self._batches[0].done:
            self._context.on_progress()

    def _start_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and self._running < self._parameters.max_in_flight:
            batch = self._waiting.popleft()
            if self._terminal is not None and self._terminal[0] < batch.first_seq:
                continue
            self._running += 1
            batch.task = loop.create_task(self._deliver(batch))
            batch.task.add_done_callback(functools.partial(self._finished, batch))

    def _finished(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        self._running -= 1
        if not task.cancelled() and task.exception() is not None:  # a bug: stop rather than lose the batch
            self._fail(batch, f"Firehose HTTP sink internal error: {task.exception()!r}")
        if self._waiting and not asyncio.get_running_loop().is_closed():
            self._start_waiting()

    def _transport(self, url: str) -> HttpTransport:
        scheme = urlsplit(url).scheme.lower()
        transport = self._transports.get(scheme)
        if transport is None:
            transport = self._transports[scheme] = self._transport_factory(scheme, self._parameters)
        return transport

    # -- one batch ---------------------------------------------------------------------------

    async def _deliver(self, batch: _Batch) -> None:
        """Attempts until a conforming 200, a 413, or the end of ``retry_duration``."""
        clock = self._context.clock
        parameters = self._parameters
        if batch.oversized:
            self._give_up(batch, 0, _Failure(eo.RECORD_TOO_LARGE, f"a record is larger than {p.MAX_RECORD_BYTES} "
                                                                  "bytes, the protocol's limit", permanent=True), [])
            return
        request_id = batch_request_id(self._sink_key, batch.record_ids[0], batch.record_ids[-1])
        gzip_body = parameters.content_encoding == "gzip"
        body = await asyncio.to_thread(_encode, request_id, int(clock.now() * 1000), batch.records,
                                       parameters.compression_level if gzip_body else 0)
        budget = RetryBudget(float(parameters.retry_duration))
        tried: list[Attempt] = []  # the failed attempts, for dead letters
        self._m_batches.inc()
        while True:
            dynamic = self._dynamic  # read before every attempt: DynamicSpec changes apply live
            url = dynamic.url or parameters.url
            reference = dynamic.access_key or parameters.access_key
            started = clock.monotonic()
            failure = await self._attempt(url, reference, request_id, body, gzip_body)
            budget.attempt_finished(started, clock.monotonic(), failed=failure is not None)
            if failure is None:
                self._succeed(batch)
                return
            tried.append(Attempt(clock.now(), failure.status or None, f"{failure.code}: {failure.message[:500]}"))
            self._context.status.set_error(self._status_path, batch.first_seq,
                                           f"Firehose HTTP request {request_id} failed: {failure.describe()}")
            if failure.permanent:
                self._give_up(batch, budget.attempts, failure, tried)
                return
            dynamic = self._dynamic
            wait = draw_backoff(budget.attempts - 1, self._rng, initial=dynamic.retry_initial_delay,
                                maximum=dynamic.retry_maximum_delay)
            if not budget.may_retry_after(clock.monotonic(), wait):
                self._give_up(batch, budget.attempts, failure, tried)
                return
            await clock.sleep(wait)
            if self._terminal is not None and self._terminal[0] < batch.first_seq:
                return  # an earlier batch failed for good: nothing later is sent
            self._m_retries.inc()

    async def _attempt(self, url: str, reference: AccessKeyReference | None, request_id: str, body: bytes,
                       gzip_body: bool) -> _Failure | None:
        """One POST; ``None`` for a conforming 200, else why it failed."""
        try:
            key = reference.resolve() if reference is not None else None
        except AccessKeyUnavailable as error:
            return _Failure(eo.DESTINATION_EXCEPTION, str(error))
        headers = p.request_headers(request_id, source_arn=self._parameters.arn, access_key=key,
                                    common_attributes=self._attributes, gzip_body=gzip_body)
        lines = tuple(f"{name}: {value}" for name, value in headers.items())
        self._m_requests.inc()
        response = await self._transport(url).send(
            Request(url, body, lines, timeout=self._parameters.response_timeout, capture_body=True,
                    capture_headers=True))
        if response.status:
            self._metrics.responses.labels(self._context.sink_id, str(response.status)).inc()
        return _judge(response, request_id)

    def _handled(self, batch: _Batch) -> None:
        """Mark ``batch`` done (:meth:`take_acknowledged` takes it once every earlier one is) and release
        its records."""
        batch.done = True
        batch.records, batch.record_ids, batch.record_seqs, batch.arrivals_ms = [], [], [], []

    def _succeed(self, batch: _Batch) -> None:
        self._m_records.inc(len(batch.records))
        self._m_bytes.inc(batch.data_bytes)
        self._handled(batch)
        self._context.status.clear_error(self._status_path, batch.first_seq)
        self._context.on_progress()

    def _give_up(self, batch: _Batch, attempts: int, failure: _Failure, tried: list[Attempt]) -> None:
        """Error output and dead letters, whichever are set (then the batch counts as handled, once they
        are durable), or a terminal failure with neither."""
        error = str(DeliveryError("Firehose HTTP delivery failed", attempts=attempts,
                                  last_error=f"{failure.code}: {failure.describe()}"))
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
            self._given_up(batch)
            return
        written = self._dead_letters.append(self._letters(batch, tried, error))
        written.add_done_callback(functools.partial(self._dead_letters_written, batch))

    def _letters(self, batch: _Batch, tried: list[Attempt], error: str) -> list[DeadLetter]:
        """The dead letters of ``batch``'s records: its request id is their idempotency key."""
        context = self._context
        request_id = batch_request_id(self._sink_key, batch.record_ids[0], batch.record_ids[-1])
        now = context.clock.now()
        return [DeadLetter(context.computation_id, context.sink_id, context.partition, seq, message_id, request_id,
                           record, tuple(tried), error, now)
                for seq, message_id, record in zip(batch.record_seqs, batch.record_ids, batch.records, strict=True)]

    def _dead_letters_written(self, batch: _Batch, written: asyncio.Future[int]) -> None:
        problem = written.exception()
        if problem is not None:
            assert self._dead_letters is not None
            self._fail(batch, f"cannot write the dead-letter file {self._dead_letters.path}: {problem}")
            return
        self._m_dead_letters.inc(written.result())
        self._given_up(batch)

    def _given_up(self, batch: _Batch) -> None:
        self._handled(batch)
        self._context.status.clear_error(self._status_path, batch.first_seq)
        self._context.on_progress()

    def _fail(self, batch: _Batch, error: str) -> None:
        self._context.status.set_error(self._status_path, batch.first_seq, error)
        if self._terminal is None or batch.first_seq < self._terminal[0]:
            self._terminal = (batch.first_seq, error)
        for later in self._batches:
            if later.first_seq > batch.first_seq and later.task is not None and not later.task.done():
                later.task.cancel()
        self._context.on_progress()


def encode_batch_ends(ends: tuple[int, ...]) -> bytes:
    """The sink's committed state: the last ``seq`` of each closed, unacknowledged batch, ascending,
    as a JSON array (``b""`` for none)."""
    return json.dumps(list(ends), separators=(",", ":")).encode() if ends else b""


def decode_batch_ends(state: bytes) -> list[int]:
    """The inverse of :func:`encode_batch_ends`. Raises ``ValueError`` for state this sink did not write."""
    if not state:
        return []
    ends = json.loads(state)
    if not isinstance(ends, list) or not all(type(end) is int for end in ends) or ends != sorted(ends):
        raise ValueError(f"firehose_http sink state is not an ascending list of batch ends: {state[:200]!r}")
    return ends


def _encode(request_id: str, timestamp_ms: int, records: list[bytes], gzip_level: int) -> bytes:
    body = p.encode_request_body(request_id, timestamp_ms, records)
    return p.gzip_compress(body, gzip_level) if gzip_level else body


def _judge(response: Response, request_id: str) -> _Failure | None:
    """Firehose's acceptance rule applied to one response (docs/firehose.md, "Sender").

    ``None`` only for a conforming 200 (:func:`egress.firehose.protocol.check_response` on the status,
    the Content-Type and Content-Encoding headers and the body). Otherwise a :class:`_Failure` with the
    error-output code: no response → ``RequestTimeout`` (curl error 28) or ``ConnectionFailed``; a body
    over 1 MiB → ``ResponseTooLarge``; a 413 → ``DestinationException``, permanent; a 200 that does not
    conform → ``InvalidResponseFromDestination``; any other status → ``DestinationException``. The
    message is the response body (cut to 8,192 characters) or, when there is none to show (a gzip'd
    body is not shown), the reason.
    """
    if response.status == 0:
        error = response.error or "no response"
        code = eo.REQUEST_TIMEOUT if "curl error 28" in error else eo.CONNECTION_FAILED
        return _Failure(code, error)
    body = response.body or b""
    status = response.status
    if response.error is not None:
        return _Failure(eo.DESTINATION_EXCEPTION, f"HTTP {status}: {response.error}")
    if status == 413:
        return _Failure(eo.DESTINATION_EXCEPTION, _text(body) or "HTTP 413", permanent=True, status=status)
    if len(body) > p.MAX_RESPONSE_BODY_BYTES:
        return _Failure(eo.RESPONSE_TOO_LARGE, f"response body of {len(body)} bytes is over 1 MiB", status=status)
    headers = response.headers or {}
    try:
        p.check_response(response.status, body, request_id, content_type=headers.get("content-type"),
                         content_encoding=headers.get("content-encoding"))
    except ResponseNotAccepted as error:
        if status != 200:
            return _Failure(eo.DESTINATION_EXCEPTION, _text(body) or error.reason, status=status)
        return _Failure(eo.INVALID_RESPONSE, _text(error.body) or error.reason, status=status)
    return None


def _text(body: bytes) -> str:
    return body[:p.MAX_ERROR_MESSAGE_CHARS].decode("utf-8", "replace")


__all__ = ["FirehoseHttpSink", "FirehoseHttpSinkDynamicParameters", "FirehoseHttpSinkParameters", "batch_request_id"]
