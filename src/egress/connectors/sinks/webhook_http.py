"""The webhook sink (``webhook_http``): one stream fanned out to many endpoints, each isolated.

Each committed message names its endpoint (``endpoint_column``: an entry of the DynamicSpec's
endpoint table; or ``url_column``: the URL). Per (partition, endpoint) the sink keeps its own
queue, acknowledged prefix, ``max_in_flight``, ``Retry-After`` pauses, throttler and circuit
breaker (``webhook_breaker``), so a failing or slow endpoint holds back only its own messages;
their transfers share one libcurl client per scheme (``webhook_endpoints.SharedClients``). Within
an endpoint, messages of one key go one at a time in ``seq`` order (a later one starts once the
earlier is acknowledged); messages of other keys may overtake a waiting one.

A first attempt is one request handed to libcurl with its delivery as the token, the responses of
a batch back in one callback: no task per message. Only a failed first attempt, or an endpoint whose
breaker is not closed, that asked to wait or that has a throttler, gets a task (``DeliveryLoop``).

Every request is signed per Standard Webhooks (``egress.webhook_signatures``; ``webhook-id`` is the
message's idempotency key, the same after a restart). A delivery that exhausts the retry rules of
the async HTTP sink is dead-lettered with ``dead_letter_path``, else tried again after
``retry_maximum_delay``: it holds its endpoint, never the partition. Committed progress, restart
and memory: ``webhook_endpoints`` and ``docs/webhooks.md``.

With tracing on (``egress.observe.tracing``) each attempt may be a ``delivery attempt`` span naming its
endpoint, and its request carries the message's ``traceparent`` (``sink_traces.EndpointTraces``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, ClassVar

from egress.clock import event_or_timeout
from egress.connectors.base import SINKS, SinkContext
from egress.connectors.sinks import http_attempts
from egress.connectors.sinks.delivery import DeliveryHooks, DeliveryLoop, PolicyRetries, exhausted_error
from egress.connectors.sinks.ordering import fresh_messages
from egress.connectors.sinks.sink_traces import EndpointTraces
from egress.connectors.sinks.webhook_endpoints import (
    Delivery,
    Endpoint,
    EndpointGauges,
    Prefixes,
    SharedClients,
    dead_letter_of,
    decode_state,
    encode_state,
    endpoint_config,
    endpoint_rows,
    first_requests,
    redrive_progress,
    redrive_row,
    show_breaker,
    show_configuration,
)
from egress.connectors.sinks.webhook_parameters import (
    WebhookSinkDynamicParameters,
    WebhookSinkParameters,
    check_streams,
)
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import SpecError
from egress.httpclient import Request, Response
from egress.httpclient.curl import Completions
from egress.httpclient.outcomes import AttemptFailure, failure_of
from egress.keys import idempotency_key
from egress.spec import StreamSpec

SINK_CLASS = "webhook_http"
STATUS_SUFFIX = "webhook"
POLICY_EXHAUSTED = "Webhook POST retry policy exhausted"
DEADLINE_EXHAUSTED = "Webhook POST retry deadline exhausted"
# Seconds between progress reports: well below an epoch period, so a commit is never later for it,
# and long enough that a report (its sink_state encoded) is not paid per acknowledgement.
REPORT_INTERVAL = 0.005


@SINKS.register("webhook_http", "NYT::NFlow::TWebhookHttpSink")
class WebhookHttpSink:
    """One instance per sink per partition job; see the module docs."""

    parameters_model: ClassVar[type[WebhookSinkParameters]] = WebhookSinkParameters
    dynamic_parameters_model: ClassVar[type[WebhookSinkDynamicParameters]] = WebhookSinkDynamicParameters

    @classmethod
    def check(cls, parameters: WebhookSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """One input stream with the payload column (string) and the endpoint or URL column (string)."""
        return check_streams(parameters, input_streams)

    redrive_progress, redrive_row = staticmethod(redrive_progress), staticmethod(redrive_row)  # egress redrive
    @classmethod
    def create(cls, context: SinkContext, parameters: WebhookSinkParameters,
               dynamic_parameters: WebhookSinkDynamicParameters, progress: SinkProgress) -> WebhookHttpSink:
        return cls(context, parameters, dynamic_parameters, progress)

    def __init__(self, context: SinkContext, parameters: WebhookSinkParameters,
                 dynamic_parameters: WebhookSinkDynamicParameters, progress: SinkProgress) -> None:
        self._context = context
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._progress = progress
        self._committed_prefixes = decode_state(progress.sink_state)
        self._last_distributed_seq = progress.max_persisted_seq_no
        self._endpoints: dict[str, Endpoint] = {}
        self._prefixes = Prefixes(self._committed_prefixes, progress.max_persisted_seq_no)
        self._changed: set[Endpoint] = set()  # queued or acknowledged since the last report
        self._clients = SharedClients(parameters, sum(e.max_in_flight for e in dynamic_parameters.endpoints.values()))
        self._in_flight_limits = 0  # the sum of the max_in_flight of this instance's endpoints
        self._completions: Completions | None = None  # where first attempts' responses go, in batches
        self._tasks: set[asyncio.Task[None]] = set()
        self._held = False
        self._closed = False
        self._report_scheduled = False
        self._by_url = parameters.url_column is not None
        self._column = parameters.url_column or parameters.endpoint_column or ""
        self._read_outbox = context.read_outbox  # None: every backlog stays in memory
        self._status_prefix = f"/sinks/{context.sink_id}/{STATUS_SUFFIX}/"
        labels = (context.sink_id, SINK_CLASS)
        metrics = context.metrics.sink
        self._labels = labels
        self._requests = metrics.requests.labels(*labels)
        self._retries = metrics.retries.labels(*labels)
        self._delivered = metrics.records.labels(*labels)
        self._dead_lettered = metrics.dead_letters.labels(*labels)
        self._attempt_seconds = context.metrics.attempt_duration.labels(context.sink_id)
        self._responses = http_attempts.ResponseCounters(metrics, labels)
        path = parameters.dead_letter_path
        self._dead_letters = context.dead_letters.open(path) if path is not None else None
        self._hooks = DeliveryHooks(self._request, self._judge, self._attempt_failed, self._give_up,
                                    self._succeed, self._stopped, self._pause_until)
        self._traces = EndpointTraces(context, propagate=parameters.propagate_trace_context)  # tracing on only
        EndpointGauges.of(context.metrics.registry).sinks.add(self)

    def _dynamic_parameters(self) -> WebhookSinkDynamicParameters:
        return self._dynamic

    # -- the Sink protocol -------------------------------------------------------------------

    def distribute(self, messages: list[OutboxMessage]) -> None:
        """Queue committed messages on their endpoints and start what may start. A message its
        endpoint's committed prefix covers (``sink_state``) is skipped: it was acknowledged before
        a restart. Raises ``ValueError`` for a ``seq`` not above the last distributed one."""
        messages = fresh_messages(messages, self._progress.max_persisted_seq_no, self._last_distributed_seq)
        if not messages:
            return
        self._last_distributed_seq = messages[-1].seq
        touched = self._queue(messages)
        for endpoint in touched:
            self._start(endpoint)
        self._schedule_report()

    def _queue(self, messages: Iterable[OutboxMessage], *, refill: Endpoint | None = None) -> set[Endpoint]:
        column, payload_column = self._column, self._parameters.payload_column
        cap = self._parameters.max_buffered_per_endpoint if self._read_outbox is not None else None
        now = self._context.clock.monotonic()
        touched: set[Endpoint] = set()
        for message in messages:
            name = message.row.get(column)
            if not isinstance(name, str):
                continue  # a null endpoint: acknowledged without a request, as a null payload
            endpoint = refill or self._endpoint(name)
            if message.seq <= endpoint.acked:
                continue
            touched.add(endpoint)
            self._changed.add(endpoint)
            if refill is None and cap is not None and (endpoint.spilled or len(endpoint.pending) >= cap):
                endpoint.spilled.append(message.seq)  # its row stays in the outbox until it is read again
                continue
            payload = message.row.get(payload_column)
            body = payload.encode() if isinstance(payload, str) else payload if isinstance(payload, bytes) else None
            delivery = Delivery(endpoint, message.seq, message.message_id, message.key, body)
            delivery.started = now
            endpoint.pending.append(delivery)
            if not delivery.done:
                endpoint.waiting.append(delivery)
        return touched

    def _endpoint(self, name: str) -> Endpoint:
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            dynamic = self._dynamic
            config = endpoint_config(name, dynamic.endpoints, dynamic.defaults, self._by_url)
            acked = max(self._committed_prefixes.get(name, 0), self._progress.max_persisted_seq_no)
            endpoint = self._endpoints[name] = Endpoint(name, config, dynamic.breaker, acked,
                                                        self._status_prefix + name)
            self._in_flight_limits += config.max_in_flight if config is not None else 0
            self._attach(endpoint)
            self._show_configuration(endpoint)
        return endpoint

    def _attach(self, endpoint: Endpoint) -> None:
        """Its pauses, throttler and delivery loop (its transfers run on the sink's clients)."""
        context = self._context
        metrics = context.metrics.sink
        config = endpoint.config
        pauses = http_attempts.EndpointPauses(context.clock, metrics.retry_after.labels(*self._labels),
                                              metrics.retry_after_invalid.labels(*self._labels))
        endpoint.throttle = (http_attempts.sink_throttler(context, config.throttler_id, config.throttler_class_id)
                             if config is not None else None)
        endpoint.loop = DeliveryLoop(
            context.clock, self._hooks, kind="Webhook HTTP sink",
            url=lambda: endpoint.url, transport=self._clients.of_url,
            dynamic=self._dynamic_parameters, pauses=pauses, throttle=endpoint.throttle, max_redirects=0,
            requests=self._requests, retries=self._retries, attempt_seconds=self._attempt_seconds,
            trace=self._traces.of_delivery, propagate=self._traces.propagate)
        self._clients.hold(self._in_flight_limits)

    def progress(self) -> SinkProgress:
        return self._progress

    def _schedule_report(self) -> None:
        """Report at most once per :data:`REPORT_INTERVAL`, however many acknowledgements came."""
        if not self._report_scheduled:
            self._report_scheduled = True
            asyncio.get_running_loop().call_later(REPORT_INTERVAL, self._report)

    def _report(self) -> None:
        """The partition-wide prefix (below every endpoint's first unacknowledged message) and each
        endpoint's own prefix beyond it, reported to the job (``SinkContext.on_progress``)."""
        self._report_scheduled = False
        if self._closed:
            return
        changed, self._changed = self._changed, set()
        low = self._prefixes.advance(changed, self._last_distributed_seq)
        for endpoint in changed:
            if endpoint.spilled and not endpoint.refilling:
                self._refill(endpoint)  # e.g. room freed by null payloads, which start no delivery
        progress = SinkProgress(self._progress.producer_id, None, max(low, self._progress.max_persisted_seq_no),
                                encode_state(self._prefixes.ahead))
        if progress != self._progress:
            self._progress = progress
            self._context.on_progress(progress)

    def committed(self, progress: SinkProgress) -> None:
        """Nothing to do: deliveries start when distributed."""

    def flush(self) -> None:
        """Nothing to do: nothing is buffered for a batch."""

    def hold(self) -> None:
        """Start no delivery until :meth:`resume` (those running go on, retries included)."""
        self._held = True

    def resume(self) -> None:
        if self._held:
            self._held = False
            for endpoint in self._endpoints.values():
                self._start(endpoint)

    @property
    def in_flight(self) -> int:
        return sum(endpoint.running for endpoint in self._endpoints.values())

    @property
    def unacknowledged(self) -> int:
        """Messages held in memory and not acknowledged. With an outbox reader, an endpoint whose
        breaker is not closed does not count: its memory is bounded by ``max_buffered_per_endpoint``
        and it must not stop the partition's input for the others."""
        now = self._context.clock.monotonic()
        spills = self._read_outbox is not None
        return sum(len(e.pending) for e in self._endpoints.values()
                   if not (spills and e.breaker.state(now) != "closed"))

    @property
    def terminal_error(self) -> str | None:
        """Always ``None``: a failing endpoint holds back only its own messages."""
        return None

    def reconfigure(self, dynamic_parameters: WebhookSinkDynamicParameters) -> None:
        """Apply a new DynamicSpec: endpoint entries (URL, headers, secrets, ``resume``), breaker
        and retry rules, live; endpoints whose entry appeared start their waiting messages."""
        self._dynamic = dynamic_parameters
        for endpoint in self._endpoints.values():
            endpoint.breaker.spec = dynamic_parameters.breaker
            endpoint.configure(endpoint_config(endpoint.name, dynamic_parameters.endpoints,
                                               dynamic_parameters.defaults, self._by_url))
        self._in_flight_limits = sum(e.config.max_in_flight for e in self._endpoints.values() if e.config)
        for endpoint in self._endpoints.values():
            self._attach(endpoint)  # a new throttler; running deliveries keep theirs
            self._show_configuration(endpoint)
            self._start(endpoint)

    def resume_endpoint(self, name: str) -> bool:
        """Close the breaker of endpoint ``name`` (``egress endpoint resume``); False when unknown here."""
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            return False
        endpoint.breaker.resume()
        endpoint.wake()
        self._show_breaker(endpoint)
        self._start(endpoint)
        return True

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._clients.close()  # transfers still running end with CLIENT_CLOSED, ignored: the sink is closed

    # -- scheduling --------------------------------------------------------------------------

    def _start(self, endpoint: Endpoint) -> None:
        """Start waiting deliveries of ``endpoint`` in order, up to its ``max_in_flight``, skipping
        (not starting) one whose key has an earlier delivery running. While its breaker is closed,
        nothing asked it to wait and it has no throttler, their first attempts go as one batch
        (:meth:`_send_first_attempts`); else each delivery is a task (:meth:`_deliver`)."""
        config = endpoint.config
        if self._held or self._closed or config is None or not endpoint.waiting:
            return
        now = self._context.clock.monotonic()
        assert endpoint.loop is not None
        pauses = endpoint.loop.pauses
        fast = (endpoint.throttle is None and endpoint.breaker.state(now) == "closed"
                and not (pauses and pauses.end(endpoint.pause_key) is not None))
        limit, busy = config.max_in_flight, endpoint.busy_keys
        skipped: list[Delivery] = []
        first: list[Delivery] = []
        waiting = endpoint.waiting
        while waiting and endpoint.running < limit:
            delivery = waiting.popleft()
            if delivery.key in busy:
                skipped.append(delivery)
                continue
            busy.add(delivery.key)
            endpoint.running += 1
            if fast:
                delivery.admitted = True  # a closed breaker admits every attempt, and takes no slot for it
                delivery.attempted = now
                first.append(delivery)
            else:
                self._spawn(self._deliver(delivery))
        waiting.extendleft(reversed(skipped))
        if first:
            self._send_first_attempts(endpoint, first)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_first_attempts(self, endpoint: Endpoint, deliveries: list[Delivery]) -> None:
        """The first attempts of ``deliveries`` (of ``endpoint``), each a request with its delivery as
        the token; the responses come back with the others that finished together, to
        :meth:`_first_attempts_done`: most succeed at once, and a task per message costs time and
        memory. Each is signed once here (the timestamp of its attempt; a later attempt signs again)."""
        dynamic = self._dynamic
        timeout = min(dynamic.attempt_timeout, dynamic.request_timeout)
        capture_retry_after = dynamic.respect_retry_after
        completions = self._completions
        if completions is None:
            # A first attempt still queued when the sink closes is not sent.
            completions = self._completions = Completions(
                asyncio.get_running_loop(), self._traces.ending(self._first_attempts_done), lambda _: self._closed)
        requests = self._traces.first_requests(first_requests(
            endpoint, deliveries, int(self._context.clock.now()), timeout, capture_retry_after,
            self._parameters.idempotency_header))
        self._requests.inc(len(requests))
        self._clients.get(endpoint.scheme).submit_many(requests, completions)

    def _first_attempts_done(self, batch: list[tuple[Delivery, Response]]) -> None:
        """The responses of first attempts, a batch of them: each feeds its endpoint's breaker; a
        success is acknowledged, a failure goes on in a task of its own (:meth:`_deliver`, with the
        attempt counted); counters, reports and the next starts run once per batch and endpoint."""
        if self._closed:
            return
        now = self._context.clock.monotonic()
        statuses: dict[int, int] = {}
        observe = self._attempt_seconds.observe
        succeeded = 0
        touched: dict[Endpoint, None] = {}
        for delivery, response in batch:
            endpoint = delivery.endpoint
            touched[endpoint] = None
            code = response.status
            statuses[code] = statuses.get(code, 0) + 1
            observe(now - delivery.attempted)
            delivery.admitted = False
            ok = response.error is None and 200 <= code <= 299
            if endpoint.record(now, failed=not ok):
                self._show_breaker(endpoint)
            if ok:
                succeeded += 1
                self._acknowledge(delivery)
                endpoint.running -= 1
                endpoint.busy_keys.discard(delivery.key)
                continue
            failure = failure_of(response)
            assert failure is not None
            self._responses.count_failure(failure)
            assert endpoint.loop is not None
            retry_after = endpoint.loop.retry_after_of(endpoint.url, response)
            self._spawn(self._deliver(delivery, 1, failure, retry_after))
        for code, count in statuses.items():
            self._responses.count_status(code, count)
        if succeeded:
            self._delivered.inc(succeeded)
            self._schedule_report()
        for endpoint in touched:
            self._refill(endpoint)
            self._start(endpoint)

    async def _deliver(self, delivery: Delivery, attempts: int = 0, last_error: AttemptFailure | None = None,
                       retry_after: float = 0.0) -> None:
        """Deliveries of one message until it is acknowledged (or dead-lettered): each is the loop's
        attempts under the retry rules; between them, ``retry_maximum_delay`` and the breaker.
        ``attempts`` were made already (a first attempt of :meth:`_send_first_attempts`), the last
        failing with ``last_error`` after asking to wait ``retry_after`` seconds."""
        endpoint, clock = delivery.endpoint, self._context.clock
        try:
            while not _done(delivery):
                if not attempts:
                    await self._admitted(delivery)
                    delivery.attempted = clock.monotonic()
                assert endpoint.loop is not None
                rules = PolicyRetries(self._dynamic_parameters, delivery.attempted)
                await endpoint.loop.run(delivery, rules, attempts, last_error, retry_after)
                attempts, last_error, retry_after = 0, None, 0.0
                if _done(delivery):  # the loop's hooks set it
                    break
                if self._dead_letters is not None and await self._dead_letter(delivery):
                    break
                await clock.sleep(self._dynamic.retry_maximum_delay)
        finally:
            self._finished(delivery)

    def _finished(self, delivery: Delivery) -> None:
        endpoint = delivery.endpoint
        endpoint.running -= 1
        endpoint.busy_keys.discard(delivery.key)
        if delivery.admitted:
            delivery.admitted = False
            endpoint.breaker.release()
        if self._closed:
            return
        if delivery.done:
            self._schedule_report()
            self._refill(endpoint)
        self._start(endpoint)

    async def _admitted(self, delivery: Delivery) -> None:
        """Wait until the endpoint is configured and its breaker lets an attempt go."""
        endpoint, clock = delivery.endpoint, self._context.clock
        while True:
            now = clock.monotonic()
            if endpoint.config is not None and endpoint.breaker.admit(now):
                delivery.admitted = True
                return
            until = endpoint.breaker.wait_until(now) if endpoint.config is not None else float("inf")
            changed = endpoint.changed
            if until == float("inf"):
                await changed.wait()
            else:
                await event_or_timeout(changed, clock, max(0.0, until - now))
            self._show_breaker(endpoint)

    def _refill(self, endpoint: Endpoint) -> None:
        """Read back from the outbox the next messages of an endpoint whose backlog was left there,
        once half of what it may keep in memory is free."""
        cap = self._parameters.max_buffered_per_endpoint
        endpoint.first_unacknowledged()  # releases the acknowledged head: its room counts
        if endpoint.refilling or not endpoint.spilled or len(endpoint.pending) > cap // 2 or self._read_outbox is None:
            return
        endpoint.refilling = True
        self._spawn(self._read_back(endpoint, cap - len(endpoint.pending)))

    async def _read_back(self, endpoint: Endpoint, room: int) -> None:
        try:
            assert self._read_outbox is not None
            chunk = endpoint.spilled[:room]
            wanted = set(chunk)
            messages = await self._read_outbox(chunk[0] - 1, chunk[-1])
            taken = [m for m in messages if m.seq in wanted]
            del endpoint.spilled[:len(chunk)]
            self._queue(taken, refill=endpoint)
        finally:
            endpoint.refilling = False
        if not self._closed:
            self._start(endpoint)
            self._schedule_report()

    # -- one delivery (the hooks of the endpoint's DeliveryLoop) -----------------------------

    def _request(self, delivery: Delivery, url: str, timeout: float) -> Request:
        """The signed POST: ``webhook-id`` (the idempotency key), ``webhook-timestamp`` (now, integer
        seconds), ``webhook-signature`` (one ``v1,`` per secret), the endpoint's headers. Signed per
        attempt: a retry minutes later must carry its own timestamp, within a verifier's tolerance."""
        assert delivery.body is not None
        lines = delivery.endpoint.request_lines(idempotency_key(delivery.message_id), int(self._context.clock.now()),
                                                delivery.body, self._parameters.idempotency_header)
        return Request(url, delivery.body, lines, timeout=timeout,
                       capture_retry_after=self._dynamic.respect_retry_after, prepared=True, capture_local_port=False)

    def _judge(self, delivery: Delivery, response: Response) -> AttemptFailure | None:
        """Count ``response``, feed the endpoint's breaker; ``None`` for a complete 2xx."""
        self._responses.count_status(response.status)
        failure = http_attempts.response_error(response, follow_redirects=False)
        if failure is not None:
            self._responses.count_failure(failure)
        delivery.admitted = False
        if delivery.endpoint.record(self._context.clock.monotonic(), failed=failure is not None):
            self._show_breaker(delivery.endpoint)
        return failure

    def _attempt_failed(self, delivery: Delivery, failure: AttemptFailure) -> None:
        if self._dead_letters is not None:
            if delivery.attempts is None:
                delivery.attempts = []
            delivery.attempts.append(http_attempts.failed_attempt(self._context.clock.now(), failure))
        self._context.status.set_error(delivery.endpoint.status_path, delivery.seq,
                                       f"Webhook POST to {delivery.endpoint.name} failed: {failure}")

    def _give_up(self, delivery: Delivery, exhausted: str, attempts: int, last_error: AttemptFailure | None) -> None:
        """The retry rules ended: the message is dead-lettered or tried again later (:meth:`_deliver`)."""
        reason = POLICY_EXHAUSTED if exhausted == "policy" else DEADLINE_EXHAUSTED
        if delivery.admitted:
            delivery.admitted = False
            delivery.endpoint.breaker.release()
        self._context.status.set_error(delivery.endpoint.status_path, delivery.seq,
                                       f"{exhausted_error(reason, attempts, last_error)}; tried again in "
                                       f"{self._dynamic.retry_maximum_delay:g} s")

    def _stopped(self, delivery: Delivery) -> bool:
        return self._closed

    def _succeed(self, delivery: Delivery) -> None:
        """A later attempt succeeded (first attempts: :meth:`_first_attempts_done`)."""
        self._acknowledge(delivery)
        self._delivered.inc()

    def _acknowledge(self, delivery: Delivery) -> None:
        delivery.done = True
        delivery.body = None
        delivery.attempts = None
        endpoint = delivery.endpoint
        endpoint.delivered += 1
        self._changed.add(endpoint)
        self._context.status.clear_error(endpoint.status_path, delivery.seq)

    async def _pause_until(self, delivery: Delivery, when: float) -> None:
        """The backoff pause, then the breaker's say."""
        clock = self._context.clock
        while clock.monotonic() < when:
            await clock.sleep_until(when)
        await self._admitted(delivery)

    # -- dead letters ------------------------------------------------------------------------

    async def _dead_letter(self, delivery: Delivery) -> bool:
        """Write the letter; True once it is durable (the message is then acknowledged)."""
        assert self._dead_letters is not None
        assert delivery.body is not None
        context = self._context
        error = context.status.error(delivery.endpoint.status_path) or "Webhook POST failed"
        try:
            self._dead_lettered.inc(await self._dead_letters.append([dead_letter_of(context, delivery, error)]))
        except Exception as failure:
            context.status.set_error(delivery.endpoint.status_path, delivery.seq,
                                     f"{error}; and it cannot be written to the dead-letter file: {failure}")
            return False
        delivery.done = True
        delivery.body = None
        self._changed.add(delivery.endpoint)
        context.status.clear_error(delivery.endpoint.status_path, delivery.seq)
        return True

    # -- status ------------------------------------------------------------------------------

    def _show_configuration(self, endpoint: Endpoint) -> None:
        show_configuration(self._context.status, endpoint, by_url=self._by_url)

    def _show_breaker(self, endpoint: Endpoint) -> None:
        show_breaker(self._context.status, endpoint, self._context.clock.monotonic())

    def endpoint_rows(self) -> list[dict[str, Any]]:
        """Each endpoint's state, backlog and counts (metrics, ``/status``)."""
        return endpoint_rows(self._context, self._endpoints, self._context.clock.monotonic())


def _done(delivery: Delivery) -> bool:
    return delivery.done


__all__ = ["WebhookHttpSink", "WebhookSinkDynamicParameters", "WebhookSinkParameters"]
