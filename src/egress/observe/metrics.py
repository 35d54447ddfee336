"""Metrics: one prometheus-client registry per running pipeline (not the global one), so that
several pipelines or tests in one process never share counters."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily


class ReportsFreshness(Protocol):
    """A sink instance that knows the age of its oldest undelivered record."""

    @property
    def sink_id(self) -> str: ...

    @property
    def partition(self) -> int: ...

    def oldest_undelivered_age(self) -> float:
        """Seconds since the oldest unacknowledged record reached the sink (0 when there is none)."""
        ...


class _Freshness:
    """Data freshness computed at scrape time from the live sink instances that report it."""

    def __init__(self) -> None:
        self.sinks: weakref.WeakSet[ReportsFreshness] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("egress_sink_firehose_http_oldest_undelivered_record_age_seconds",
                                   "Seconds since the oldest unacknowledged record reached the sink (0: none).",
                                   labels=["sink_id", "partition"])
        for sink in list(self.sinks):
            family.add_metric([sink.sink_id, str(sink.partition)], sink.oldest_undelivered_age())
        yield family


class Metrics:
    """The sensors of one pipeline run, named after Flow's paths where Flow has them.

    Counters only grow; read them in tests with :meth:`value`.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.source_rows = Counter(
            "egress_source_rows", "Rows read by a source and appended to its stream.",
            ["source_id"], registry=self.registry,
        )
        self.computation_messages = Counter(
            "egress_computation_input_messages", "Input messages processed by a computation.",
            ["computation_id"], registry=self.registry,
        )
        self.input_throttle_seconds = Counter(
            "egress_computation_input_throttle_seconds",
            "Seconds input batches waited for throttler quota (upstream Input.Throttle).",
            ["computation_id"], registry=self.registry,
        )
        self.epochs = Counter(
            "egress_epochs_committed", "Epochs committed by partition jobs.",
            ["computation_id"], registry=self.registry,
        )
        # Upstream: /sink/async_http_sink/responses{status_code}, /sink/async_http_sink/attempt_failures.
        self.http_sink_requests = Counter(
            "egress_sink_async_http_sink_requests", "POST attempts started (retries included).",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_responses = Counter(
            "egress_sink_async_http_sink_responses", "HTTP responses received, once each.",
            ["sink_id", "status_code"], registry=self.registry,
        )
        self.http_sink_attempt_failures = Counter(
            "egress_sink_async_http_sink_attempt_failures",
            "Transport errors and timeouts before a response, and body read errors.",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_retries = Counter(
            "egress_sink_async_http_sink_retries", "Attempts after the first one of a delivery.",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_retry_after = Counter(
            "egress_sink_async_http_sink_retry_after",
            "429 and 503 responses whose Retry-After paused their endpoint (RFC 9110 §10.2.3).",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_retry_after_invalid = Counter(
            "egress_sink_async_http_sink_retry_after_invalid",
            "Retry-After values that are neither delay-seconds nor an HTTP-date, ignored.",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_delivered = Counter(
            "egress_sink_async_http_sink_delivered", "Messages acknowledged after a 2xx.",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_dead_letters = Counter(
            "egress_sink_async_http_sink_dead_letters",
            "Messages written to the dead-letter file (then acknowledged) after their delivery failed for good.",
            ["sink_id"], registry=self.registry,
        )
        self.http_sink_null_payloads = Counter(
            "egress_sink_async_http_sink_skipped_null_payloads",
            "Messages with a null payload, acknowledged without a request.",
            ["sink_id"], registry=self.registry,
        )
        self.firehose = _FirehoseSinkMetrics(self.registry)
        self.partition_owned = Gauge(
            "egress_partition_owned", "1 while this process runs the unit (a computation partition, or "
            "source:<id> partition 0), 0 once it stopped.", ["computation", "partition"], registry=self.registry,
        )
        self.partition_input_lag = Gauge(
            "egress_partition_input_lag", "Input messages of a partition this process runs not yet processed "
            "(refreshed at each scrape).", ["computation", "partition"], registry=self.registry,
        )
        self.broken = Gauge(
            "egress_status_broken", "1 while the status path is in error (upstream /status_profiler/broken).",
            ["path"], registry=self.registry,
        )

    def value(self, name: str, **labels: str) -> float:
        """The current sample value of metric ``name`` (with ``_total`` for counters), 0 when absent."""
        found = self.registry.get_sample_value(name, labels)
        return float(found) if found is not None else 0.0

    def total(self, name: str) -> float:
        """The sum of all samples named ``name`` across label values."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name:
                    total += sample.value
        return total

    def exposition(self) -> bytes:
        """The Prometheus text exposition format of every sensor."""
        return bytes(generate_latest(self.registry))


class _FirehoseSinkMetrics:
    """The ``firehose_http`` sink's sensors (``egress_sink_firehose_http_*{sink_id}``), and the data
    freshness gauge, whose sinks add themselves to ``freshness.sinks`` while they run."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(f"egress_sink_firehose_http_{name}", text, ["sink_id", *labels], registry=registry)

        self.batches = counter("batches", "Batches sent (first attempts).")
        self.requests = counter("requests", "Requests sent (attempts, retries included).")
        self.retries = counter("retries", "Attempts after the first one of a batch.")
        self.responses = counter("responses", "HTTP responses received, by status.", "status_code")
        self.records = counter("records_delivered", "Records acknowledged by a conforming 200.")
        self.bytes = counter("bytes_delivered", "Record bytes (before base64) acknowledged by a conforming 200.")
        self.error_records = counter("error_output_records", "Records written to the error output.")
        self.dead_letters = counter("dead_letters", "Records written to the dead-letter file.")
        self.freshness = _Freshness()
        registry.register(self.freshness)
