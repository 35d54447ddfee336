"""The per-endpoint bookkeeping of the ``webhook_http`` sink: one :class:`Endpoint` per (partition,
endpoint) with its own queue, acknowledged prefix, breaker, client and delivery loop; the committed
``sink_state`` that records each endpoint's prefix; and the scrape-time gauges of every endpoint.

The sink's committed progress is two-fold: ``max_persisted_seq_no`` is the partition-wide prefix
(every message at or below it is acknowledged, whichever endpoint it went to: the outbox is trimmed
to it), and ``sink_state`` maps each endpoint that acknowledged beyond it to its own prefix (the
last ``seq`` up to which all of that endpoint's messages are acknowledged). A restart skips a
message whose endpoint's prefix covers it, and sends the rest again with the same ``webhook-id``.
"""

from __future__ import annotations

import array
import asyncio
import base64
import collections
import heapq
import itertools
import math
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import ormsgpack
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from egress.connectors.base import SinkContext
from egress.connectors.dead_letters import DeadLetter
from egress.connectors.sinks.webhook_breaker import STATE_CODES, Breaker
from egress.connectors.sinks.webhook_parameters import (
    BreakerSpec,
    EndpointDefaults,
    EndpointSpec,
    WebhookSinkDynamicParameters,
    WebhookSinkParameters,
)
from egress.engines import SinkProgress
from egress.errors import SpecError
from egress.httpclient import CurlClient, Request
from egress.httpclient.curl import post_header_lines
from egress.httpclient.retry_after import endpoint_of
from egress.keys import idempotency_key
from egress.observe import StatusTree
from egress.observe.logs import add_secret
from egress.webhook_signatures import (
    ID_HEADER,
    SECRET_PREFIX,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    read_secrets,
    signature_lines,
)

if TYPE_CHECKING:
    from egress.connectors.sinks.delivery import DeliveryLoop


class Delivery:
    """One message to one endpoint: ``seq``, ``message_id``, ``key`` (per-key order), ``body``
    (``None``: a null payload, acknowledged in order without a request)."""

    __slots__ = ("admitted", "attempted", "attempts", "body", "done", "endpoint", "key", "message_id", "seq",
                 "started")

    def __init__(self, endpoint: Endpoint, seq: int, message_id: bytes, key: bytes, body: bytes | None) -> None:
        self.endpoint = endpoint
        self.seq = seq
        self.message_id = message_id
        self.key = key
        self.body = body
        self.done = body is None
        self.admitted = False  # the breaker let its next attempt go and no outcome came back yet
        self.started = 0.0  # clock.monotonic() when distributed (the latency's origin)
        self.attempted = 0.0  # clock.monotonic() when its first attempt started (request_timeout's origin)
        self.attempts: list[Any] | None = None  # failed attempts, for a dead-letter line only


_serials = itertools.count()
_new_tuple = tuple.__new__


class Endpoint:
    """One endpoint of one sink instance. ``config`` is its entry (``None``: the table has no entry
    of that name: its messages wait, shown in ``/status``). ``status_path`` is where its errors show."""

    def __init__(self, name: str, config: EndpointSpec | None, breaker: BreakerSpec, acked: int,
                 status_path: str = "") -> None:
        self.name = name
        self.serial = next(_serials)  # orders endpoints whose heap keys tie (never: a seq has one endpoint)
        self.status_path = status_path
        self.config: EndpointSpec | None = None
        self.url = ""
        self.scheme = ""
        self.pause_key: tuple[str, str, int] = ("", "", -1)  # what its Retry-After pauses (endpoint_of)
        self.keys: tuple[bytes, ...] = ()
        self.header_lines: tuple[str, ...] = ()
        self.throttle: Any = None  # its throttler handle (None: no throttler, first attempts batched)
        self.head: int | None = None  # the seq of its entry in Prefixes' heap (None: no entry)
        self.breaker = Breaker(breaker)
        self.pending: collections.deque[Delivery] = collections.deque()  # in memory, seq order
        self.waiting: collections.deque[Delivery] = collections.deque()  # not started yet, seq order
        self.spilled = array.array("q")  # seqs after ``pending`` left in the outbox, in order
        self.refilling = False
        self.running = 0
        self.busy_keys: set[bytes] = set()
        self.acked = acked  # the endpoint's acknowledged prefix: every message of it up to this seq is
        self.delivered = 0
        self.loop: DeliveryLoop[Delivery] | None = None
        self.changed = asyncio.Event()
        self.configure(config)

    def configure(self, config: EndpointSpec | None) -> None:
        """Apply an entry (live). A raised ``resume`` resumes a paused breaker; the secrets are read
        again (a file that cannot be read now keeps the keys read before, shown by the caller)."""
        old = self.config
        self.config = config
        if config is None:
            self.wake()
            return
        self.url = config.url
        self.pause_key = endpoint_of(config.url)
        self.scheme = self.pause_key[0]
        if old is not None and config.resume > old.resume:
            self.breaker.resume()
        try:
            self.keys = read_secrets(file=config.secret_file, env=config.secret_env)
        except SpecError:
            if old is None:
                raise
        for key in self.keys:  # redacted from every log line, in the forms a secret is written
            encoded = base64.b64encode(key).decode()
            add_secret(encoded)
            add_secret(SECRET_PREFIX + encoded)
        added = (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER) if self.keys else ()
        self.header_lines = post_header_lines((f"{name}: {value}" for name, value in config.headers.items()), added)
        self.wake()

    def request_lines(self, key: str, timestamp: int, body: bytes, idempotency_header: str) -> tuple[str, ...]:
        """The header lines of a POST of ``body``: ``webhook-id`` ``key`` and ``webhook-timestamp``
        ``timestamp`` always (an unsigned endpoint too can tell a repeated message by its id), a
        ``webhook-signature`` when it has secrets, the idempotency header when the sink names one,
        then its own headers."""
        lines = (*signature_lines(self.keys, key, timestamp, body), *self.header_lines) if self.keys \
            else (f"{ID_HEADER}: {key}", f"{TIMESTAMP_HEADER}: {timestamp}", *self.header_lines)
        return (f"{idempotency_header}: {key}", *lines) if idempotency_header else lines

    def record(self, now: float, *, failed: bool) -> bool:
        """Feed an attempt's outcome to its breaker; True when that changed the breaker's state (the
        deliveries waiting for it are woken)."""
        before = self.breaker.state(now)
        self.breaker.record(now, failed=failed)
        if self.breaker.state(now) == before:
            return False
        self.wake()
        return True

    def wake(self) -> None:
        """Wake every delivery waiting for the breaker or the configuration."""
        self.changed.set()
        self.changed = asyncio.Event()

    def first_unacknowledged(self) -> int | None:
        """The smallest ``seq`` of this endpoint not acknowledged yet (``None``: none)."""
        pending = self.pending
        while pending and pending[0].done:
            self.acked = pending.popleft().seq
        if pending:
            return pending[0].seq
        return self.spilled[0] if self.spilled else None

    @property
    def backlog(self) -> int:
        """Messages not acknowledged yet: in memory and left in the outbox."""
        return sum(1 for d in self.pending if not d.done) + len(self.spilled)


class Prefixes:
    """The sink's committed progress, kept as acknowledgements come: the partition-wide prefix (below
    the first unacknowledged message of every endpoint) from a heap of each endpoint's first
    unacknowledged ``seq``, and each endpoint's own prefix beyond it (``sink_state``), so that a report
    costs what changed since the last, not a visit of every endpoint. ``committed`` are the prefixes
    of the committed ``sink_state`` (kept until the partition-wide prefix passes them)."""

    def __init__(self, committed: dict[str, int], persisted: int) -> None:
        self._heads: list[tuple[int, int, Endpoint]] = []  # (first unacknowledged seq, serial, endpoint)
        self.ahead = {name: seq for name, seq in committed.items() if seq > persisted}
        self._expiry = [(seq, name) for name, seq in self.ahead.items()]  # (prefix, name): when to drop it
        heapq.heapify(self._expiry)

    def advance(self, changed: Iterable[Endpoint], last_distributed: int) -> int:
        """The partition-wide prefix once the endpoints ``changed`` (messages queued or acknowledged
        since the last call) are taken in; :attr:`ahead` is then every endpoint's prefix beyond it."""
        heads, ahead, expiry = self._heads, self.ahead, self._expiry
        for endpoint in changed:
            first = endpoint.first_unacknowledged()
            if ahead.get(endpoint.name) != endpoint.acked:
                ahead[endpoint.name] = endpoint.acked
                heapq.heappush(expiry, (endpoint.acked, endpoint.name))
            if first is not None and endpoint.head is None:
                endpoint.head = first
                heapq.heappush(heads, (first, endpoint.serial, endpoint))
        # Only the top is refreshed: an entry is never above its endpoint's first unacknowledged seq
        # (that only rises), so a top that is still true is the minimum.
        while heads:
            seq, _, endpoint = heads[0]
            first = endpoint.first_unacknowledged()
            if first == seq:
                break
            endpoint.head = first
            if first is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (first, endpoint.serial, endpoint))
        low = min(last_distributed, heads[0][0] - 1) if heads else last_distributed
        while expiry and expiry[0][0] <= low:
            _, name = heapq.heappop(expiry)
            if ahead.get(name, math.inf) <= low:
                del ahead[name]
        return low


class SharedClients:
    """The libcurl clients of a sink instance, one per scheme for all its endpoints (a client per
    endpoint would cost the loop's driver a visit of each per turn). Each endpoint's
    ``max_in_flight`` is kept by the sink; a client's cap (at least ``MIN_CONNECTIONS``, else the
    sum of the table's ``max_in_flight``, ``table``) only has to stay above their sum: :meth:`hold`
    replaces the clients by larger ones when it does not, the old ones closed with the sink."""

    MIN_CONNECTIONS = 64

    def __init__(self, parameters: WebhookSinkParameters, table: int) -> None:
        self._parameters = parameters
        self._capacity = max(self.MIN_CONNECTIONS, table)
        self._clients: dict[str, CurlClient] = {}
        self._retired: list[CurlClient] = []

    def hold(self, in_flight: int) -> None:
        """Make room for ``in_flight`` transfers at once (the endpoints' ``max_in_flight`` summed)."""
        if in_flight > self._capacity:
            self._capacity = max(in_flight, 2 * self._capacity)
            self._retired.extend(self._clients.values())
            self._clients = {}

    def get(self, scheme: str) -> CurlClient:
        """The client of ``scheme`` (``http``, ``https``) for new transfers."""
        client = self._clients.get(scheme)
        if client is None:
            client = self._clients[scheme] = CurlClient(
                max_connections=self._capacity, keep_alive=self._parameters.keep_alive,
                ca_file=self._parameters.tls_ca_file if scheme == "https" else None)
        return client

    def of_url(self, url: str) -> CurlClient:
        return self.get(endpoint_of(url)[0])

    def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            client.close()
        self._clients.clear()
        self._retired.clear()


def first_requests(endpoint: Endpoint, deliveries: list[Delivery], timestamp: int, timeout: float,
                   capture_retry_after: bool, idempotency_header: str) -> list[tuple[Request, Delivery]]:
    """The first attempt of each of ``deliveries`` to ``endpoint``, signed at ``timestamp``, as
    ``(request, delivery)`` for ``CurlClient.submit_many``."""
    url, lines_of = endpoint.url, endpoint.request_lines
    requests: list[tuple[Request, Delivery]] = []
    for delivery in deliveries:
        body = delivery.body
        assert body is not None
        lines = lines_of(idempotency_key(delivery.message_id), timestamp, body, idempotency_header)
        # tuple.__new__: a Request without the NamedTuple's keywords, the fields in its order: url,
        # body, headers, timeout, capture_body, capture_location, capture_headers, method,
        # capture_retry_after, prepared, capture_local_port.
        requests.append((_new_tuple(Request, (url, body, lines, timeout, False, False, False, "POST",
                                              capture_retry_after, True, False)), delivery))
    return requests


def dead_letter_of(context: SinkContext, delivery: Delivery, error: str) -> DeadLetter:
    """The dead-letter line of ``delivery``, which failed for good with ``error``."""
    assert delivery.body is not None
    return DeadLetter(context.computation_id, context.sink_id, context.partition, delivery.seq, delivery.message_id,
                      idempotency_key(delivery.message_id), delivery.body, tuple(delivery.attempts or ()), error,
                      context.clock.now(), delivery.endpoint.name)


def redrive_progress(letters: list[DeadLetter]) -> SinkProgress:
    """Where a new webhook sink starts to re-send ``letters`` as messages ``seq`` 1..n (``egress
    redrive``): nothing persisted; each message keeps its id, so its ``webhook-id``."""
    return SinkProgress()


def redrive_row(parameters: WebhookSinkParameters, dynamic_parameters: WebhookSinkDynamicParameters,
                letter: DeadLetter) -> dict[str, Any]:
    """The outbox row that sends ``letter`` back to its own endpoint (``egress redrive``): its
    payload and its endpoint in the sink's endpoint or URL column. Raises ``ValueError`` (the fix
    named) when the letter names no endpoint, or one the DynamicSpec does not configure now: its
    message would wait for ever."""
    if letter.endpoint is None:
        raise ValueError("the line has no \"endpoint\" (an older egress did not record it): redrive cannot "
                         "tell where it goes; add \"endpoint\": the URL (url_column) or endpoint name "
                         "(endpoint_column) to the line, or send its payload yourself with webhook-id "
                         f"{letter.idempotency_key}")
    by_url = parameters.url_column is not None
    if endpoint_config(letter.endpoint, dynamic_parameters.endpoints, dynamic_parameters.defaults, by_url) is None:
        raise ValueError(f"{'URL' if by_url else 'endpoint'} {letter.endpoint!r} is not one the sink can call "
                         "now (not in the DynamicSpec's endpoint table, or not a URL): add it and redrive again")
    column = parameters.url_column or parameters.endpoint_column or ""
    return {parameters.payload_column: letter.payload, column: letter.endpoint}


def show_configuration(status: StatusTree, endpoint: Endpoint, *, by_url: bool) -> None:
    """Show under the endpoint's status path that it has no entry (its messages wait), or clear it."""
    path = endpoint.status_path + "/configuration"
    if endpoint.config is None:
        what = "URL" if by_url else "endpoint"
        status.set_error(path, 0, f"{what} {endpoint.name!r} is not in the DynamicSpec's endpoint table (or not a "
                                  "URL): its messages wait; add it")
    else:
        status.clear_error(path, 0)


def show_breaker(status: StatusTree, endpoint: Endpoint, now: float) -> None:
    """Show the endpoint's breaker state at ``now`` when not closed (with its backlog), or clear it."""
    path = endpoint.status_path + "/breaker"
    state = endpoint.breaker.state(now)
    if state == "closed":
        status.clear_error(path, 0)
    elif state == "paused":
        status.set_error(path, 0, f"paused by its breaker (backlog {endpoint.backlog} then); resume with "
                                  f"`egress endpoint resume {endpoint.name}` or by raising its resume in the "
                                  "DynamicSpec")
    else:
        status.set_error(path, 0, f"circuit {state.replace('_', '-')} (backlog {endpoint.backlog} when it changed)")


def endpoint_rows(context: SinkContext, endpoints: dict[str, Endpoint], now: float) -> list[dict[str, Any]]:
    """Each endpoint's state, backlog and counts at ``now`` (metrics, ``/status``)."""
    return [{"computation_id": context.computation_id, "sink_id": context.sink_id,
             "partition": context.partition, "endpoint": name, "state": e.breaker.state(now),
             "backlog": e.backlog, "in_outbox": len(e.spilled), "acknowledged_seq": e.acked,
             "delivered": e.delivered, "opened": e.breaker.opened, "configured": e.config is not None}
            for name, e in endpoints.items()]


def endpoint_config(name: str, table: dict[str, EndpointSpec], defaults: EndpointDefaults,
                    by_url: bool) -> EndpointSpec | None:
    """The entry of endpoint ``name``: the table's, or, for ``url_column`` (``by_url``), the
    defaults with ``name`` as the URL (``None`` when that URL is not one the sink can call)."""
    if not by_url:
        return table.get(name)
    try:
        return EndpointSpec(url=name, **defaults.model_dump())
    except ValueError:
        return None


def encode_state(prefixes: dict[str, int]) -> bytes:
    """The committed ``sink_state``: endpoint name → its acknowledged prefix (MessagePack)."""
    return ormsgpack.packb(prefixes) if prefixes else b""


def decode_state(state: bytes) -> dict[str, int]:
    """:func:`encode_state`'s inverse (``b""``: no endpoint beyond the partition-wide prefix)."""
    if not state:
        return {}
    decoded = ormsgpack.unpackb(state)
    if not isinstance(decoded, dict):
        raise ValueError("webhook sink state is not a map of endpoint prefixes")
    return {str(name): int(seq) for name, seq in decoded.items()}


class EndpointGauges:
    """Scrape-time families of every webhook endpoint of a registry's sinks:
    ``egress_webhook_endpoint_state`` (0 closed, 1 half-open, 2 open, 3 paused),
    ``egress_webhook_endpoint_backlog`` (messages not acknowledged),
    ``egress_webhook_endpoint_delivered_total`` and ``egress_webhook_endpoint_opened_total`` (times
    its breaker opened), labelled ``computation_id, sink_id, partition, endpoint``."""

    _by_registry: ClassVar[weakref.WeakKeyDictionary[Any, EndpointGauges]] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.sinks: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def of(cls, registry: Any) -> EndpointGauges:
        """The collector of ``registry``, registered on first use."""
        gauges = cls._by_registry.get(registry)
        if gauges is None:
            gauges = cls._by_registry[registry] = cls()
            registry.register(gauges)
        return gauges

    def collect(self) -> Iterator[Any]:
        labels = ["computation_id", "sink_id", "partition", "endpoint"]
        state = GaugeMetricFamily("egress_webhook_endpoint_state", "Breaker state of a webhook endpoint: "
                                  "0 closed, 1 half-open, 2 open, 3 paused.", labels=labels)
        backlog = GaugeMetricFamily("egress_webhook_endpoint_backlog", "Messages of a webhook endpoint not "
                                    "acknowledged yet (in memory and left in the outbox).", labels=labels)
        delivered = CounterMetricFamily("egress_webhook_endpoint_delivered", "Messages a webhook endpoint "
                                        "acknowledged (2xx) in this run.", labels=labels)
        opened = CounterMetricFamily("egress_webhook_endpoint_opened", "Times the breaker of a webhook "
                                     "endpoint opened in this run.", labels=labels)
        for sink in list(self.sinks):
            for row in sink.endpoint_rows():
                values = [row["computation_id"], row["sink_id"], str(row["partition"]), row["endpoint"]]
                state.add_metric(values, STATE_CODES[row["state"]])
                backlog.add_metric(values, row["backlog"])
                delivered.add_metric(values, row["delivered"])
                opened.add_metric(values, row["opened"])
        yield from (state, backlog, delivered, opened)

    def describe(self) -> Iterator[Any]:
        return iter(())


__all__ = ["Delivery", "Endpoint", "EndpointGauges", "Prefixes", "SharedClients", "dead_letter_of", "decode_state",
           "encode_state", "endpoint_config", "endpoint_rows", "first_requests", "show_breaker", "show_configuration"]
