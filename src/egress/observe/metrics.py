"""Metrics: one prometheus-client registry per running pipeline (not the global one), so that
several pipelines or tests in one process never share counters.

The run's own sensors are plain objects of this module (:class:`LabelledCounter`,
:class:`LabelledGauge`, :class:`SummedCounter`, :class:`Histogram`): prometheus-client (~70 M
instructions of imports, its exposition's HTTP and WSGI servers among them) is imported only when
something reads them as Prometheus families: :attr:`Metrics.registry` is made when first asked for
(a scrape, the dashboard, a collector of its own to register), with the same families in the same
order as prometheus-client's ``Counter`` and ``Gauge`` would give. :meth:`Metrics.value` and
:meth:`Metrics.samples` read the sensors without it until then.

Every sink sensor is labelled by ``computation_id`` and ``sink_id`` (two computations may each have
a sink named ``http``). A sink sees the run's :class:`Metrics` bound to its computation
(:meth:`Metrics.for_computation`, done by ``SinkContext``), so it labels its sensors by ``sink_id``
(and the sensor's own labels) only. The table of every name and label: ``docs/observability.md``.
"""

from __future__ import annotations

import bisect
import copy
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

# Seconds: from a few milliseconds (a loopback 2xx) to the longest request_timeout worth telling apart.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)


class ReportsFreshness(Protocol):
    """A sink instance that knows the age of its oldest undelivered record."""

    @property
    def computation_id(self) -> str: ...

    @property
    def sink_id(self) -> str: ...

    @property
    def sink_class(self) -> str: ...

    @property
    def partition(self) -> int: ...

    def oldest_undelivered_age(self) -> float:
        """Seconds since the oldest unacknowledged record reached the sink (0 when there is none)."""
        ...


class _Freshness:
    """Data freshness computed at scrape time from the live sink instances that report it."""

    def __init__(self) -> None:
        self.sinks: weakref.WeakSet[ReportsFreshness] = weakref.WeakSet()

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples :meth:`collect` gives, as ``(name, labels, value)``, without prometheus-client."""
        for sink in list(self.sinks):
            yield ("egress_sink_oldest_undelivered_record_age_seconds",
                   {"computation_id": sink.computation_id, "sink_id": sink.sink_id, "sink_class": sink.sink_class,
                    "partition": str(sink.partition)}, sink.oldest_undelivered_age())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("egress_sink_oldest_undelivered_record_age_seconds",
                                   "Seconds since the oldest unacknowledged record reached the sink (0: none).",
                                   labels=["computation_id", "sink_id", "sink_class", "partition"])
        for sink in list(self.sinks):
            family.add_metric([sink.computation_id, sink.sink_id, sink.sink_class, str(sink.partition)],
                              sink.oldest_undelivered_age())
        yield family


Child = TypeVar("Child", covariant=True)
Family = TypeVar("Family")


class _Labelled(Protocol[Child]):
    def labels(self, *values: str) -> Child: ...


class SinkSensor(Generic[Child]):
    """A sink sensor family (labelled ``computation_id``, ``sink_id``, then its own labels) as one
    computation's sinks see it: ``labels(sink_id, *more)`` is the family's child of
    ``(computation_id, sink_id, *more)``."""

    __slots__ = ("computation_id", "family")

    def __init__(self, family: _Labelled[Child], computation_id: str = "") -> None:
        self.family = family
        self.computation_id = computation_id

    def labels(self, *values: str) -> Child:
        return self.family.labels(self.computation_id, *values)

    def bound(self, computation_id: str) -> SinkSensor[Child]:
        return SinkSensor(self.family, computation_id)


class HistogramChild:
    """One label set's buckets: :meth:`observe` costs one bisect (no lock: the run observes on its
    event loop thread, the scrape reads a consistent enough copy)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Count ``count`` observations of ``value`` (seconds)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count


class Histogram:
    """A histogram family computed at scrape time from :class:`HistogramChild` buckets.

    Not prometheus-client's ``Histogram``: its ``observe`` takes a lock per bucket and counts one
    observation per call (about 5 times the cost of this one, measured), where the runtime observes
    a whole acknowledged batch at once (``observe(seconds, count)``).
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None = None, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.buckets = tuple(sorted(buckets))
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        if registry is not None:  # else its Metrics registers it, on the registry when made
            registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
            child = self._children[values] = HistogramChild(self.buckets)
        return child

    def describe(self) -> Iterator[HistogramMetricFamily]:
        from prometheus_client.core import HistogramMetricFamily

        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples :meth:`collect` gives, as ``(name, labels, value)``, without prometheus-client."""
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            cumulative = 0
            for bound, count in zip([*map(str, self.buckets), "+Inf"], list(child.counts), strict=True):
                cumulative += count
                yield f"{self.name}_bucket", {**labels, "le": bound}, cumulative
            yield f"{self.name}_count", labels, cumulative
            yield f"{self.name}_sum", labels, child.sum

    def collect(self) -> Iterator[HistogramMetricFamily]:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, self.buckets), "+Inf"], list(child.counts), strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric(list(values), buckets, child.sum)
        yield family


class CounterChild:
    """One label set's total: :meth:`inc` is one float addition (no lock, as :class:`HistogramChild`)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class SummedCounter:
    """A counter family computed at scrape time from :class:`CounterChild` totals: for a sensor
    incremented several times per epoch, where prometheus-client's ``Counter.inc`` (a lock and its
    checks) costs about 3 µs a call here (measured). No ``_created`` series."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        if registry is not None:  # else its Metrics registers it, on the registry when made
            registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
            child = self._children[values] = CounterChild()
        return child

    def describe(self) -> Iterator[CounterMetricFamily]:
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples :meth:`collect` gives, as ``(name, labels, value)``, without prometheus-client."""
        for values, child in list(self._children.items()):
            yield f"{self.name}_total", dict(zip(self.labelnames, values, strict=True)), child.value

    def collect(self) -> Iterator[CounterMetricFamily]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        yield family


def _created_series() -> bool:
    """Whether counters expose ``_created`` (prometheus-client's own switch: its environment variable
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` or ``disable_created_metrics()``), read when exposed."""
    from prometheus_client import metrics

    return bool(getattr(metrics, "_use_created", True))


class LockedCounterChild:
    """One label set of a :class:`LabelledCounter`: prometheus-client's counter child's semantics
    (a lock, so that threads may add at once; a negative amount refused; ``created``, the Unix time
    it was made, as its ``_created`` series) without its library."""

    __slots__ = ("_lock", "created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()  # wall time, as prometheus-client stamps a child's _created
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self.value += amount


class GaugeChild:
    """One label set of a :class:`LabelledGauge` (a lock, as prometheus-client's gauge child)."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        with self._lock:
            self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount


LabelledChild = TypeVar("LabelledChild", LockedCounterChild, GaugeChild)


class _LabelledFamily(Generic[LabelledChild]):
    """A family of children by label values, ``labels(*values)`` as prometheus-client's: each value
    made a string, their count checked, a child made on first use."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 make: Callable[[], LabelledChild]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._make: Callable[[], LabelledChild] = make
        self._children: dict[tuple[str, ...], LabelledChild] = {}
        self._lock = threading.Lock()

    def labels(self, *values: object) -> LabelledChild:
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError("Incorrect label count")
            with self._lock:
                child = self._children.setdefault(key, self._make())
        return child

    def _labelled(self) -> Iterator[tuple[dict[str, str], LabelledChild]]:
        for values, child in list(self._children.items()):
            yield dict(zip(self.labelnames, values, strict=True)), child


class LabelledCounter(_LabelledFamily[LockedCounterChild]):
    """A counter family exposed as prometheus-client's ``Counter`` of the same name and labels is:
    ``<name>_total`` and (unless turned off there) ``<name>_created`` per label set."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, LockedCounterChild)

    def describe(self) -> Iterator[CounterMetricFamily]:
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples :meth:`collect` gives, as ``(name, labels, value)``, without prometheus-client
        (and without ``_created``, which only an exposition needs)."""
        for labels, child in self._labelled():
            yield f"{self.name}_total", labels, child.value

    def collect(self) -> Iterator[CounterMetricFamily]:
        from prometheus_client.core import CounterMetricFamily

        created = _created_series()
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, child in self._labelled():
            family.add_metric(list(labels.values()), child.value, created=child.created if created else None)
        yield family


class LabelledGauge(_LabelledFamily[GaugeChild]):
    """A gauge family exposed as prometheus-client's ``Gauge`` of the same name and labels is."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        super().__init__(name, documentation, labelnames, GaugeChild)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples :meth:`collect` gives, as ``(name, labels, value)``, without prometheus-client."""
        for labels, child in self._labelled():
            yield self.name, labels, child.value

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, child in self._labelled():
            family.add_metric(list(labels.values()), child.value)
        yield family


def _bind_sinks(sensors: Any, computation_id: str) -> Any:
    """A shallow copy of ``sensors`` whose :class:`SinkSensor` attributes are bound to ``computation_id``."""
    view = copy.copy(sensors)
    for name, value in vars(sensors).items():
        if isinstance(value, SinkSensor):
            setattr(view, name, value.bound(computation_id))
    return view


class _Exposed:
    """A run's sensor families, in the order they are exposed, and its registry once made."""

    def __init__(self) -> None:
        self.collectors: list[Any] = []
        self.registry: CollectorRegistry | None = None


class Metrics:
    """The sensors of one pipeline run, named after Flow's paths where Flow has them.

    Counters only grow; read them in tests with :meth:`value`. ``process_*`` (CPU seconds, memory,
    open files, start time) come from prometheus-client's ``ProcessCollector`` on :attr:`registry`.
    """

    def __init__(self) -> None:
        self._exposed = _Exposed()  # shared with every for_computation view (a shallow copy)
        collect = self._collected
        self.source_rows = collect(LabelledCounter(
            "egress_source_rows", "Rows read by a source and appended to its stream.",
            ["source_id"]))
        self.source_commits = collect(LabelledCounter(
            "egress_source_commits", "Commits of a source's readers (each appends a batch of rows and moves the "
            "source's position): rows over commits is the rows per commit.",
            ["source_id"]))
        self.source_bad_records = collect(LabelledCounter(
            "egress_source_bad_records", "Records a source dropped as not fitting its schema (on_bad_record), "
            "by action: skip or dead_letter.",
            ["source_id", "action"]))
        self.source_unread_records = collect(LabelledGauge(
            "egress_source_unread_records", "Records a source has not read yet (an estimate for files, exact "
            "for nats and http; absent while unknown; refreshed at each scrape). Not yet in any partition.",
            ["source_id"]))
        self.computation_messages = collect(LabelledCounter(
            "egress_computation_input_messages", "Input messages processed by a computation.",
            ["computation_id"]))
        self.input_throttle_seconds = collect(LabelledCounter(
            "egress_computation_input_throttle_seconds",
            "Seconds input batches waited for throttler quota (upstream Input.Throttle).",
            ["computation_id"]))
        self.epoch_part_seconds = collect(SummedCounter(
            "egress_epoch_part_seconds",
            "Seconds partition jobs' epochs spent in each part: read, Input.Throttle, process, commit, deliver "
            "(egress.observe.epoch_parts; the dashboard's Epoch parts chart).",
            ["computation_id", "part"]))
        self.epochs = collect(LabelledCounter(
            "egress_epochs_committed", "Epochs committed by partition jobs.",
            ["computation_id"]))
        self.timers_fired = collect(LabelledCounter(
            "egress_computation_timers_fired", "Timers fired in committed epochs of a computation.",
            ["computation_id"]))
        self.sink = _SinkMetrics(collect)
        self.delivery_latency: SinkSensor[HistogramChild] = SinkSensor(collect(Histogram(
            "egress_sink_delivery_latency_seconds",
            "Seconds from the commit of a message to its acknowledgement by its sink (a 2xx, or its dead-letter "
            "line), counted when the last message of its epoch is acknowledged (at most one epoch period late).",
            ["computation_id", "sink_id"])))
        self.attempt_duration: SinkSensor[HistogramChild] = SinkSensor(collect(Histogram(
            "egress_sink_attempt_duration_seconds",
            "Seconds from the start of an HTTP attempt (a POST, or a batch's) to its response or failure.",
            ["computation_id", "sink_id"])))
        self.partition_owned = collect(LabelledGauge(
            "egress_partition_owned", "1 while this process runs the unit (a computation partition, or "
            "a source reader: source:<id> and its partition), 0 once it stopped.", ["computation", "partition"]))
        self.partition_input_lag = collect(LabelledGauge(
            "egress_partition_input_lag", "Input messages of a partition this process runs not yet processed "
            "(refreshed at each scrape).", ["computation", "partition"]))
        self.partition_input_lag_seconds = collect(LabelledGauge(
            "egress_partition_input_lag_seconds", "Seconds the oldest input message of a partition this process "
            "runs has waited: now minus its event time, or since the partition last had no lag when it has none "
            "(0: no lag; refreshed at each scrape).", ["computation", "partition"]))
        self.partition_unacknowledged = collect(LabelledGauge(
            "egress_partition_unacknowledged", "Committed messages a sink instance of a partition this process "
            "runs holds and has not yet acknowledged (refreshed at each scrape).",
            ["computation", "partition", "sink_id"]))
        self.broken = collect(LabelledGauge(
            "egress_status_broken", "1 while the status path is in error (upstream /status_profiler/broken).",
            ["path"]))

    def _collected(self, family: Family) -> Family:
        self._exposed.collectors.append(family)
        return family

    @property
    def registry(self) -> CollectorRegistry:
        """This run's prometheus-client registry, made (and the library imported) when first asked
        for: ``ProcessCollector``'s ``process_*``, then every sensor family in the order they were made."""
        exposed = self._exposed
        if exposed.registry is None:
            from prometheus_client import CollectorRegistry, ProcessCollector

            registry = CollectorRegistry(auto_describe=True)
            ProcessCollector(registry=registry)
            for family in exposed.collectors:
                registry.register(family)
            exposed.registry = registry
        return exposed.registry

    def samples(self, name: str) -> Iterator[tuple[dict[str, str], float]]:
        """The ``(labels, value)`` of every sample named ``name`` (with ``_total`` for counters): read
        from the sensors themselves while nothing made :attr:`registry` (the same values), else from
        the registry, with what else was registered on it."""
        if self._exposed.registry is None and not name.startswith("process_"):
            for family in self._exposed.collectors:
                for sample_name, labels, value in family.samples():
                    if sample_name == name:
                        yield labels, value
            return
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name:
                    yield sample.labels, sample.value

    def for_computation(self, computation_id: str) -> Metrics:
        """These sensors as the sinks of ``computation_id`` see them: the same registry and series,
        every sink sensor's ``labels(sink_id, ...)`` labelled by ``computation_id`` first."""
        view = _bind_sinks(self, computation_id)
        view.sink = _bind_sinks(self.sink, computation_id)
        return view  # type: ignore[no-any-return]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` (with ``_total`` for counters) whose labels include
        ``labels`` (so ``sink_id="http"`` adds up every computation's ``http`` sink); 0 when absent."""
        total = 0.0
        for found, value in self.samples(name):
            if all(found.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def total(self, name: str) -> float:
        """The sum of all samples named ``name`` across label values."""
        return self.value(name)

    def exposition(self) -> bytes:
        """The Prometheus text exposition format of every sensor."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


SINK_LABELS = ("computation_id", "sink_id", "sink_class")
"""The labels of every sink sensor family: the sink class (``async_http``, ``batching_http``,
``firehose_http``) tells the series of one sink apart from another's kind."""


def _sink_counters(
        collect: Callable[[LabelledCounter], LabelledCounter]) -> Callable[..., SinkSensor[LockedCounterChild]]:
    """A maker of the sinks' counters: ``counter(name, text, *labels)`` is ``egress_sink_`` + ``name``,
    labelled by :data:`SINK_LABELS` and ``labels``."""

    def counter(name: str, text: str, *labels: str) -> SinkSensor[LockedCounterChild]:
        return SinkSensor(collect(LabelledCounter(f"egress_sink_{name}", text, [*SINK_LABELS, *labels])))

    return counter


class _SinkMetrics:
    """The HTTP sinks' sensors, one family per concept (``egress_sink_*{computation_id, sink_id,
    sink_class}``): a sink labels them ``labels(sink_id, sink_class, *more)``. Upstream names the async
    HTTP sink's ``/sink/async_http_sink/responses{status_code}`` and ``.../attempt_failures``. The data
    freshness gauge is computed at scrape time from the sinks that add themselves to ``freshness.sinks``."""

    def __init__(self, collect: Callable[[Any], Any]) -> None:
        counter = _sink_counters(collect)
        self.requests = counter("requests", "Requests sent: attempts, their retries and redirects.")
        self.responses = counter("responses", "HTTP responses received, once each, by status.", "status_code")
        self.attempt_failures = counter(
            "attempt_failures", "Transport errors and timeouts before a complete response, and body read errors.")
        self.transport_errors = counter(
            "transport_errors",
            "Attempt failures without a complete response, by class (egress.httpclient.outcomes.FailureKind).",
            "error_class")
        self.retries = counter("retries", "Attempts after the first one of a delivery (a message or a batch).")
        self.retry_after = counter(
            "retry_after", "429 and 503 responses whose Retry-After paused their endpoint (RFC 9110 §10.2.3).")
        self.retry_after_invalid = counter(
            "retry_after_invalid", "Retry-After values that are neither delay-seconds nor an HTTP-date, ignored.")
        self.batches = counter("batches", "Batches sent (first attempts) by a batching sink.")
        self.records = counter("records_delivered",
                               "Records acknowledged after a successful attempt (a message is one record).")
        self.bytes = counter("bytes_delivered", "Bytes acknowledged by a batching sink: its body before gzip "
                             "(batching_http), its records before base64 (firehose_http).")
        self.dead_letters = counter(
            "dead_letters", "Records written to the dead-letter file (then acknowledged) after their delivery "
            "failed for good.")
        self.null_payloads = counter(
            "skipped_null_payloads", "Messages with a null payload, acknowledged without a request.")
        self.error_records = counter("error_output_records", "Records written to the error output (firehose_http).")
        self.freshness = collect(_Freshness())
