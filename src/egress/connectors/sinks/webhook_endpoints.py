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

from egress.connectors.sinks.webhook_breaker import STATE_CODES, Breaker
from egress.connectors.sinks.webhook_parameters import BreakerSpec, EndpointDefaults, EndpointSpec
from egress.errors import SpecError
from egress.httpclient.curl import post_header_lines
from egress.httpclient.retry_after import endpoint_of
from egress.observe.logs import add_secret
from egress.webhook_signatures import ID_HEADER, SECRET_PREFIX, SIGNATURE_HEADER, TIMESTAMP_HEADER, read_secrets

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


__all__ = ["Delivery", "Endpoint", "EndpointGauges", "Prefixes", "decode_state", "encode_state", "endpoint_config"]
