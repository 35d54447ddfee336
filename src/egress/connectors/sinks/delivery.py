"""The delivery loop of the HTTP sinks: attempts of one delivery (a message of ``async_http``, a batch
of ``batching_http`` or ``firehose_http``) until one succeeds or its budget ends.

One loop, parameterised by what differs between the sinks:

- the **request** of an attempt and the **verdict** on its response (:class:`DeliveryHooks`): a 2xx for
  the HTTP sinks, a conforming JSON answer for Firehose (``egress.firehose.protocol``);
- the **retry rules** (:class:`RetryRules`): the DynamicSpec's ``max_attempt_count``,
  ``request_timeout`` and Flow's backoff (:class:`PolicyRetries`, ``http_attempts.plan_retry``), or
  Firehose's ``retry_duration`` and its backoff (``egress.connectors.sinks.firehose_http``);
- what an acknowledgement covers and where a delivery that failed for good goes (the hooks' ``succeeded``
  and ``give_up``: one message, or a batch; a dead-letter file, an error output, or a terminal failure).

What is the same for all, in this order (upstream ``TAsyncHttpSink``'s loop and egress's additions,
``docs/http-sink.md``): after a failed attempt, the verdict (no attempt left, or the next pause would
reach the deadline: the delivery ends), then the pause (the backoff, or a longer ``Retry-After``);
nothing more once an earlier delivery failed for good; before each attempt, the budget checked
again (DynamicSpec changes apply live), the wait while the endpoint asked to wait (``Retry-After``,
per scheme, host and port), one throttler unit; then the attempt: the request, its redirects
(``max_redirect_count``, never HTTPS to HTTP, each redirected request one more throttler unit) within
the attempt's own timeout.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from egress.clock import Clock
from egress.connectors.sinks import http_attempts
from egress.connectors.sinks.http_attempts import EndpointPauses, RetryPlan
from egress.errors import DeliveryError
from egress.httpclient import Request, Response
from egress.httpclient.outcomes import AttemptFailure, FailureKind, sender_failure, status_failure
from egress.httpclient.redirects import RedirectError
from egress.httpclient.retry_after import endpoint_of
from egress.httpclient.transport import HttpTransport
from egress.observe import tracing as _tracing
from egress.throttler.errors import ThrottlerError

if TYPE_CHECKING:
    from egress.throttler.factory import ThrottlerHandle

Item = TypeVar("Item")

TraceOf = Callable[[Any], tuple[str | None, bool, dict[str, Any]]]
"""With tracing on, what the loop asks of a delivery at its start: its message's carried trace context
(``None``: none), whether its attempts are sampled (spans), and the spans' attributes."""


class RetryRules(Protocol):
    """One delivery's budget (times are ``clock.monotonic()`` seconds)."""

    def deadline(self) -> float:
        """When the delivery's time is up (``math.inf`` without such a deadline)."""
        ...

    def budget_over(self, attempts: int, now: float) -> bool:
        """Whether no attempt may start now, ``attempts`` made (the budget changed while pausing)."""
        ...

    def attempt_timeout(self, now: float) -> float:
        """Seconds the attempt that starts now may take, its redirects included."""
        ...

    def attempt_finished(self, started: float, ended: float, *, failed: bool) -> None:
        """An attempt ran from ``started`` to ``ended``."""
        ...

    def after_failure(self, attempts: int, failure: AttemptFailure, retry_after: float, now: float) -> RetryPlan:
        """The verdict at ``now``, when failed attempt number ``attempts`` ended, its response asking to
        wait ``retry_after`` seconds (0: it did not)."""
        ...


class PolicyRetries:
    """The HTTP sinks' rules: the DynamicSpec's ``max_attempt_count`` attempts within
    ``request_timeout`` seconds of ``started``, each within ``attempt_timeout``, Flow's backoff between
    them (:func:`egress.connectors.sinks.http_attempts.plan_retry`). ``dynamic()`` is read at every
    decision, so a reloaded DynamicSpec applies to deliveries already retrying."""

    __slots__ = ("_dynamic", "started")

    def __init__(self, dynamic: Callable[[], Any], started: float) -> None:
        self._dynamic = dynamic
        self.started = started

    def deadline(self) -> float:
        return float(self.started + self._dynamic().request_timeout)

    def budget_over(self, attempts: int, now: float) -> bool:
        return bool(attempts >= self._dynamic().max_attempt_count or now >= self.deadline())

    def attempt_timeout(self, now: float) -> float:
        return float(min(self._dynamic().attempt_timeout, max(0.0, self.deadline() - now)))

    def attempt_finished(self, started: float, ended: float, *, failed: bool) -> None:
        """Nothing to count: the deadline runs from the delivery's start, waits included."""

    def after_failure(self, attempts: int, failure: AttemptFailure, retry_after: float, now: float) -> RetryPlan:
        return http_attempts.plan_retry(self._dynamic(), attempts, self.started, now, retry_after)


@dataclass(frozen=True, slots=True)
class DeliveryHooks(Generic[Item]):
    """What a sink does at each step of the loop, for one of its deliveries ``item``:

    - ``request(item, url, timeout)``: the request of an attempt to ``url`` within ``timeout`` seconds,
      or the failure that ends the attempt before it is sent (the Firehose sink's unreadable access key);
    - ``judge(item, response)``: count ``response`` and judge it: ``None`` when it succeeds,
      ``http_attempts.FOLLOW`` for a redirect to follow, else why the attempt failed;
    - ``failed(item, failure)``: an attempt failed (its status error, its dead-letter record);
    - ``give_up(item, exhausted, attempts, last_error)``: the budget ended (``RetryPlan.exhausted``'s
      reason) after ``attempts`` attempts;
    - ``succeeded(item)``: acknowledge it;
    - ``stopped(item)``: whether an earlier delivery failed for good (nothing later is sent);
    - ``pause_until(item, when)``: sleep until ``clock.monotonic()`` reaches ``when``, never less.
    """

    request: Callable[[Item, str, float], Request | AttemptFailure]
    judge: Callable[[Item, Response], AttemptFailure | None]
    failed: Callable[[Item, AttemptFailure], None]
    give_up: Callable[[Item, str, int, AttemptFailure | None], None]
    succeeded: Callable[[Item], None]
    stopped: Callable[[Item], bool]
    pause_until: Callable[[Item, float], Awaitable[None]]


class DeliveryLoop(Generic[Item]):
    """The loop of one sink instance. ``url()`` is the URL of each first request of an attempt
    (read per attempt: the Firehose sink's DynamicSpec may change it); ``transport(url)`` the client
    of its scheme; ``dynamic()`` the DynamicSpec parameters (``respect_retry_after``,
    ``retry_after_cap``) when ``pauses`` keeps endpoints' ``Retry-After``; ``throttle`` takes one unit
    per request; ``requests``, ``retries`` (``inc()``) and ``attempt_seconds`` (``observe()``) are the
    sink's sensors; ``kind`` names the sink in a redirect's error."""

    def __init__(self, clock: Clock, hooks: DeliveryHooks[Item], *, kind: str, url: Callable[[], str],
                 transport: Callable[[str], HttpTransport], dynamic: Callable[[], Any],
                 pauses: EndpointPauses | None, throttle: ThrottlerHandle | None, max_redirects: int,
                 requests: Any, retries: Any, attempt_seconds: Any, trace: TraceOf | None = None,
                 propagate: bool = True) -> None:
        self._clock = clock
        self._trace = trace  # with tracing on (egress.observe.tracing): spans per attempt, traceparent
        self._propagate = propagate
        self._hooks = hooks
        self._kind = kind
        self._url = url
        self._transport = transport
        self._dynamic = dynamic
        self.pauses = pauses
        self._throttle = throttle
        self._max_redirects = max_redirects
        self._requests = requests
        self._retries = retries
        self._attempt_seconds = attempt_seconds

    async def run(self, item: Item, rules: RetryRules, attempts: int = 0, last_error: AttemptFailure | None = None,
                  retry_after: float = 0.0) -> None:
        """Attempts of ``item`` until one succeeds or ``rules`` end it. ``attempts`` were made already
        (a sink's first attempt sent on a faster path), the last failing with ``last_error`` after
        asking to wait ``retry_after`` seconds."""
        clock, hooks = self._clock, self._hooks
        redirects = [0]  # counted across all attempts of the delivery
        traced = None if _tracing.active is None or self._trace is None else self._traced(item)
        while True:
            if last_error is not None:
                hooks.failed(item, last_error)
                if not await self._pause_after_failure(item, rules, attempts, last_error, retry_after):
                    return
            if rules.budget_over(attempts, clock.monotonic()):  # the budget changed while pausing
                hooks.give_up(item, "policy", attempts, last_error)
                return
            if self.pauses:
                deadline = rules.deadline()
                await self.wait_for_endpoint(item, self._url(), deadline)
                if clock.monotonic() >= deadline:  # the endpoint asked to wait past the delivery's deadline
                    hooks.give_up(item, "deadline", attempts, last_error)
                    return
            began = None if traced is None else (clock.now(), clock.monotonic())  # a span starts before the wait
            if self._throttle is not None:
                try:  # the global rate's wait is not part of the attempt: its budget starts once granted
                    await self._throttle.throttle(1)
                except ThrottlerError as error:  # the controller stayed away past its retry budget
                    attempts += 1
                    last_error, retry_after = sender_failure(FailureKind.THROTTLER, f"throttler: {error}"), 0.0
                    continue
            attempts += 1
            if attempts > 1:
                self._retries.inc()
            started = clock.monotonic()
            if traced is None or began is None:
                last_error, retry_after = await self._attempt(item, rules.attempt_timeout(started), redirects)
            else:
                last_error, retry_after = await self._traced_attempt(
                    item, rules.attempt_timeout(started), redirects, traced, attempts, began[0], started - began[1])
            rules.attempt_finished(started, clock.monotonic(), failed=last_error is not None)
            if last_error is None:
                hooks.succeeded(item)
                return

    async def _pause_after_failure(self, item: Item, rules: RetryRules, attempts: int, last_error: AttemptFailure,
                                   retry_after: float) -> bool:
        """The verdict after failed attempt number ``attempts``, at the instant it failed; True once the
        pause before the next attempt is over, False when the delivery ended (given up, or an earlier
        one failed for good). A ``Retry-After`` longer than the backoff that reaches the deadline is
        waited out to the deadline, which then ends the delivery."""
        clock, hooks = self._clock, self._hooks
        plan = rules.after_failure(attempts, last_error, retry_after, clock.monotonic())
        if plan.exhausted is not None:
            hooks.give_up(item, plan.exhausted, attempts, last_error)
            return False
        await hooks.pause_until(item, plan.until)
        if hooks.stopped(item):
            return False
        if plan.asked_longer and clock.monotonic() >= rules.deadline():
            hooks.give_up(item, "deadline", attempts, last_error)
            return False
        return True

    async def wait_for_endpoint(self, item: Item, url: str, deadline: float) -> None:
        """Wait while the endpoint of ``url`` asked to wait (``Retry-After``), at most until ``deadline``
        (``clock.monotonic()`` seconds; ``math.inf``: as long as it asks)."""
        pauses, clock = self.pauses, self._clock
        if not pauses:
            return
        endpoint = endpoint_of(url)
        while (until := pauses.end(endpoint)) is not None and clock.monotonic() < deadline:
            await self._hooks.pause_until(item, min(until, deadline))

    def _traced(self, item: Item) -> _Traced | None:
        """With tracing on, the delivery's tracing (:class:`_Traced`), ``None`` when there is nothing
        to do (not sampled, and no carried context to send on)."""
        assert self._trace is not None
        carried, sampled, attributes = self._trace(item)
        if sampled:
            return _Traced(_tracing.active, carried, attributes)
        return _Traced(None, carried, attributes) if carried is not None and self._propagate else None

    async def _traced_attempt(self, item: Item, budget: float, redirects: list[int],
                              traced: _Traced, attempt: int, began: float, throttled: float
                              ) -> tuple[AttemptFailure | None, float]:
        """:meth:`_attempt` with tracing: a span ``delivery attempt`` (from ``began``, clock seconds, the
        throttler's wait of ``throttled`` seconds included) under the message's carried context, sent on
        as the request's ``traceparent`` (the span's, or the carried one when not sampled). Without a
        carried context, the later attempts are children of the first, in its trace."""
        tracing, carried, attributes = traced.tracing, traced.carried, traced.attributes
        if tracing is None:
            return await self._attempt(item, budget, redirects, carried)
        span = tracing.start("delivery attempt", began, parent=carried, attributes={
            **attributes, "egress.attempt": attempt, "egress.throttler_wait_seconds": throttled})
        statuses: list[int] = []
        failure: AttemptFailure | None = None
        try:
            failure, retry_after = await self._attempt(
                item, budget, redirects, _tracing.context_of_span(span, carried) if self._propagate else None,
                statuses)
        finally:
            _tracing.end(span, self._clock.now(),
                         attributes={"http.response.status_code": statuses[-1]} if statuses else None,
                         error=None if failure is None else failure.message)
            if carried is None:
                traced.carried = _tracing.context_of_span(span)
        return failure, retry_after

    async def _attempt(self, item: Item, budget: float, redirects: list[int], context: str | None = None,
                       statuses: list[int] | None = None) -> tuple[AttemptFailure | None, float]:
        """One attempt: the request and its redirects within ``budget`` seconds. ``None`` when it
        succeeded, else why it failed, with the seconds its last response asked to wait (0: none).
        ``redirects[0]`` counts redirects followed across attempts. With a carried trace ``context``
        each request sends it (``traceparent``); ``statuses`` collects the responses' statuses."""
        clock, hooks = self._clock, self._hooks
        deadline = clock.monotonic() + budget
        url = self._url()
        while True:
            if self.pauses:
                await self.wait_for_endpoint(item, url, deadline)
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return sender_failure(FailureKind.TIMEOUT, http_attempts.ATTEMPT_TIMED_OUT), 0.0
            request = hooks.request(item, url, remaining)
            if isinstance(request, AttemptFailure):
                return request, 0.0
            if context is not None:
                request = request._replace(headers=(*request.headers, *_tracing.headers_of_context(context)))
            self._requests.inc()
            sent = clock.monotonic()
            response = await self._transport(url).submit(request)
            self._attempt_seconds.observe(clock.monotonic() - sent)
            if statuses is not None:
                statuses.append(response.status)
            failure = hooks.judge(item, response)
            if failure is not http_attempts.FOLLOW:
                return failure, self.retry_after_of(url, response)
            if redirects[0] >= self._max_redirects:
                return status_failure(response.status), 0.0
            assert response.location is not None
            redirects[0] += 1
            try:
                url = http_attempts.follow_location(url, response.location, self._kind)
            except RedirectError as error:
                return sender_failure(FailureKind.REDIRECT, str(error)), 0.0
            if self._throttle is not None:
                await self._throttle.throttle(1)  # a redirected request is a request to the endpoint too

    def retry_after_of(self, url: str, response: Response) -> float:
        """The seconds a 429 or 503 from ``url`` asked to wait (``EndpointPauses.asked``, which pauses its
        endpoint until then); 0 for a sink that keeps no pauses."""
        if self.pauses is None:
            return 0.0
        return self.pauses.asked(endpoint_of(url), response, self._dynamic())


class _Traced:
    """One delivery's tracing in the loop: ``tracing`` when its attempts are sampled (else ``None``:
    only the ``carried`` context is sent on), the context its attempts are children of, and the
    attributes of their spans."""

    __slots__ = ("attributes", "carried", "tracing")

    def __init__(self, tracing: _tracing.Tracing | None, carried: str | None, attributes: dict[str, Any]) -> None:
        self.tracing, self.carried, self.attributes = tracing, carried, attributes


NO_DEADLINE = math.inf


def exhausted_error(reason: str, attempts: int, last_error: AttemptFailure | None) -> str:
    """The terminal error of a delivery whose budget ended after ``attempts`` attempts, the last failing
    with ``last_error`` (upstream's wording: ``<reason> after N attempt(s); last error: ...``)."""
    return str(DeliveryError(reason, attempts=attempts, last_error=last_error.message if last_error else None))

__all__ = ["NO_DEADLINE", "DeliveryHooks", "DeliveryLoop", "PolicyRetries", "RetryRules", "exhausted_error"]
