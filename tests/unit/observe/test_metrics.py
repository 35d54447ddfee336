"""The metrics registry: sink sensors labelled by computation, the cheap histogram, process_* metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily

from egress.clock import VirtualClock
from egress.connectors.base import SinkContext
from egress.observe import Metrics, StatusTree
from egress.observe.metrics import Histogram


def test_two_computations_with_a_sink_of_the_same_name_count_in_separate_series() -> None:
    metrics = Metrics()
    first = SinkContext("first", "http", 0, VirtualClock(), metrics, StatusTree(), lambda _progress: None)
    second = SinkContext("second", "http", 0, VirtualClock(), metrics, StatusTree(), lambda _progress: None)
    first.metrics.sink.records.labels("http", "async_http").inc(3)
    second.metrics.sink.records.labels("http", "async_http").inc(5)
    second.metrics.sink.records.labels("http", "batching_http").inc(7)
    name = "egress_sink_records_delivered_total"
    assert metrics.value(name, computation_id="first", sink_id="http", sink_class="async_http") == 3
    assert metrics.value(name, computation_id="second", sink_id="http", sink_class="async_http") == 5
    assert metrics.value(name, sink_id="http", sink_class="async_http") == 8  # a subset of the labels adds up
    assert metrics.value(name, computation_id="second", sink_class="batching_http") == 7
    assert metrics.value(name, sink_id="http") == 15  # one family for every sink class
    assert 'computation_id="first",sink_class="async_http",sink_id="http"' in metrics.exposition().decode()


def test_a_histogram_counts_a_batch_of_observations_in_one_call_into_cumulative_buckets() -> None:
    metrics = Metrics()
    histogram = Histogram("egress_test_seconds", "test", ["sink_id"], metrics.registry, buckets=(0.1, 1.0))
    histogram.labels("http").observe(0.05, 3)
    histogram.labels("http").observe(0.5)
    histogram.labels("http").observe(0.1)  # on a bound: counted in it (le)
    histogram.labels("http").observe(7.0, 2)
    assert metrics.value("egress_test_seconds_bucket", sink_id="http", le="0.1") == 4
    assert metrics.value("egress_test_seconds_bucket", sink_id="http", le="1.0") == 5
    assert metrics.value("egress_test_seconds_bucket", sink_id="http", le="+Inf") == 7
    assert metrics.value("egress_test_seconds_count", sink_id="http") == 7
    assert abs(metrics.value("egress_test_seconds_sum", sink_id="http") - (0.15 + 0.5 + 0.1 + 14.0)) < 1e-9
    text = metrics.exposition().decode()
    assert "# TYPE egress_test_seconds histogram" in text
    assert 'egress_test_seconds_bucket{le="+Inf",sink_id="http"} 7.0' in text


def test_the_delivery_and_attempt_histograms_carry_the_computation() -> None:
    metrics = Metrics()
    context = SinkContext("deliver", "http", 0, VirtualClock(), metrics, StatusTree(), lambda _progress: None)
    context.metrics.attempt_duration.labels("http").observe(0.2)
    metrics.delivery_latency.bound("deliver").labels("http").observe(1.5, 4)
    assert metrics.value("egress_sink_attempt_duration_seconds_count", computation_id="deliver", sink_id="http") == 1
    assert metrics.value("egress_sink_delivery_latency_seconds_count", computation_id="deliver", sink_id="http") == 4


def test_the_registry_has_the_process_metrics() -> None:
    text = Metrics().exposition().decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert f"\n{name} " in text


class CustomCollector:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("egress_test_custom", "test", value=3)


def _created_masked(text: str) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)  # the creation times differ by microseconds


def _exposed(*collectors: object) -> str:
    registry = CollectorRegistry(auto_describe=True)
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return _created_masked(generate_latest(registry).decode())


def test_the_sensors_are_exposed_as_prometheus_clients_counters_and_gauges_of_their_names_are() -> None:
    metrics = Metrics()
    reference = CollectorRegistry(auto_describe=True)
    rows = Counter("egress_source_rows", "Rows read by a source and appended to its stream.", ["source_id"],
                   registry=reference)
    lag = Gauge("egress_partition_input_lag", metrics.partition_input_lag.documentation,
                ["computation", "partition"], registry=reference)
    for counter in (rows, metrics.source_rows):
        counter.labels("payloads").inc(3)
        counter.labels("payloads").inc()
        counter.labels(7).inc(2.5)  # a label value made a string
    for gauge in (lag, metrics.partition_input_lag):
        gauge.labels("deliver", 0).set(12)
        gauge.labels("deliver", 1).set(3)
        gauge.labels("deliver", 1).inc(2)
    assert _exposed(metrics.source_rows, metrics.partition_input_lag) == _created_masked(
        generate_latest(reference).decode())
    assert metrics.value("egress_source_rows_total", source_id="payloads") == 4
    with pytest.raises(ValueError, match="non-negative"):
        metrics.source_rows.labels("payloads").inc(-1)
    with pytest.raises(ValueError, match="Incorrect label count"):
        metrics.source_rows.labels("payloads", "extra")


def test_values_read_before_and_after_the_registry_is_made_are_the_same() -> None:
    metrics = Metrics()
    metrics.source_rows.labels("payloads").inc(4)
    metrics.sink.responses.bound("deliver").labels("http", "async_http", 200).inc(2)
    metrics.delivery_latency.bound("deliver").labels("http").observe(0.2, 3)
    names = ("egress_source_rows_total", "egress_sink_responses_total", "egress_sink_delivery_latency_seconds_bucket",
             "egress_sink_delivery_latency_seconds_count", "egress_sink_delivery_latency_seconds_sum")
    before = {name: sorted((sorted(labels.items()), value) for labels, value in metrics.samples(name))
              for name in names}
    assert metrics._exposed.registry is None  # read from the sensors: prometheus-client's families not made
    assert metrics.exposition()  # makes the registry
    after = {name: sorted((sorted(labels.items()), value) for labels, value in metrics.samples(name))
             for name in names}
    assert before == after
    assert before["egress_source_rows_total"] == [([("source_id", "payloads")], 4.0)]


def test_a_computations_view_and_the_run_share_one_registry() -> None:
    metrics = Metrics()
    view = metrics.for_computation("deliver")
    view.registry.register(CustomCollector())  # as a sink registers its own families (webhook endpoints)
    assert metrics.registry is view.registry
    assert metrics.value("egress_test_custom") == 3
