"""The async HTTP sink (Flow's ``NYT::NFlow::TAsyncHttpSink``, alias ``async_http``).

Each committed message of the sink's input stream is POSTed with its payload column as the body,
byte for byte, and an idempotency header carrying the upper-case hex of its message id. POSTs run
concurrently; acknowledgements advance only as a contiguous prefix in ``seq`` order, and that
prefix is what the partition job commits as ``max_persisted_seq_no``. A delivery that exhausts
its retry budget is terminal for this sink instance, at the instant its last permitted attempt fails:
nothing after it is acknowledged or POSTed until the sink is recreated (a restart); with
``dead_letter_path`` it is written to that file instead, then acknowledged in order
(``egress.connectors.dead_letters``). Beyond upstream, a 429 or 503 with ``Retry-After`` pauses every
new attempt to its endpoint (scheme, host, port). The rules, case by case: ``docs/http-sink.md``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import operator
from collections.abc import Callable
from typing import Any, ClassVar

from egress.connectors.base import SINKS, SinkContext, single_input_stream
from egress.connectors.dead_letters import Attempt, DeadLetter, check_dead_letter_path
from egress.connectors.sinks import http_attempts
from egress.connectors.sinks.delivery import DeliveryHooks, DeliveryLoop, PolicyRetries, exhausted_error
from egress.connectors.sinks.holding import HeldStarts
from egress.connectors.sinks.http_attempts import client_concurrency, curl_transport
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.connectors.sinks.ordering import fresh_messages
from egress.connectors.sinks.sink_traces import SinkTraces
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import SpecError
from egress.httpclient import Request, Response
from egress.httpclient.curl import Completions, post_header_lines
from egress.httpclient.outcomes import AttemptFailure, failure_of
from egress.httpclient.retry_after import endpoint_of
from egress.httpclient.transport import HttpTransport, submit_many
from egress.keys import idempotency_key
from egress.observe import tracing as _tracing
from egress.spec import StreamSpec

STATUS_SUFFIX = "async_http_sink"
SINK_CLASS = "async_http"  # the sink_class label of its metrics
PAYLOAD_TYPE_ERROR = "Async HTTP payload column must contain a String or null value"
POLICY_EXHAUSTED = "Async HTTP POST retry policy exhausted"
DEADLINE_EXHAUSTED = "Async HTTP POST retry deadline exhausted"
# Deliveries about to send or sending, per unit of client concurrency. A delivery waiting for a
# connection gains nothing from being a task already, and a task costs kilobytes: this bounds the
# memory of a large backlog. Deliveries pausing between attempts do not count, so a burst of
# failures never holds back fresh messages (upstream sends every message of an epoch at once).
SEND_WINDOW_PER_CONNECTION = 4
# Unacknowledged messages per unit of client concurrency at which the partition job stops reading
# (BoundsUnacknowledged): enough to keep every connection busy across a few epochs' commits, and
# not the run's max_unacknowledged (8192, which batching sinks need): held in memory, bodies and
# all, they were most of the peak RSS of a backlog's drain (docs/benchmarks.md, session 10).
UNACKNOWLEDGED_PER_CONNECTION = 32


TransportFactory = Callable[[str, AsyncHttpSinkParameters], HttpTransport]
_new_tuple = tuple.__new__


class _Delivery:
    __slots__ = ("attempts", "body", "cancelled", "done", "first_attempt", "message_id", "pausing", "seq",
                 "started", "task")

    def __init__(self, seq: int, message_id: bytes, body: bytes | None) -> None:
        self.seq = seq
        self.message_id = message_id
        self.body = body
        self.done = body is None  # a null payload is acknowledged in order without a request
        self.pausing = False  # between attempts: not counted in the send window
        self.started = 0.0  # clock.monotonic() of the first attempt: the request_timeout origin
        # The task of the attempts after the first (or of every attempt with redirects or a throttler);
        # a first attempt has a future here only on a transport without submit_many.
        self.task: asyncio.Future[Any] | None = None
        self.first_attempt = False  # its first attempt is in flight on the batch path (_start_first_attempts)
        self.cancelled = False  # dropped before its first attempt ended: its response is ignored
        self.attempts: list[Attempt] | None = None  # failed attempts, kept for a dead-letter file only


@SINKS.register("NYT::NFlow::TAsyncHttpSink", "async_http")
class AsyncHttpSink(HeldStarts):
    """One instance per sink per partition job. See the module docs for the contract."""

    parameters_model: ClassVar[type[AsyncHttpSinkParameters]] = AsyncHttpSinkParameters
    dynamic_parameters_model: ClassVar[type[AsyncHttpSinkDynamicParameters]] = AsyncHttpSinkDynamicParameters

    @classmethod
    def check(cls, parameters: AsyncHttpSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """Upstream construction checks: one input stream whose only column is the payload string."""
        stream = single_input_stream("Async HTTP sink", input_streams)
        if isinstance(stream, SpecError):
            return [stream]
        if len(stream.columns) != 1:
            return [SpecError(f"Async HTTP sink expects exactly one payload column, got {len(stream.columns)}",
                              path="parameters/payload_column")]
        column = stream.columns[0]
        if column.name != parameters.payload_column or column.type != "string":
            [stream_id] = input_streams
            fix = ('make it a string column' if column.name == parameters.payload_column
                   else f'set payload_column to "{column.name}" or rename the column')
            return [SpecError(
                f'Async HTTP sink payload column "{parameters.payload_column}" must be the only String column: '
                f'stream "{stream_id}" has the one column "{column.name}" ({column.type}); {fix}',
                path="parameters/payload_column")]
        return check_dead_letter_path(parameters.dead_letter_path)

    @classmethod
    def redrive_progress(cls, letters: list[DeadLetter]) -> SinkProgress:
        """Where a new instance starts to re-send ``letters`` as messages ``seq`` 1..n (``egress
        redrive``): nothing persisted; each message keeps its id, so its idempotency key."""
        return SinkProgress()

    @classmethod
    def create(
        cls,
        context: SinkContext,
        parameters: AsyncHttpSinkParameters,
        dynamic_parameters: AsyncHttpSinkDynamicParameters,
        progress: SinkProgress,
    ) -> AsyncHttpSink:
        return cls(context, parameters, dynamic_parameters, progress)

    def __init__(
        self,
        context: SinkContext,
        parameters: AsyncHttpSinkParameters,
        dynamic_parameters: AsyncHttpSinkDynamicParameters,
        progress: SinkProgress,
        *,
        transport_factory: TransportFactory = curl_transport,
    ) -> None:
        self._context = context
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._progress = progress
        self._last_distributed_seq = progress.max_persisted_seq_no
        self._pending: collections.deque[_Delivery] = collections.deque()
        self._waiting: collections.deque[_Delivery] = collections.deque()  # beyond max_in_flight
        self._running = 0
        self._sending = 0  # running deliveries not pausing between attempts
        self._send_window = SEND_WINDOW_PER_CONNECTION * client_concurrency(parameters)
        self._unacknowledged_limit = UNACKNOWLEDGED_PER_CONNECTION * client_concurrency(parameters)
        self._terminal: tuple[int, str] | None = None
        self._endpoint = endpoint_of(parameters.url)
        self._resume: asyncio.Task[None] | None = None  # starts first attempts when their endpoint's pause ends
        self._transports = http_attempts.ClientsByScheme(lambda scheme: transport_factory(scheme, parameters))
        self._default_transport: HttpTransport | None = None  # the transport of parameters.url
        self._completions: Completions | None = None  # where first attempts' responses go, in batches
        self._closed = False
        self._held = False  # hold(): no delivery starts until resume()
        # Every POST's header lines but the idempotency key, built once (post_header_lines).
        self._headers = post_header_lines((f"{name}: {value}" for name, value in parameters.headers.items()),
                                          (parameters.idempotency_header,))
        self._idempotency_prefix = f"{parameters.idempotency_header}: " if parameters.idempotency_header else ""
        self._status_path = f"/sinks/{context.sink_id}/{STATUS_SUFFIX}"
        labels = (context.sink_id, SINK_CLASS)
        metrics = context.metrics.sink
        self._requests = metrics.requests.labels(*labels)
        self._delivered = metrics.records.labels(*labels)
        self._attempt_seconds = context.metrics.attempt_duration.labels(context.sink_id)
        # Endpoints that asked to wait (Retry-After), until when.
        self._pauses = http_attempts.EndpointPauses(context.clock, metrics.retry_after.labels(*labels),
                                                    metrics.retry_after_invalid.labels(*labels))
        path = parameters.dead_letter_path
        self._dead_letters = context.dead_letters.open(path) if path is not None else None
        self._dead_lettered = metrics.dead_letters.labels(*labels)
        self._responses = http_attempts.ResponseCounters(metrics, labels)
        self._throttle = http_attempts.sink_throttler(context, parameters.throttler_id, parameters.throttler_class_id)
        self._loop = DeliveryLoop(
            context.clock, DeliveryHooks(self._request, self._judge, self._attempt_failed, self._give_up,
                                         self._succeed, self._stopped, self._pause_until),
            kind="Async HTTP sink", url=lambda: parameters.url, transport=self._transport,
            dynamic=self._dynamic_parameters, pauses=self._pauses, throttle=self._throttle,
            max_redirects=parameters.max_redirect_count, requests=self._requests,
            retries=metrics.retries.labels(*labels), attempt_seconds=self._attempt_seconds,
            trace=lambda delivery: self._traces.trace_of(delivery.seq, delivery.message_id),
            propagate=parameters.propagate_trace_context)
        self._traces = SinkTraces(context, propagate=parameters.propagate_trace_context)  # tracing on only

    def _dynamic_parameters(self) -> AsyncHttpSinkDynamicParameters:
        return self._dynamic

    # -- the Sink protocol -------------------------------------------------------------------

    def distribute(self, messages: list[OutboxMessage]) -> None:
        """Take committed messages in ``seq`` order and start their deliveries.

        Messages at or below the persisted ``seq`` are acknowledged without a POST (a restart).
        Raises ``ValueError`` for a ``seq`` not above the last distributed one (upstream: a message
        id not greater than the last distributed one is an error).
        """
        column = self._parameters.payload_column
        messages = fresh_messages(messages, self._progress.max_persisted_seq_no, self._last_distributed_seq)
        if messages:
            self._last_distributed_seq = messages[-1].seq
        pending_append, waiting_append = self._pending.append, self._waiting.append
        for message in messages:
            payload = message.row.get(column)
            if type(payload) is str:  # the outbox's payloads: one test for the common case
                delivery = _Delivery(message.seq, message.message_id, payload.encode())
                pending_append(delivery)
                if self._terminal is None:
                    waiting_append(delivery)
                continue
            body = payload.encode() if isinstance(payload, str) else payload
            delivery = _Delivery(message.seq, message.message_id, body if isinstance(body, bytes) else None)
            pending_append(delivery)
            if payload is not None and not isinstance(payload, (str, bytes)):
                self._fail(delivery, PAYLOAD_TYPE_ERROR)
            elif delivery.body is not None and self._terminal is None:
                waiting_append(delivery)
        self._start_waiting()
        if self._pending and self._pending[0].done:
            self._report()

    def progress(self) -> SinkProgress:
        return self._progress

    def _report(self) -> None:
        """Advance over the acknowledged deliveries at the head of the queue (in ``seq`` order: one not
        yet acknowledged stops it), release them, and report the prefix (``SinkContext.on_progress``)."""
        pending = self._pending
        last: _Delivery | None = None
        while pending and pending[0].done:
            last = pending.popleft()
        if last is not None:
            self._progress = SinkProgress(self._progress.producer_id, last.message_id, last.seq)
        self._context.on_progress(self._progress)

    def committed(self, progress: SinkProgress) -> None:
        """Nothing to do: every delivery starts as soon as its message is distributed."""

    def flush(self) -> None:
        """Nothing to do: nothing is buffered, every delivery starts when its message is distributed."""

    @property
    def unacknowledged(self) -> int:
        """Distributed messages not in :meth:`progress` (delivered since or not), as the protocol says."""
        return len(self._pending)

    @property
    def unacknowledged_limit(self) -> int:
        """Unacknowledged messages at which the partition job stops reading (``BoundsUnacknowledged``):
        ``UNACKNOWLEDGED_PER_CONNECTION`` per connection the client runs at once."""
        return self._unacknowledged_limit

    @property
    def terminal_error(self) -> str | None:
        return self._terminal[1] if self._terminal else None

    def reconfigure(self, dynamic_parameters: AsyncHttpSinkDynamicParameters) -> None:
        """Apply new dynamic parameters to every later decision, deliveries already retrying included."""
        self._dynamic = dynamic_parameters

    async def close(self) -> None:
        self._closed = True  # first attempts' responses arriving from now on are ignored
        self._waiting.clear()  # cancelled deliveries must not start waiting ones
        for delivery in self._pending:
            delivery.cancelled = True  # queued first attempts are not sent
        tasks = [d.task for d in self._pending if d.task is not None and not d.task.done()]
        if self._resume is not None:
            tasks.append(self._resume)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let the done callbacks of cancelled first attempts run
        self._transports.close()
        self._default_transport = None

    # -- scheduling --------------------------------------------------------------------------

    def _start_waiting(self) -> None:
        if not self._waiting or self._held or self._first_attempts_paused():
            return
        limit = self._parameters.max_in_flight
        fast = not (self._parameters.max_redirect_count or self._throttle is not None)
        pick = None if _tracing.active is None else self._traces.picker(_tracing.active.sampling)
        first: list[_Delivery] = []
        # One reading of the clock and of the pause for all: nothing here awaits, so neither changes.
        now = self._context.clock.monotonic()
        waiting, window, terminal = self._waiting, self._send_window, self._terminal
        # The counters as locals, stored once: nothing in this loop reads them (_continue only
        # creates a task) or changes the terminal failure.
        running, sending = self._running, self._sending
        while waiting and (limit is None or running < limit) and sending < window:
            delivery = waiting.popleft()
            if terminal is not None and terminal[0] < delivery.seq:
                continue  # nothing later than a terminal failure is POSTed by this instance
            running += 1
            sending += 1
            delivery.started = now
            if fast:
                first.append(delivery)
                if pick is not None and pick(delivery.seq):  # tracing on: its attempts sampled
                    self._traces.sampled.add(delivery.seq)
            else:
                self._continue(delivery, attempts=0, last_error=None)
        self._running, self._sending = running, sending
        if first:
            self._start_first_attempts(first)

    def _first_attempts_paused(self) -> bool:
        """Whether the configured endpoint asked to wait (``Retry-After``). While it does, deliveries
        not yet started stay waiting (their ``request_timeout`` has not begun) and a timer starts them
        when the pause ends."""
        if not self._pauses:
            return False
        until = self._pauses.end(self._endpoint)
        if until is None:
            return False
        if self._resume is None:
            self._resume = asyncio.get_running_loop().create_task(self._resume_first_attempts(until))
        return True

    async def _resume_first_attempts(self, until: float) -> None:
        await self._context.clock.sleep_until(until)
        self._resume = None
        self._start_waiting()  # checks the pause again: a later response may have extended it

    def _start_first_attempts(self, deliveries: list[_Delivery]) -> None:
        """The first attempts of ``deliveries``, as one batch. Without redirects to follow or a
        throttler to wait for, a first attempt is a request with a token and its response comes back
        with the others that finished together, to :meth:`_first_attempts_done`: most deliveries
        succeed at once, and a task or a future per message costs time and memory. Only a failed
        first attempt (or such a sink) gets a task for the rest."""
        dynamic = self._dynamic
        url = self._parameters.url
        timeout = min(dynamic.attempt_timeout, dynamic.request_timeout)
        capture_retry_after = dynamic.respect_retry_after
        completions = self._completions
        if completions is None:
            completions = self._completions = Completions(asyncio.get_running_loop(), self._first_attempts_ended,
                                                          _is_cancelled)
        self._requests.inc(len(deliveries))
        prefix, headers = self._idempotency_prefix, self._headers
        requests: list[tuple[Request, _Delivery]] = []
        traced = self._traces.traced()  # tracing on: the seqs to trace (sampled, or carrying a context)
        for delivery in deliveries:
            delivery.first_attempt = True
            lines = (prefix + idempotency_key(delivery.message_id), *headers) if prefix else headers
            if traced is not None and delivery.seq in traced:
                lines = self._traces.first_attempt(delivery.seq, delivery.message_id, lines)
            # tuple.__new__: a Request without the NamedTuple's Python-level __new__ and its keywords
            # (per message); the fields in Request's order: url, body, headers, timeout, capture_body,
            # capture_location, capture_headers, method, capture_retry_after, prepared, capture_local_port.
            requests.append((_new_tuple(Request, (url, delivery.body, lines, timeout, False, False, False, "POST",
                                                  capture_retry_after, True, False)), delivery))
        futures = submit_many(self._transport(url), requests, completions)
        for delivery, future in zip(deliveries, futures, strict=False):
            delivery.task = future  # only on a transport without submit_many: _block may cancel it

    def _first_attempts_ended(self, batch: list[tuple[_Delivery, Response]]) -> None:
        if self._traces.pending:  # tracing on, a sampled first attempt: its span ends
            self._traces.first_attempts_done(batch)
        self._first_attempts_done(batch)

    def _first_attempts_done(self, batch: list[tuple[_Delivery, Response]]) -> None:
        """The responses of first attempts (a batch of them, in the order they finished): each success
        is acknowledged, each failure goes on in a task of its own; the acknowledgement bookkeeping
        (counters, progress, starting waiting deliveries) runs once per batch."""
        if self._closed:
            return
        succeeded = 0
        status = self._context.status
        # A seq may still show an error from an earlier instance of this sink (a restart): clear it.
        clear = status.error(self._status_path) is not None
        statuses: dict[int, int] = {}  # responses by status, counted once per batch
        now = self._context.clock.monotonic()
        observe = self._attempt_seconds.observe
        # Deliveries started together (one _start_waiting) share ``started``: their durations are
        # observed as one run, not one call per message.
        run_started, run_length = 0.0, 0
        for delivery, response in batch:
            if delivery.cancelled:
                continue  # _block ended it already
            started = delivery.started  # a first attempt starts with its delivery
            if started != run_started:
                if run_length:
                    observe(now - run_started, run_length)
                run_started, run_length = started, 0
            run_length += 1
            delivery.first_attempt = False
            delivery.task = None
            code = response.status
            statuses[code] = statuses.get(code, 0) + 1
            # failure_of, its common case inline; this path runs only without redirects: a 3xx fails the attempt
            if response.error is None and 200 <= code <= 299:
                delivery.done = True
                succeeded += 1
                if clear:
                    status.clear_error(self._status_path, delivery.seq)
            else:
                error = failure_of(response)
                assert error is not None
                self._responses.count_failure(error)
                self._continue(delivery, attempts=1, last_error=error,
                               retry_after=self._loop.retry_after_of(self._parameters.url, response))
        if run_length:
            observe(now - run_started, run_length)
        for code, count in statuses.items():
            self._responses.count_status(code, count)
        if succeeded:
            self._running -= succeeded
            self._sending -= succeeded
            self._delivered.inc(succeeded)
            self._report()
        if self._waiting:
            self._start_waiting()

    def _continue(self, delivery: _Delivery, *, attempts: int, last_error: AttemptFailure | None,
                  retry_after: float = 0.0) -> None:
        """The attempts of ``delivery`` after the ``attempts`` made (the first-attempt fast path), in a task."""
        rules = PolicyRetries(self._dynamic_parameters, delivery.started)
        task = asyncio.get_running_loop().create_task(
            self._loop.run(delivery, rules, attempts, last_error, retry_after))
        delivery.task = task
        task.add_done_callback(lambda _: self._finished(delivery))

    def _finished(self, delivery: _Delivery) -> None:
        self._running -= 1
        if not delivery.pausing:
            self._sending -= 1
        if self._waiting and not asyncio.get_running_loop().is_closed():
            self._start_waiting()

    async def _pause_until(self, delivery: _Delivery, when: float) -> None:
        """Sleep until ``clock.monotonic()`` reaches ``when`` (never less: a deadline check follows),
        outside the send window, so fresh deliveries may start meanwhile."""
        clock = self._context.clock
        delivery.pausing = True
        self._sending -= 1
        self._start_waiting()
        try:
            while clock.monotonic() < when:
                await clock.sleep_until(when)
        finally:
            delivery.pausing = False
            self._sending += 1

    def _transport(self, url: str) -> HttpTransport:
        if url is self._parameters.url and self._default_transport is not None:
            return self._default_transport  # every first attempt: no URL parsing per message
        transport = self._transports.get(url)
        if url is self._parameters.url:
            self._default_transport = transport
        return transport

    # -- one delivery (the hooks of its DeliveryLoop) ----------------------------------------

    def _request(self, delivery: _Delivery, url: str, timeout: float) -> Request:
        """The POST of ``delivery`` to ``url`` (``prepared`` header lines: see ``post_header_lines``)."""
        assert delivery.body is not None
        headers = self._headers
        if self._idempotency_prefix:
            headers = (self._idempotency_prefix + idempotency_key(delivery.message_id), *headers)
        return Request(url, delivery.body, headers, timeout=timeout,
                       capture_location=self._parameters.max_redirect_count > 0,
                       capture_retry_after=self._dynamic.respect_retry_after, prepared=True, capture_local_port=False)

    def _judge(self, delivery: _Delivery, response: Response) -> AttemptFailure | None:
        """Count ``response`` in the metrics; ``None`` for a complete 2xx, ``http_attempts.FOLLOW`` for a redirect
        to follow, else why the attempt failed (``http_attempts.response_error``)."""
        self._responses.count_status(response.status)
        failure = http_attempts.response_error(response, follow_redirects=self._parameters.max_redirect_count > 0)
        if failure is not None:
            self._responses.count_failure(failure)
        return failure

    def _attempt_failed(self, delivery: _Delivery, failure: AttemptFailure) -> None:
        """Keep a failed attempt for the dead-letter line (only with a dead-letter file); show the error."""
        if self._dead_letters is not None:
            if delivery.attempts is None:
                delivery.attempts = []
            delivery.attempts.append(http_attempts.failed_attempt(self._context.clock.now(), failure))
        self._context.status.set_error(self._status_path, delivery.seq, f"Async HTTP POST failed: {failure}")

    def _give_up(self, delivery: _Delivery, exhausted: str, attempts: int, last_error: AttemptFailure | None) -> None:
        reason = POLICY_EXHAUSTED if exhausted == "policy" else DEADLINE_EXHAUSTED
        self._fail(delivery, exhausted_error(reason, attempts, last_error))

    def _stopped(self, delivery: _Delivery) -> bool:
        """Whether an earlier delivery failed for good: no later message is POSTed."""
        return self._terminal is not None and self._terminal[0] < delivery.seq

    def _succeed(self, delivery: _Delivery) -> None:
        """A delivery whose later attempt succeeded (first attempts: :meth:`_first_attempts_done`)."""
        delivery.done = True
        self._delivered.inc()
        self._context.status.clear_error(self._status_path, delivery.seq)
        self._report()

    def _fail(self, delivery: _Delivery, error: str) -> None:
        if self._dead_letters is not None and delivery.body is not None:
            self._dead_letter(delivery, error)  # acknowledged once its line is durable
            return
        self._block(delivery, error)

    def _block(self, delivery: _Delivery, error: str) -> None:
        """Terminal: nothing after ``delivery`` is POSTed or acknowledged by this instance."""
        self._context.status.set_error(self._status_path, delivery.seq, error)
        if self._terminal is None or delivery.seq < self._terminal[0]:
            self._terminal = (delivery.seq, error)
        ended: list[_Delivery] = []
        for later in self._pending:
            if later.seq <= delivery.seq:
                continue
            if later.first_attempt:  # not sent if still queued; its response is ignored if it was
                later.first_attempt = False
                later.cancelled = True
                if later.task is not None:
                    later.task.cancel()
                ended.append(later)
            elif later.task is not None and not later.task.done():
                later.task.cancel()  # its done callback calls _finished
        for later in ended:
            self._finished(later)
        self._report()

    # -- dead letters ------------------------------------------------------------------------

    def _dead_letter(self, delivery: _Delivery, error: str) -> None:
        """Append ``delivery`` to the dead-letter file; acknowledge it once the line is durable, or
        block on it (:meth:`_block`) when the line cannot be written."""
        assert self._dead_letters is not None
        assert delivery.body is not None
        context = self._context
        letter = DeadLetter(context.computation_id, context.sink_id, context.partition, delivery.seq,
                            delivery.message_id, idempotency_key(delivery.message_id), delivery.body,
                            tuple(delivery.attempts or ()), error, context.clock.now())
        written = self._dead_letters.append([letter])
        written.add_done_callback(functools.partial(self._dead_letter_written, delivery, error))

    def _dead_letter_written(self, delivery: _Delivery, error: str, written: asyncio.Future[int]) -> None:
        failure = written.exception()
        if failure is not None:
            assert self._dead_letters is not None
            self._block(delivery, f"{error}; and it cannot be written to the dead-letter file "
                                  f"{self._dead_letters.path}: {failure}")
            return
        delivery.done = True
        delivery.attempts = None
        self._dead_lettered.inc(written.result())
        self._context.status.clear_error(self._status_path, delivery.seq)
        self._report()


# Whether a queued first attempt was dropped (``_Delivery.cancelled``): asked per request, so a C
# attribute getter rather than a Python function.
_is_cancelled: Callable[[_Delivery], bool] = operator.attrgetter("cancelled")


__all__ = ["AsyncHttpSink", "AsyncHttpSinkDynamicParameters", "AsyncHttpSinkParameters", "HttpTransport"]
