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
from urllib.parse import urlsplit

from egress.connectors.base import SINKS, SinkContext, single_input_stream
from egress.connectors.dead_letters import Attempt, DeadLetter, check_dead_letter_path
from egress.connectors.sinks import http_attempts
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.connectors.sinks.ordering import fresh_messages
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import DeliveryError, SpecError
from egress.httpclient import CurlClient, Request, Response
from egress.httpclient.curl import Completions, post_header_lines
from egress.httpclient.outcomes import AttemptFailure, FailureKind, failure_of, sender_failure, status_failure
from egress.httpclient.redirects import RedirectError
from egress.httpclient.retry_after import endpoint_of
from egress.httpclient.transport import HttpTransport, submit_many
from egress.keys import idempotency_key
from egress.spec import StreamSpec
from egress.throttler.errors import ThrottlerError

STATUS_SUFFIX = "async_http_sink"
PAYLOAD_TYPE_ERROR = "Async HTTP payload column must contain a String or null value"
POLICY_EXHAUSTED = "Async HTTP POST retry policy exhausted"
DEADLINE_EXHAUSTED = "Async HTTP POST retry deadline exhausted"
# Concurrent requests of a client that keeps no connections (keep_alive false or
# max_idle_connections 0): each opens its own, so this bounds sockets and ephemeral ports.
UNPOOLED_MAX_CONNECTIONS = 64
# Deliveries about to send or sending, per unit of client concurrency. A delivery waiting for a
# connection gains nothing from being a task already, and a task costs kilobytes: this bounds the
# memory of a large backlog. Deliveries pausing between attempts do not count, so a burst of
# failures never holds back fresh messages (upstream sends every message of an epoch at once).
SEND_WINDOW_PER_CONNECTION = 4


TransportFactory = Callable[[str, AsyncHttpSinkParameters], HttpTransport]
_new_tuple = tuple.__new__


def client_concurrency(parameters: AsyncHttpSinkParameters) -> int:
    """Requests one client runs at once: its pool size with keep-alive (see ``docs/http-sink.md``)."""
    pooled = parameters.keep_alive and parameters.max_idle_connections > 0
    return parameters.max_idle_connections if pooled else UNPOOLED_MAX_CONNECTIONS


def curl_transport(scheme: str, parameters: AsyncHttpSinkParameters) -> HttpTransport:
    """One libcurl client per scheme per sink instance (upstream: an HTTP and an HTTPS client).

    With keep-alive, the client holds at most ``max_idle_connections`` connections and runs that
    many requests at once, reusing them; see ``docs/http-sink.md`` for why the pool size is also
    the concurrency per client.
    """
    pooled = parameters.keep_alive and parameters.max_idle_connections > 0
    return CurlClient(
        max_connections=client_concurrency(parameters),
        keep_alive=pooled,
        ca_file=parameters.tls_ca_file if scheme == "https" else None,
    )


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
class AsyncHttpSink:
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
            return [SpecError(
                f'Async HTTP sink payload column "{parameters.payload_column}" must be the only String column',
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
        self._transport_factory = transport_factory
        self._last_distributed_seq = progress.max_persisted_seq_no
        self._pending: collections.deque[_Delivery] = collections.deque()
        self._waiting: collections.deque[_Delivery] = collections.deque()  # beyond max_in_flight
        self._running = 0
        self._sending = 0  # running deliveries not pausing between attempts
        self._send_window = SEND_WINDOW_PER_CONNECTION * client_concurrency(parameters)
        self._terminal: tuple[int, str] | None = None
        self._endpoint = endpoint_of(parameters.url)
        self._resume: asyncio.Task[None] | None = None  # starts first attempts when their endpoint's pause ends
        self._transports: dict[str, HttpTransport] = {}
        self._default_transport: HttpTransport | None = None  # the transport of parameters.url
        self._completions: Completions | None = None  # where first attempts' responses go, in batches
        self._closed = False
        self._held = False  # hold(): no delivery starts until resume()
        # Every POST's header lines but the idempotency key, built once (post_header_lines).
        self._headers = post_header_lines((f"{name}: {value}" for name, value in parameters.headers.items()),
                                          (parameters.idempotency_header,))
        self._idempotency_prefix = f"{parameters.idempotency_header}: " if parameters.idempotency_header else ""
        self._throttle = http_attempts.sink_throttler(context, parameters.throttler_id, parameters.throttler_class_id)
        self._status_path = f"/sinks/{context.sink_id}/{STATUS_SUFFIX}"
        sink_id = context.sink_id
        metrics = context.metrics
        self._requests = metrics.http_sink_requests.labels(sink_id)
        self._retries = metrics.http_sink_retries.labels(sink_id)
        self._delivered = metrics.http_sink_delivered.labels(sink_id)
        self._attempt_seconds = metrics.attempt_duration.labels(sink_id)
        # Endpoints that asked to wait (Retry-After), until when.
        self._pauses = http_attempts.EndpointPauses(context.clock, metrics.http_sink_retry_after.labels(sink_id),
                                                    metrics.http_sink_retry_after_invalid.labels(sink_id))
        path = parameters.dead_letter_path
        self._dead_letters = context.dead_letters.open(path) if path is not None else None
        self._dead_lettered = metrics.http_sink_dead_letters.labels(sink_id)
        self._responses = http_attempts.ResponseCounters(metrics.http_sink_responses, sink_id,
                                                         metrics.http_sink_attempt_failures.labels(sink_id),
                                                         metrics.http_sink_transport_errors)

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
            self._context.on_progress()

    def hold(self) -> None:
        """Start no delivery until :meth:`resume` (those running go on, retries included)."""
        self._held = True

    def resume(self) -> None:
        """Start the deliveries held back by :meth:`hold`."""
        if self._held:
            self._held = False
            self._start_waiting()

    @property
    def in_flight(self) -> int:
        """Deliveries started and not finished (acknowledged or failed for good)."""
        return self._running

    def take_acknowledged(self) -> SinkProgress:
        """Advance over the acknowledged deliveries at the head of the queue (in ``seq`` order: one not
        yet acknowledged stops it) and return the new prefix; those deliveries are released."""
        pending = self._pending
        last: _Delivery | None = None
        while pending and pending[0].done:
            last = pending.popleft()
        if last is not None:
            self._progress = SinkProgress(self._progress.producer_id, last.message_id, last.seq)
        return self._progress

    def progress(self) -> SinkProgress:
        return self._progress

    def committed(self, progress: SinkProgress) -> None:
        """Nothing to do: every delivery starts as soon as its message is distributed."""

    def flush(self) -> None:
        """Nothing to do: nothing is buffered, every delivery starts when its message is distributed."""

    @property
    def unacknowledged(self) -> int:
        """Distributed messages not in :meth:`progress` (delivered since or not), as the protocol says."""
        return len(self._pending)

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
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()
        self._default_transport = None

    # -- scheduling --------------------------------------------------------------------------

    def _start_waiting(self) -> None:
        if not self._waiting or self._held or self._first_attempts_paused():
            return
        limit = self._parameters.max_in_flight
        fast = not (self._parameters.max_redirect_count or self._throttle is not None)
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
        until = self._pause_end(self._endpoint)
        if until is None:
            return False
        if self._resume is None:
            self._resume = asyncio.get_running_loop().create_task(self._resume_first_attempts(until))
        return True

    async def _resume_first_attempts(self, until: float) -> None:
        await self._context.clock.sleep_until(until)
        self._resume = None
        self._start_waiting()  # checks the pause again: a later response may have extended it

    def _pause_end(self, endpoint: tuple[str, str, int]) -> float | None:
        """The ``clock.monotonic()`` at which ``endpoint``'s pause ends, ``None`` when it has none now."""
        return self._pauses.end(endpoint)

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
            completions = self._completions = Completions(asyncio.get_running_loop(), self._first_attempts_done,
                                                          _is_cancelled)
        self._requests.inc(len(deliveries))
        prefix, headers = self._idempotency_prefix, self._headers
        requests: list[tuple[Request, _Delivery]] = []
        for delivery in deliveries:
            delivery.first_attempt = True
            lines = (prefix + idempotency_key(delivery.message_id), *headers) if prefix else headers
            # tuple.__new__: a Request without the NamedTuple's Python-level __new__ and its keywords
            # (per message); the fields in Request's order: url, body, headers, timeout, capture_body,
            # capture_location, capture_headers, method, capture_retry_after, prepared, capture_local_port.
            requests.append((_new_tuple(Request, (url, delivery.body, lines, timeout, False, False, False, "POST",
                                                  capture_retry_after, True, False)), delivery))
        futures = submit_many(self._transport(url), requests, completions)
        for delivery, future in zip(deliveries, futures, strict=False):
            delivery.task = future  # only on a transport without submit_many: _block may cancel it

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
                               retry_after=self._retry_after_of(self._parameters.url, response))
        if run_length:
            observe(now - run_started, run_length)
        for code, count in statuses.items():
            self._responses.count_status(code, count)
        if succeeded:
            self._running -= succeeded
            self._sending -= succeeded
            self._delivered.inc(succeeded)
            self._context.on_progress()
        if self._waiting:
            self._start_waiting()

    def _continue(self, delivery: _Delivery, *, attempts: int, last_error: AttemptFailure | None,
                  retry_after: float = 0.0) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(delivery, attempts, last_error, retry_after))
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

    async def _wait_for_endpoint(self, delivery: _Delivery, url: str, deadline: float) -> None:
        """Wait while the endpoint of ``url`` asked to wait (``Retry-After``), at most until
        ``deadline`` (``clock.monotonic()`` seconds): no attempt to a pausing endpoint starts."""
        endpoint = endpoint_of(url)
        while (until := self._pause_end(endpoint)) is not None and self._context.clock.monotonic() < deadline:
            await self._pause_until(delivery, min(until, deadline))

    def _transport(self, url: str) -> HttpTransport:
        if url is self._parameters.url and self._default_transport is not None:
            return self._default_transport  # every first attempt: no URL parsing per message
        scheme = urlsplit(url).scheme.lower()
        transport = self._transports.get(scheme)
        if transport is None:
            transport = self._transports[scheme] = self._transport_factory(scheme, self._parameters)
        if url is self._parameters.url:
            self._default_transport = transport
        return transport

    # -- one delivery ------------------------------------------------------------------------

    def _headers_of(self, delivery: _Delivery) -> tuple[str, ...]:
        """The header lines of every POST of ``delivery`` (``prepared``: see ``post_header_lines``)."""
        if not self._idempotency_prefix:
            return self._headers
        return (self._idempotency_prefix + idempotency_key(delivery.message_id), *self._headers)

    async def _deliver(self, delivery: _Delivery, attempts: int, last_error: AttemptFailure | None,
                       retry_after: float = 0.0) -> None:
        """Attempts until a 2xx or the budget ends (upstream ``TAsyncHttpSink`` delivery loop).

        ``attempts`` were already made (the first-attempt fast path), the last failing with
        ``last_error`` after asking (``Retry-After``) for ``retry_after`` seconds; the deadline
        counts from ``delivery.started``.
        """
        assert delivery.body is not None
        clock = self._context.clock
        headers = self._headers_of(delivery)
        start = delivery.started
        redirects = [0]  # counted across all attempts of this delivery
        while True:
            if last_error is not None:
                self._note_attempt(delivery, last_error)
            if last_error is not None and not await self._pause_after_failure(delivery, attempts, last_error,
                                                                              retry_after):
                return
            dynamic = self._dynamic  # read at every decision: DynamicSpec changes apply live
            deadline = start + dynamic.request_timeout
            if attempts >= dynamic.max_attempt_count or clock.monotonic() >= deadline:  # changed while pausing
                self._fail(delivery, _exhausted(POLICY_EXHAUSTED, attempts, last_error))
                return
            if self._pauses:
                await self._wait_for_endpoint(delivery, self._parameters.url, deadline)
                if clock.monotonic() >= deadline:  # the endpoint asked to wait past this delivery's deadline
                    self._fail(delivery,
                               _exhausted(DEADLINE_EXHAUSTED, attempts, last_error))
                    return
            if self._throttle is not None:
                # The global rate's wait is not part of the attempt: its budget starts once granted.
                try:
                    await self._throttle.throttle(1)
                except ThrottlerError as error:  # the controller stayed away past its retry budget
                    attempts += 1
                    last_error, retry_after = sender_failure(FailureKind.THROTTLER, f"throttler: {error}"), 0.0
                    continue
            remaining = max(0.0, deadline - clock.monotonic())
            attempts += 1
            if attempts > 1:
                self._retries.inc()
            last_error, retry_after = await self._attempt(delivery, headers, min(dynamic.attempt_timeout, remaining),
                                                          redirects)
            if last_error is None:
                self._succeed(delivery)
                return

    async def _pause_after_failure(self, delivery: _Delivery, attempts: int, last_error: AttemptFailure,
                                   retry_after: float) -> bool:
        """The verdict after failed attempt number ``attempts``; True once the pause before the next
        attempt is over, False when the delivery has ended (terminal, or an earlier one was).

        In upstream's order, and at the instant the attempt failed: no attempt left → retry policy
        exhausted; the next backoff would reach ``request_timeout`` → retry deadline exhausted. Else
        the pause is the backoff, or the ``retry_after`` seconds the response asked for if longer; a
        ``Retry-After`` that reaches the deadline is waited out to the deadline, which then ends the
        delivery with retry deadline exhausted.
        """
        self._context.status.set_error(self._status_path, delivery.seq, f"Async HTTP POST failed: {last_error}")
        clock = self._context.clock
        plan = http_attempts.plan_retry(self._dynamic, attempts, delivery.started, clock.monotonic(), retry_after)
        if plan.exhausted is not None:
            reason = POLICY_EXHAUSTED if plan.exhausted == "policy" else DEADLINE_EXHAUSTED
            self._fail(delivery, _exhausted(reason, attempts, last_error))
            return False
        await self._pause_until(delivery, plan.until)
        if self._terminal is not None and self._terminal[0] < delivery.seq:
            return False  # an earlier delivery failed for good: no later message is POSTed
        if plan.asked_longer and clock.monotonic() >= delivery.started + self._dynamic.request_timeout:
            self._fail(delivery, _exhausted(DEADLINE_EXHAUSTED, attempts, last_error))
            return False
        return True

    async def _attempt(self, delivery: _Delivery, headers: tuple[str, ...], budget: float,
                       redirects: list[int]) -> tuple[AttemptFailure | None, float]:
        """One attempt: POST to ``url`` and follow redirects within ``budget`` seconds.

        Returns ``None`` after a 2xx whose body was read completely, else the error that makes the
        attempt fail, with the seconds its last response asked to wait (``Retry-After``; 0 without).
        ``redirects[0]`` counts redirects followed across attempts. A request to an endpoint that
        asked to wait starts only when the pause ends, within ``budget``.
        """
        assert delivery.body is not None
        clock = self._context.clock
        deadline = clock.monotonic() + budget
        url = self._parameters.url
        follow = self._parameters.max_redirect_count > 0
        while True:
            if self._pauses:
                await self._wait_for_endpoint(delivery, url, deadline)
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return sender_failure(FailureKind.TIMEOUT, http_attempts.ATTEMPT_TIMED_OUT), 0.0
            self._requests.inc()
            sent = clock.monotonic()
            response = await self._transport(url).submit(
                Request(url, delivery.body, headers, timeout=remaining, capture_location=follow,
                        capture_retry_after=self._dynamic.respect_retry_after, prepared=True,
                        capture_local_port=False))
            self._attempt_seconds.observe(clock.monotonic() - sent)
            error = self._judge(response)
            if error is not http_attempts.FOLLOW:
                return error, self._retry_after_of(url, response)
            if redirects[0] >= self._parameters.max_redirect_count:
                return status_failure(response.status), 0.0
            assert response.location is not None
            redirects[0] += 1
            try:
                url = http_attempts.follow_location(url, response.location, "Async HTTP sink")
            except RedirectError as failure:
                return sender_failure(FailureKind.REDIRECT, str(failure)), 0.0
            if self._throttle is not None:
                await self._throttle.throttle(1)  # a redirected POST is a request to the endpoint too

    def _retry_after_of(self, url: str, response: Response) -> float:
        """The seconds a 429 or 503 from ``url`` asked to wait (``http_attempts.EndpointPauses.asked``), its endpoint
        paused until then."""
        return self._pauses.asked(endpoint_of(url), response, self._dynamic)

    def _judge(self, response: Response) -> AttemptFailure | None:
        """Count ``response`` in the metrics; ``None`` for a complete 2xx, ``http_attempts.FOLLOW`` for a redirect
        to follow, else why the attempt failed (``http_http_attempts.response_error``)."""
        self._responses.count_status(response.status)
        failure = http_attempts.response_error(response, follow_redirects=self._parameters.max_redirect_count > 0)
        if failure is not None:
            self._responses.count_failure(failure)
        return failure

    def _succeed(self, delivery: _Delivery) -> None:
        """A delivery whose later attempt succeeded (first attempts: :meth:`_first_attempts_done`)."""
        delivery.done = True
        self._delivered.inc()
        self._context.status.clear_error(self._status_path, delivery.seq)
        self._context.on_progress()

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
        self._context.on_progress()

    # -- dead letters ------------------------------------------------------------------------

    def _note_attempt(self, delivery: _Delivery, failure: AttemptFailure) -> None:
        """Keep a failed attempt for the dead-letter line (only when there is a dead-letter file)."""
        if self._dead_letters is None:
            return
        if delivery.attempts is None:
            delivery.attempts = []
        delivery.attempts.append(http_attempts.failed_attempt(self._context.clock.now(), failure))

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
        self._context.on_progress()


def _exhausted(message: str, attempts: int, last_error: AttemptFailure | None) -> str:
    """The terminal error of a delivery whose budget ended (upstream's wording)."""
    return str(DeliveryError(message, attempts=attempts, last_error=last_error.message if last_error else None))


# Whether a queued first attempt was dropped (``_Delivery.cancelled``): asked per request, so a C
# attribute getter rather than a Python function.
_is_cancelled: Callable[[_Delivery], bool] = operator.attrgetter("cancelled")


__all__ = ["AsyncHttpSink", "AsyncHttpSinkDynamicParameters", "AsyncHttpSinkParameters", "HttpTransport"]
