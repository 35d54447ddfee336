"""The HTTP sinks' per-attempt rules, as small pure functions and helpers that the delivery loop
(``egress.connectors.sinks.delivery``) and the sinks call: the async HTTP sink (``async_http``, one
message per POST), the batching HTTP sink (``batching_http``, one batch) and, for its clients and
response counters, the Firehose sink.

Source: upstream ``TAsyncHttpSink``'s delivery loop (the verdict after a failed attempt, in its order)
and egress's additions to it (``Retry-After`` pauses per endpoint, redirects, the throttler handle);
``docs/http-sink.md`` has the rules case by case.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from egress.clock import Clock
from egress.connectors.base import SinkContext
from egress.connectors.dead_letters import Attempt
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.httpclient import CurlClient, Response, backoff_seconds
from egress.httpclient.outcomes import AttemptFailure, FailureKind, failure_of
from egress.httpclient.redirects import REDIRECT_STATUSES, RedirectError, is_downgrade, resolve_location
from egress.httpclient.retry_after import retry_after_seconds
from egress.httpclient.transport import HttpTransport

if TYPE_CHECKING:
    from egress.throttler.factory import ThrottlerHandle

# Why an attempt failed when its own deadline came while it followed redirects (both HTTP sinks).
ATTEMPT_TIMED_OUT = "attempt deadline reached while following redirects"

# response_error's verdict for a 3xx with a Location to follow (compare with ``is``).
FOLLOW = AttemptFailure(FailureKind.STATUS, "follow redirect")

# Concurrent requests of a client that keeps no connections (keep_alive false or
# max_idle_connections 0): each opens its own, so this bounds sockets and ephemeral ports.
UNPOOLED_MAX_CONNECTIONS = 64

Endpoint = tuple[str, str, int]


def response_error(response: Response, *, follow_redirects: bool) -> AttemptFailure | None:
    """``None`` for a complete 2xx, :data:`FOLLOW` for a redirect with a ``Location`` when
    ``follow_redirects``, else why the attempt failed (``egress.httpclient.outcomes.failure_of``: the
    transport's error with libcurl's code and class, or ``HTTP status N``)."""
    failure = failure_of(response)
    if (failure is not None and follow_redirects and failure.kind is FailureKind.STATUS
            and response.status in REDIRECT_STATUSES and response.location is not None):
        return FOLLOW
    return failure


def failed_attempt(now: float, failure: AttemptFailure) -> Attempt:
    """The dead-letter record of an attempt that ended at ``now`` (seconds since the Unix epoch) with
    ``failure``: its status when a complete response failed it, else the error."""
    return Attempt(now, failure.status) if failure.kind is FailureKind.STATUS else Attempt(now, error=failure.message)


def follow_location(url: str, location: str, sink_kind: str) -> str:
    """The URL a redirect from ``url`` with ``location`` leads to. Raises :class:`RedirectError` for a
    ``Location`` that cannot be followed, or one from HTTPS to HTTP (``sink_kind`` names the sink)."""
    target = resolve_location(url, location)
    if is_downgrade(url, target):
        raise RedirectError(f"{sink_kind} does not follow HTTPS to HTTP redirects")
    return target


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """The verdict after a failed attempt: ``exhausted`` names the budget that ended the delivery
    (``"policy"``: no attempt left; ``"deadline"``: the next backoff reaches ``request_timeout``), else
    the next attempt waits until ``until`` (``clock.monotonic()`` seconds); ``asked_longer`` when a
    ``Retry-After`` asked for more than the backoff (then reaching the deadline while waiting ends it)."""

    exhausted: Literal["policy", "deadline"] | None
    until: float = 0.0
    asked_longer: bool = False


def plan_retry(dynamic: AsyncHttpSinkDynamicParameters, attempts: int, started: float, now: float,
               retry_after: float) -> RetryPlan:
    """Upstream's order, at the instant failed attempt number ``attempts`` ended (``now``; the delivery
    ``started`` then, both ``clock.monotonic()``): no attempt left → policy exhausted; the next backoff
    would reach ``request_timeout`` → deadline exhausted; else wait the backoff, or the ``retry_after``
    seconds the response asked for if longer, at most to the deadline."""
    if attempts >= dynamic.max_attempt_count:
        return RetryPlan("policy")
    deadline = started + dynamic.request_timeout
    delay = backoff_seconds(dynamic.backoff_policy(), attempts - 1)
    if delay >= deadline - now:
        return RetryPlan("deadline")
    asked_longer = retry_after > delay
    return RetryPlan(None, min(now + (retry_after if asked_longer else delay), deadline), asked_longer)


class EndpointPauses:
    """Endpoints (scheme, host, port) that asked to wait with ``Retry-After``, each until the latest
    ``clock.monotonic()`` asked for. ``counted`` and ``invalid`` are the sink's counters of valid and
    unreadable values (objects with ``inc()``)."""

    def __init__(self, clock: Clock, counted: Any, invalid: Any) -> None:
        self._clock = clock
        self._counted = counted
        self._invalid = invalid
        self._until: dict[Endpoint, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def end(self, endpoint: Endpoint) -> float | None:
        """The ``clock.monotonic()`` at which ``endpoint``'s pause ends, ``None`` when it has none now."""
        until = self._until.get(endpoint)
        if until is not None and until <= self._clock.monotonic():
            del self._until[endpoint]
            return None
        return until

    def asked(self, endpoint: Endpoint, response: Response, dynamic: AsyncHttpSinkDynamicParameters) -> float:
        """The seconds a 429 or 503 from ``endpoint`` asked to wait with ``Retry-After``, at most
        ``retry_after_cap``, after pausing the endpoint until then; 0 without a valid one (a value in
        neither form is counted and ignored) or with ``respect_retry_after`` off."""
        if response.retry_after is None or not dynamic.respect_retry_after:
            return 0.0
        seconds = retry_after_seconds(response.retry_after, self._clock.now())
        if seconds is None:
            self._invalid.inc()
            return 0.0
        self._counted.inc()
        seconds = min(seconds, dynamic.retry_after_cap)
        until = self._clock.monotonic() + seconds
        if until > self._until.get(endpoint, -math.inf):  # the pause ends at the latest end asked for
            self._until[endpoint] = until
        return seconds


class _Closable(Protocol):
    def close(self) -> None: ...


Client = TypeVar("Client", bound=_Closable)


class ClientsByScheme(Generic[Client]):
    """One HTTP client per URL scheme per sink instance (upstream: an HTTP and an HTTPS client), made
    by ``factory(scheme)`` on first use."""

    def __init__(self, factory: Callable[[str], Client]) -> None:
        self._factory = factory
        self._clients: dict[str, Client] = {}

    def get(self, url: str) -> Client:
        """The client for ``url``'s scheme."""
        scheme = urlsplit(url).scheme.lower()
        client = self._clients.get(scheme)
        if client is None:
            client = self._clients[scheme] = self._factory(scheme)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


class ResponseCounters:
    """A sink's response sensors, from the run's sink families (``Metrics.sink``) labelled by ``labels``
    (its sink id and sink class): ``responses`` by status code (children cached per status),
    ``attempt_failures`` (no complete response) and ``transport_errors`` by class (``FailureKind``)."""

    def __init__(self, metrics: Any, labels: tuple[str, ...]) -> None:
        self._responses = metrics.responses
        self._labels = labels
        self._attempt_failures = metrics.attempt_failures.labels(*labels)
        self._transport_errors = metrics.transport_errors
        self._by_status: dict[int, Any] = {}
        self._by_kind: dict[FailureKind, Any] = {}

    def count(self, response: Response) -> None:
        self.count_status(response.status)
        if response.error is not None:
            failure = failure_of(response)
            assert failure is not None
            self.count_failure(failure)

    def count_status(self, status: int, count: int = 1) -> None:
        """Count ``count`` responses of HTTP ``status`` (0: no response, not counted)."""
        if status:
            counter = self._by_status.get(status)
            if counter is None:
                counter = self._by_status[status] = self._responses.labels(*self._labels, str(status))
            counter.inc(count)

    def count_failure(self, failure: AttemptFailure) -> None:
        """Count a failed attempt that got no complete response (a failing status is a response)."""
        if failure.kind is FailureKind.STATUS:
            return
        self._attempt_failures.inc()
        counter = self._by_kind.get(failure.kind)
        if counter is None:
            counter = self._by_kind[failure.kind] = self._transport_errors.labels(*self._labels, failure.kind.value)
        counter.inc()


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


def sink_throttler(context: SinkContext, throttler_id: str | None, class_id: str | None) -> ThrottlerHandle | None:
    """The handle of the DynamicSpec throttler ``throttler_id`` for this sink instance (``None`` without
    one). Raises ``ValueError`` when the run has no throttlers."""
    if throttler_id is None:
        return None
    if context.throttling is None:
        raise ValueError(f'Throttler "{throttler_id}" is not configured: the DynamicSpec has no throttlers')
    factory = context.throttling.factory(
        f"{context.computation_id}/{context.sink_id}",
        client_id=f"{context.computation_id}/{context.sink_id}/{context.partition}",
        class_ids={throttler_id: class_id})
    return factory.get_throttler_or_throw(throttler_id)


__all__ = ["FOLLOW", "ClientsByScheme", "EndpointPauses", "ResponseCounters", "RetryPlan", "client_concurrency",
           "curl_transport", "failed_attempt",
           "follow_location", "plan_retry", "response_error", "sink_throttler"]
