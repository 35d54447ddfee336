"""The dashboard document (egress.observe.dashboard): rates, buckets and lag ages from samples on a
virtual clock, sink errors and counters matched to their sink, the graph, throttler shares, and a
page that names no other host."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from egress.clock import VirtualClock
from egress.observe.dashboard import BUCKET_SECONDS, Dashboard, History, graph_document, read_counters, sink_error
from egress.observe.metrics import Metrics

GRAPH = graph_document(sources={"rows": "jsonl"}, computations={"deliver": (["events"], ["requests"])},
                       source_streams={"rows": "events"}, sinks={"deliver": {"http": "async_http"}})


def dashboard(metrics: Metrics, clock: VirtualClock, partitions: list[dict[str, Any]], ends: dict[tuple[str, int], int],
              status: dict[str, str] | None = None) -> Dashboard:
    async def status_document() -> dict[str, Any]:
        return {"partitions": partitions, "status": status or {}, "worker": None}

    async def stream_ends() -> dict[tuple[str, int], int]:
        return ends

    return Dashboard(metrics.registry, clock, title="pipeline p", status=status_document, graph=lambda: GRAPH,
                     ends=stream_ends)


async def test_rates_are_counter_differences_over_the_last_five_seconds() -> None:
    clock, metrics = VirtualClock(), Metrics()
    board = dashboard(metrics, clock, [], {})
    assert (await board.document())["sinks"][0]["rate"] is None  # one sample: no rate yet
    for _ in range(10):
        await clock.advance(1.0)
        metrics.sink.records.labels("http", "async_http").inc(20)
        document = await board.document()
    assert document["sinks"][0]["rate"] == pytest.approx(20.0)
    assert document["sinks"][0]["delivered"] == 200
    assert {(e["from"], e["to"]): e["rate"] for e in document["graph"]["edges"]}[
        ("computation:deliver", "sink:deliver/http")] == pytest.approx(20.0)


async def test_polls_closer_than_half_a_second_share_one_sample() -> None:
    clock = VirtualClock()
    history = History(clock)
    history.take(dict)
    await clock.advance(0.2)
    history.take(dict)
    assert len(history.samples) == 1


async def test_responses_are_counted_by_status_class_per_ten_second_bucket() -> None:
    clock, metrics = VirtualClock(100.0), Metrics()
    board = dashboard(metrics, clock, [], {})
    await board.document()
    await clock.advance(BUCKET_SECONDS)
    metrics.sink.responses.labels("http", "async_http", "503").inc(3)
    metrics.sink.responses.labels("http", "async_http", "500").inc(1)
    metrics.sink.attempt_failures.labels("http", "async_http").inc(2)
    await board.document()
    await clock.advance(BUCKET_SECONDS)
    metrics.sink.responses.labels("http", "async_http", "200").inc(5)
    sink = (await board.document())["sinks"][0]
    assert sink["responses"] == {"2xx": 5, "5xx": 4}
    assert sink["chart"]["5xx"][-2:] == [4, 0]
    assert sink["chart"]["2xx"][-2:] == [0, 5]
    assert sink["chart"]["failed"][-2:] == [2, 0]
    assert len(sink["chart"]["2xx"]) == 30


async def test_lag_age_is_the_time_since_a_sample_first_saw_the_oldest_unprocessed_message() -> None:
    clock, metrics = VirtualClock(), Metrics()
    partition = {"computation": "deliver", "partition": 0, "owner": "w1", "input_lag": 0, "unacknowledged": {"http": 2}}
    ends = {("events", 0): 10}
    board = dashboard(metrics, clock, [partition], ends)
    first = (await board.document())["partitions"][0]
    assert (first["input_lag_seconds"], first["unacknowledged"], first["owner"]) == (0.0, 2, "w1")
    await clock.advance(1.0)
    ends[("events", 0)], partition["input_lag"] = 15, 5  # five more appended, none processed
    await board.document()
    await clock.advance(3.0)
    ends[("events", 0)], partition["input_lag"] = 25, 12  # ten more appended, three processed
    row = (await board.document())["partitions"][0]
    assert row["input_lag_seconds"] == pytest.approx(3.0)  # message 10 was first seen 3 s ago
    assert row["input_lag_seconds_at_least"] is False
    assert row["rate_in"] == pytest.approx(15 / 4)
    assert row["rate_out"] == pytest.approx(3 / 4)
    edge = next(e for e in (await board.document())["graph"]["edges"] if e["stream"] == "events")
    assert edge["rate"] == pytest.approx(15 / 4)  # the stream's appends


async def test_a_lag_older_than_every_sample_is_a_lower_bound() -> None:
    clock, metrics = VirtualClock(), Metrics()
    board = dashboard(metrics, clock, [{"computation": "deliver", "partition": 0, "input_lag": 4}], {("events", 0): 4})
    await board.document()
    await clock.advance(2.0)
    row = (await board.document())["partitions"][0]
    assert (row["input_lag_seconds"], row["input_lag_seconds_at_least"]) == (pytest.approx(2.0), True)


async def test_a_sink_in_the_status_tree_is_broken_with_its_error_in_full() -> None:
    error = "Async HTTP POST failed: HTTP status 503\nsecond line"
    board = dashboard(Metrics(), VirtualClock(), [], {}, status={"/sinks/http/async_http_sink": error})
    sink = (await board.document())["sinks"][0]
    assert (sink["broken"], sink["error"]) == (True, error)


def test_sink_errors_match_the_sink_and_the_computation_where_the_path_names_one() -> None:
    status = {"/computations/audit/sinks/http/async_http_sink": "audit's", "/sinks/archive/x": "archive's",
              "/dynamic_spec": "bad file"}
    assert sink_error(status, "audit", "http") == "audit's"
    assert sink_error(status, "deliver", "http") is None
    assert sink_error(status, "deliver", "archive") == "archive's"
    assert sink_error(status, "deliver", "dynamic_spec") is None


async def test_sink_counters_labelled_by_computation_stay_apart() -> None:
    registry, clock = CollectorRegistry(), VirtualClock()
    delivered = Counter("egress_sink_records_delivered", "", ["computation", "sink_id"], registry=registry)
    delivered.labels("a", "http").inc(3)
    delivered.labels("b", "http").inc(7)
    graph = graph_document(sources={}, computations={"a": (["s"], []), "b": (["s"], [])}, source_streams={},
                           sinks={"a": {"http": "async_http"}, "b": {"http": "async_http"}})
    board = Dashboard(registry, clock, title="t", graph=lambda: graph)
    document = await board.document()
    assert [s["delivered"] for s in document["sinks"]] == [3, 7]


def test_the_graph_links_sources_computations_and_sinks_through_their_streams() -> None:
    graph = graph_document(
        sources={"rows": "jsonl"},
        computations={"parse": (["events"], ["parsed"]), "deliver": (["parsed", "retries"], ["retries"])},
        source_streams={"rows": "events"}, sinks={"deliver": {"http": "async_http"}})
    assert [n["id"] for n in graph["nodes"]] == ["source:rows", "computation:parse", "computation:deliver",
                                                 "sink:deliver/http"]
    edges = {(e["from"], e["to"], e["stream"]): e["counter"] for e in graph["edges"]}
    assert edges == {
        ("source:rows", "computation:parse", "events"): ["stream", "events"],
        ("computation:parse", "computation:deliver", "parsed"): ["stream", "parsed"],
        ("computation:deliver", "computation:deliver", "retries"): ["stream", "retries"],  # a feedback loop
        ("computation:deliver", "sink:deliver/http", None): ["sink", "deliver", "http"],
    }


async def test_throttler_shares_compare_granted_rates_with_the_weights_of_the_busy_classes() -> None:
    registry, clock = CollectorRegistry(), VirtualClock()
    granted = Counter("egress_throttler_class_granted", "", ["throttler_id", "quota_class"], registry=registry)
    weight = Gauge("egress_throttler_class_weight", "", ["throttler_id", "quota_class"], registry=registry)
    value = Counter("egress_throttler_value", "", ["throttler_id"], registry=registry)
    Gauge("egress_throttler_queue_size", "", ["throttler_id"], registry=registry).labels("api").set(2)
    for class_id, class_weight in (("vip", 3), ("bulk", 1), ("default", 1)):
        weight.labels("api", class_id).set(class_weight)
        granted.labels("api", class_id)
    board = Dashboard(registry, clock, title="throttler service", limits=lambda: {"api": 20.0})
    await board.document()
    await clock.advance(2.0)
    granted.labels("api", "vip").inc(30)
    granted.labels("api", "bulk").inc(10)
    value.labels("api").inc(40)
    throttler = (await board.document())["throttlers"][0]
    assert (throttler["limit"], throttler["rate"], throttler["queue_size"]) == (20.0, 20.0, 2)
    classes = {c["class_id"]: c for c in throttler["classes"]}
    assert (classes["vip"]["share"], classes["vip"]["weight_share"]) == (0.75, 0.75)
    assert (classes["bulk"]["share"], classes["bulk"]["weight_share"]) == (0.25, 0.25)
    assert classes["default"]["weight_share"] is None  # idle: no share expected


def test_read_counters_sums_over_labels_it_does_not_read() -> None:
    registry = CollectorRegistry()
    rows = Counter("egress_source_rows", "", ["source_id", "shard"], registry=registry)
    rows.labels("a", "1").inc(2)
    rows.labels("a", "2").inc(3)
    assert read_counters(registry)[("source", "a")] == 5


def test_the_page_names_no_other_host() -> None:
    static = resources.files("egress.observe").joinpath("static")
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        text = static.joinpath(name).read_text()
        assert re.findall(r"(?:https?:)?//[\w.-]+", text.replace("http://www.w3.org/2000/svg", "")) == [], name


async def test_webhook_endpoints_are_summed_over_partitions_with_the_worst_state() -> None:
    def row(endpoint: str, state: str, backlog: int, delivered: int) -> dict[str, Any]:
        return {"endpoint": endpoint, "state": state, "backlog": backlog, "delivered": delivered}

    partitions = [
        {"computation": "deliver", "partition": 0, "endpoints": {"hooks": [row("acme", "closed", 0, 5),
                                                                             row("globex", "open", 7, 1)]}},
        {"computation": "deliver", "partition": 1, "endpoints": {"hooks": [row("globex", "paused", 3, 2)]}},
        {"computation": "deliver", "partition": 2},
    ]
    document = await dashboard(Metrics(), VirtualClock(), partitions, {}).document()
    assert document["endpoints"] == [
        {"computation": "deliver", "sink_id": "hooks", "endpoint": "acme", "state": "closed", "backlog": 0,
         "delivered": 5, "partitions": 1},
        {"computation": "deliver", "sink_id": "hooks", "endpoint": "globex", "state": "paused", "backlog": 10,
         "delivered": 3, "partitions": 2}]


async def test_epoch_parts_are_the_seconds_per_part_of_the_last_five_minutes_per_computation() -> None:
    clock, metrics = VirtualClock(), Metrics()
    board = dashboard(metrics, clock, [], {})
    parts = metrics.epoch_part_seconds
    parts.labels("deliver", "read").inc(7.0)  # before the first sample: shown (since the start) for 5 minutes
    [first] = (await board.document())["epoch_parts"]
    assert first["window_seconds"] is None
    assert {p["part"]: p["seconds"] for p in first["parts"]}["read"] == 7.0
    await clock.advance(1.0)
    parts.labels("deliver", "read").inc(1.0)
    [second] = (await board.document())["epoch_parts"]
    assert {p["part"]: p["seconds"] for p in second["parts"]}["read"] == 8.0
    for _ in range(400):  # 400 s of samples: the oldest ones drop out of the five minutes
        await clock.advance(1.0)
        parts.labels("deliver", "process").inc(0.5)
        parts.labels("deliver", "Input.Throttle").inc(0.25)
        document = await board.document()
    [deliver] = document["epoch_parts"]
    seconds = {p["part"]: p["seconds"] for p in deliver["parts"]}
    assert list(seconds) == ["read", "Input.Throttle", "process", "commit", "deliver"]
    assert deliver["window_seconds"] == pytest.approx(300.0)
    assert seconds["process"] == pytest.approx(150.0)  # 300 s at 0.5 s per second
    assert seconds["Input.Throttle"] == pytest.approx(75.0)
    assert seconds["read"] == 0.0  # its 7 s are older than five minutes
    assert {p["part"]: p["share"] for p in deliver["parts"]}["process"] == pytest.approx(2 / 3)
