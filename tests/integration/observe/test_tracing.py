"""OpenTelemetry tracing of a run against a real OTLP/HTTP receiver in the test process
(``tests/otlp_receiver.py``): the span tree of an epoch, the ``Input.Throttle`` span's length on the
virtual clock, and the trace context an endpoint receives."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from egress.clock import VirtualClock
from egress.observe import tracing
from egress.observe.epoch_parts import PARTS
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, payload_spec
from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration


@pytest.fixture
async def otlp(serve_app: ServerFactory) -> AsyncIterator[tuple[OtlpReceiver, Callable[[], object]]]:
    """A receiver, tracing turned on towards it (every trace sampled), and ``flush()`` to await the export."""
    receiver = OtlpReceiver()
    base = await serve_app(receiver.app())
    active = tracing.configure(base, environ={})
    assert active is not None

    async def flush() -> None:  # the exporter's thread POSTs to this loop: never block the loop on it
        await asyncio.to_thread(active.flush)

    yield receiver, flush
    await asyncio.to_thread(tracing.shutdown)


class Endpoint:
    """Answers 200 and keeps each request's ``traceparent`` header."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.traceparents.append(request.headers.get("traceparent"))
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


async def test_an_epoch_is_a_span_with_one_child_per_part_and_input_throttle_lasts_the_throttlers_wait(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Endpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(30)])
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"rows": {"limit": 10, "period": "1s"}}  # 30 rows: waits of seconds
    document["computations"]["deliver"]["input_rows_throttler_id"] = "rows"
    dynamic.write_text(yaml.safe_dump(document))
    clock = VirtualClock(1_800_000_000.0)
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", clock=clock,
                        options=RunOptions(until_drained=True))
    async with clock.autojumping():
        result = await pipeline.run()
    assert result.drained
    await flush()

    epochs = [e for e in receiver.named("epoch") if e.attributes["egress.input_messages"] > 0]
    assert epochs, [s.name for s in receiver.spans]
    for epoch in epochs:
        assert epoch.service == "egress"
        assert epoch.attributes["egress.computation_id"] == "deliver"
        children = receiver.children(epoch)
        assert [c.name for c in children] == list(PARTS)  # read, Input.Throttle, process, commit, deliver
        assert all(epoch.start <= c.start <= c.end <= epoch.end for c in children)
    throttled = [receiver.children(e)[1] for e in epochs]
    # On the virtual clock each Input.Throttle span is exactly the wait the throttler reported, and the
    # waits add up to the counter egress_computation_input_throttle_seconds_total.
    waited = pipeline.metrics.value("egress_computation_input_throttle_seconds_total", computation_id="deliver")
    assert waited >= 1.0
    assert sum(span.seconds for span in throttled) == pytest.approx(waited, abs=1e-6)
    assert pipeline.metrics.value("egress_epoch_part_seconds_total", computation_id="deliver",
                                  part="Input.Throttle") == pytest.approx(waited, abs=1e-9)
    # The controller's decisions are spans of their own service, as long as each request's queue wait.
    decisions = receiver.named("RequestQuota")
    assert decisions
    assert {span.service for span in decisions} == {"egress-throttler"}
    assert {span.attributes["egress.throttler_id"] for span in decisions} == {"rows"}
    for span in decisions:
        assert span.seconds == pytest.approx(span.attributes["egress.queue_wait_seconds"], abs=1e-6)
    assert max(span.attributes["egress.queue_wait_seconds"] for span in decisions) > 0


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-01"
NOT_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


class HoldingEndpoint(Endpoint):
    """Keeps each request's traceparent by body; while ``holding``, holds requests unanswered."""

    def __init__(self, *, holding: bool = False) -> None:
        super().__init__()
        self.by_body: dict[str, str | None] = {}
        self.holding = holding
        self.held = 0
        self.released = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = (await request.read()).decode()
        if self.holding:
            self.held += 1
            await self.released.wait()
            return web.Response(status=503)
        self.by_body[body] = request.headers.get("traceparent")
        return web.Response(text="ok")


async def run_http_pipeline(tmp_path: Path, endpoint_url: str, port: int, readers: int = 1
                            ) -> tuple[Pipeline, asyncio.Task[object]]:
    from tests.conftest import pass_through_spec

    spec = pass_through_spec(tmp_path / "spec.yaml", "tracing_test",
                             {"source_class_name": "http", "parameters": {"port": port, "readers": readers}},
                             endpoint_url)
    pipeline = Pipeline(load_plan(spec), tmp_path / "state")
    task: asyncio.Task[object] = asyncio.create_task(pipeline.run())
    return pipeline, task


async def post_events(port: int, events: list[tuple[str, dict[str, str]]], readers: int = 1) -> None:
    import aiohttp

    from tests.waiting import eventually

    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/events"

        async def listening() -> bool:
            for reader in range(readers):
                async with session.get(f"http://127.0.0.1:{port + reader}/events") as response:
                    if response.status != 405:  # 405: listening (only POST is routed)
                        return False
            return True

        await eventually(listening, what="the http source's readers listening", interval=0.02,
                         ignoring=(aiohttp.ClientConnectionError,))
    # The events on connections of their own: a connection whose first request is a plain POST takes
    # the source's lean path (http_fast), which must hand a traced request to aiohttp's.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for number, (payload, headers) in enumerate(events):
            body = f'{{"id": {number}, "payload": "{payload}"}}'
            async with session.post(url, data=body, headers=headers) as response:
                assert response.status == 200, await response.text()


async def test_the_endpoint_receives_the_trace_of_the_event_the_http_source_received(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    from tests.ports import free_port
    from tests.waiting import eventually

    receiver, flush = otlp
    endpoint = HoldingEndpoint()
    port = free_port()
    pipeline, task = await run_http_pipeline(tmp_path, f"{await serve_app(endpoint.app())}/events", port)
    await post_events(port, [("sampled", {"traceparent": SAMPLED, "tracestate": "vendor=1"}),
                             ("unsampled", {"traceparent": NOT_SAMPLED}),
                             ("untraced", {})])
    await eventually(lambda: len(endpoint.by_body) == 3, what="three deliveries")
    pipeline.request_stop()
    await task
    await flush()

    # The event's trace goes on at the endpoint: the same trace id, the parent the delivery attempt's span.
    sent = endpoint.by_body["sampled"]
    assert sent is not None
    assert sent[3:35] == TRACE
    assert sent.endswith("-01")
    attempts = [s for s in receiver.named("delivery attempt") if s.trace_id == TRACE]
    assert len(attempts) == 1
    attempt = attempts[0]
    assert sent[36:52] == attempt.span_id
    assert attempt.parent_span_id == "00f067aa0ba902b7"
    assert attempt.attributes["egress.attempt"] == 1
    assert attempt.attributes["http.response.status_code"] == 200
    assert attempt.attributes["egress.sink_id"] == "http"
    assert len(attempt.attributes["egress.idempotency_key"]) > 0
    # Not sampled upstream (parentbased sampler): no span, the context sent on as it came.
    assert endpoint.by_body["unsampled"] == NOT_SAMPLED
    assert not [s for s in receiver.spans if s.trace_id == NOT_SAMPLED[3:35]]
    # No context: a trace of its own (every root sampled here).
    untraced = endpoint.by_body["untraced"]
    assert untraced is not None
    assert untraced[3:35] not in (TRACE, NOT_SAMPLED[3:35])


async def test_a_keyed_event_forwarded_to_its_home_reader_keeps_its_trace(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    from egress.connectors.sources.http_peers import key_home
    from tests.ports import free_port
    from tests.waiting import eventually

    receiver, flush = otlp
    endpoint = HoldingEndpoint()
    port = free_port()
    while True:  # two readers on port and port + 1; both free
        try:
            with socket.create_server(("127.0.0.1", port + 1)):
                break
        except OSError:
            port = free_port()
    pipeline, task = await run_http_pipeline(tmp_path, f"{await serve_app(endpoint.app())}/events", port, readers=2)
    key = next(f"key-{n}" for n in range(100) if key_home(f"key-{n}", 2) == 1)  # reader 1's: reader 0 forwards it
    await post_events(port, [("forwarded", {"traceparent": SAMPLED, "tracestate": "vendor=1",
                                            "Idempotency-Key": key})], readers=2)
    await eventually(lambda: "forwarded" in endpoint.by_body, what="the forwarded event delivered")
    pipeline.request_stop()
    await task
    await flush()
    sent = endpoint.by_body["forwarded"]
    assert sent is not None
    assert sent[3:35] == TRACE  # the home continued the event's trace
    [attempt] = [s for s in receiver.named("delivery attempt") if s.trace_id == TRACE]
    assert attempt.parent_span_id == "00f067aa0ba902b7"
    assert sent[36:52] == attempt.span_id


async def test_a_message_keeps_its_events_trace_across_a_restart(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    from tests.ports import free_port
    from tests.waiting import eventually

    holding = HoldingEndpoint(holding=True)
    port = free_port()
    pipeline, task = await run_http_pipeline(tmp_path, f"{await serve_app(holding.app())}/events", port)
    await post_events(port, [("sampled", {"traceparent": SAMPLED})])
    await eventually(lambda: holding.held == 1, what="the first delivery held by the endpoint")
    pipeline.request_stop()  # committed, not acknowledged: the next run sends it again
    await task
    holding.released.set()

    endpoint = HoldingEndpoint()
    second, task = await run_http_pipeline(tmp_path, f"{await serve_app(endpoint.app())}/events", free_port())
    await eventually(lambda: "sampled" in endpoint.by_body, what="the delivery of the restarted run")
    second.request_stop()
    await task
    sent = endpoint.by_body["sampled"]
    assert sent is not None
    assert sent[3:35] == TRACE


async def test_a_batch_is_a_span_over_its_attempts_whose_context_its_requests_carry(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Endpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(20)],
                                 sink_parameters={"max_events": 10, "max_delay": "0s"})
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["sink_class_name"] = "batching_http"
    spec.write_text(yaml.safe_dump(document))
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=RunOptions(until_drained=True))
    assert (await pipeline.run()).drained
    await flush()

    batches = receiver.named("batch")
    assert sum(span.attributes["egress.records"] for span in batches) == 20
    assert len(endpoint.traceparents) == len(batches)
    for batch in batches:
        [attempt] = receiver.children(batch)
        assert attempt.name == "delivery attempt"
        assert attempt.attributes["http.response.status_code"] == 200
        assert any(sent is not None and sent[3:35] == batch.trace_id and sent[36:52] == attempt.span_id
                   for sent in endpoint.traceparents)


async def test_with_propagate_trace_context_false_no_request_carries_a_traceparent(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Endpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(5)],
                                 sink_parameters={"propagate_trace_context": False})
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=RunOptions(until_drained=True))
    assert (await pipeline.run()).drained
    await flush()
    assert endpoint.traceparents == [None] * 5
    assert len(receiver.named("delivery attempt")) == 5  # still traced, only not sent on


class FailingOnce(Endpoint):
    """Answers the first request 503, every later one 200."""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.traceparents.append(request.headers.get("traceparent"))
        return web.Response(status=503 if len(self.traceparents) == 1 else 200)


async def test_each_attempt_of_a_retried_delivery_is_a_span_whose_context_its_request_carries(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = FailingOnce()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", ["only"])
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=RunOptions(until_drained=True))
    assert (await pipeline.run()).drained
    await flush()
    first, second = sorted(receiver.named("delivery attempt"), key=lambda span: span.attributes["egress.attempt"])
    assert (first.attributes["egress.attempt"], second.attributes["egress.attempt"]) == (1, 2)
    assert first.attributes["http.response.status_code"] == 503
    assert first.status_code == 2  # ERROR
    assert second.attributes["http.response.status_code"] == 200
    assert second.status_code != 2
    assert second.trace_id == first.trace_id  # one trace: the retry follows the failed first attempt
    assert second.parent_span_id == first.span_id
    assert first.attributes["egress.idempotency_key"] == second.attributes["egress.idempotency_key"]
    sent = [(tp[3:35], tp[36:52]) for tp in endpoint.traceparents if tp is not None]
    assert sent == [(first.trace_id, first.span_id), (second.trace_id, second.span_id)]


class Hooks:
    """Webhook endpoints on one server (``/hooks/{name}``): keeps each request's ``traceparent`` and
    ``webhook-id`` by endpoint; an endpoint in ``failing_once`` answers its first request 503."""

    def __init__(self, *, failing_once: frozenset[str] = frozenset()) -> None:
        self.got: dict[str, list[tuple[str | None, str]]] = {}
        self.failing_once = set(failing_once)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        name = request.match_info["name"]
        self.got.setdefault(name, []).append((request.headers.get("traceparent"), request.headers["webhook-id"]))
        if name in self.failing_once:
            self.failing_once.discard(name)
            return web.Response(status=503)
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hooks/{name}", self.handle)
        return app


def webhook_sink(tmp_path: Path, base: str, contexts: dict[int, str], **static: object) -> object:
    """A ``webhook_http`` sink to endpoints ``a`` and ``b`` of ``base``, its partition's messages
    carrying ``contexts`` (seq → trace context, as the runtime loads them from the outbox)."""
    import base64

    from egress.clock import RealClock
    from egress.connectors.base import SinkContext
    from egress.connectors.sinks.webhook_http import WebhookHttpSink
    from egress.connectors.sinks.webhook_parameters import WebhookSinkDynamicParameters, WebhookSinkParameters
    from egress.engines import SinkProgress
    from egress.observe import Metrics, StatusTree

    secret = tmp_path / "secret"
    secret.write_text("whsec_" + base64.b64encode(b"s" * 32).decode() + "\n")
    context = SinkContext("deliver", "hooks", 0, RealClock(), Metrics(), StatusTree(), lambda progress: None,
                          trace_contexts=contexts)
    dynamic = {"retry_initial_delay": "10ms", "retry_minimum_delay": "10ms", "endpoints": {
        name: {"url": f"{base}/hooks/{name}", "secret_file": str(secret)} for name in ("a", "b")}}
    return WebhookHttpSink(context, WebhookSinkParameters.model_validate(
        {"payload_column": "payload", "endpoint_column": "customer", **static}),
        WebhookSinkDynamicParameters.model_validate(dynamic), SinkProgress())


def webhook_messages(plan: list[str]) -> list[object]:
    from egress.engines import OutboxMessage

    return [OutboxMessage(seq, "events", f"m{seq}".encode(), f"k{seq}".encode(), None,
                          {"customer": customer, "payload": f"{customer}/{seq}"})
            for seq, customer in enumerate(plan, 1)]


async def test_each_webhook_attempt_is_a_span_naming_its_endpoint_whose_context_its_request_carries(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    from tests.waiting import eventually

    receiver, flush = otlp
    hooks = Hooks(failing_once=frozenset({"b"}))
    sink: Any = webhook_sink(tmp_path, await serve_app(hooks.app()), {1: f"{SAMPLED}\nvendor=1"})
    sink.distribute(webhook_messages(["a", "b", "a"]))

    async def answered() -> bool:  # every attempt's span ended with its response
        await flush()
        spans = receiver.named("delivery attempt")
        return len(spans) == 4 and all("http.response.status_code" in s.attributes for s in spans)

    await eventually(answered, what="four attempts answered: a's two, b's failed one and its retry")
    await sink.close()

    attempts = receiver.named("delivery attempt")
    # seq 1 carried its event's sampled context: its attempt is a child of it, and the request says so.
    [carried] = [s for s in attempts if s.trace_id == TRACE]
    assert carried.parent_span_id == "00f067aa0ba902b7"
    assert carried.attributes["egress.endpoint"] == "a"
    assert carried.attributes["egress.attempt"] == 1
    assert carried.attributes["egress.seq"] == 1
    assert carried.attributes["http.response.status_code"] == 200
    assert carried.attributes["egress.throttler_wait_seconds"] == 0.0
    [(sent, webhook_id)] = [(tp, key) for tp, key in hooks.got["a"] if tp is not None and tp[3:35] == TRACE]
    assert sent[36:52] == carried.span_id
    assert carried.attributes["egress.idempotency_key"] == webhook_id
    # seq 2 failed once at b: two spans in one trace, the retry a child of the failed first attempt.
    first, second = sorted((s for s in attempts if s.attributes["egress.endpoint"] == "b"),
                           key=lambda span: span.attributes["egress.attempt"])
    assert (first.attributes["egress.attempt"], second.attributes["egress.attempt"]) == (1, 2)
    assert first.status_code == 2
    assert first.attributes["http.response.status_code"] == 503
    assert second.status_code != 2
    assert second.attributes["http.response.status_code"] == 200
    assert second.trace_id == first.trace_id
    assert second.parent_span_id == first.span_id
    assert [(tp[3:35], tp[36:52]) for tp, _ in hooks.got["b"] if tp is not None] == [
        (first.trace_id, first.span_id), (second.trace_id, second.span_id)]
    # seq 3 without a context: a trace of its own (every root sampled here), sent on too.
    [own] = [s for s in attempts if s.attributes["egress.seq"] == 3]
    assert own.trace_id != TRACE
    assert own.parent_span_id == ""
    assert (own.trace_id, own.span_id) in {(tp[3:35], tp[36:52]) for tp, _ in hooks.got["a"] if tp is not None}


async def test_a_webhook_sink_with_propagate_trace_context_false_sends_no_traceparent(
        tmp_path: Path, serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    from tests.waiting import eventually

    receiver, flush = otlp
    hooks = Hooks()
    sink: Any = webhook_sink(tmp_path, await serve_app(hooks.app()), {1: SAMPLED}, propagate_trace_context=False)
    sink.distribute(webhook_messages(["a", "b"]))

    async def answered() -> bool:
        await flush()
        return len(receiver.named("delivery attempt")) == 2  # still traced, only not sent on

    await eventually(answered, what="two attempts traced")
    await sink.close()
    assert [tp for got in hooks.got.values() for tp, _ in got] == [None, None]


class Firehose:
    """A Firehose endpoint (``/ingest``): keeps each request's ``traceparent`` and request id; answers
    the first ``failing`` requests 503, then conforming 200s."""

    def __init__(self, failing: int = 0) -> None:
        self.got: list[tuple[str | None, str]] = []
        self.failing = failing

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        request_id = request.headers["X-Amz-Firehose-Request-Id"]
        self.got.append((request.headers.get("traceparent"), request_id))
        status = 503 if len(self.got) <= self.failing else 200
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000}, status=status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/ingest", self.handle)
        return app


async def firehose_deliver(url: str, payloads: list[str], contexts: dict[int, str], **static: object) -> None:
    """``payloads`` (seq 1..n) through a ``firehose_http`` sink as one request, its messages carrying
    ``contexts``; returns once the request was acknowledged."""
    from egress.clock import RealClock
    from egress.connectors.base import SinkContext
    from egress.connectors.sinks.firehose_http import FirehoseHttpSink
    from egress.connectors.sinks.firehose_parameters import (
        FirehoseHttpSinkDynamicParameters,
        FirehoseHttpSinkParameters,
    )
    from egress.engines import OutboxMessage, SinkProgress
    from egress.observe import Metrics, StatusTree
    from tests.waiting import eventually

    sinks: list[FirehoseHttpSink] = []

    def commit_at_once(progress: SinkProgress) -> None:  # a job committing each report (and batch end) at once
        asyncio.get_running_loop().call_soon(lambda: sinks[0].committed(progress))

    context = SinkContext("deliver", "firehose", 0, RealClock(), Metrics(), StatusTree(), commit_at_once,
                          trace_contexts=contexts)
    parameters = FirehoseHttpSinkParameters.model_validate({
        "url": url, "payload_column": "payload", "stream_name": "flights",
        "buffering_hints": {"size_in_mbs": 5, "interval_in_seconds": 0}, **static})
    dynamic = FirehoseHttpSinkDynamicParameters.model_validate({"retry_initial_delay": "10ms",
                                                                "retry_maximum_delay": "20ms"})
    sink = FirehoseHttpSink(context, parameters, dynamic, SinkProgress())
    sinks.append(sink)
    sink.distribute([OutboxMessage(seq, "requests", f"message-{seq:08d}".encode(), b"[]", None, {"payload": payload})
                     for seq, payload in enumerate(payloads, 1)])
    await eventually(lambda: sink.progress().max_persisted_seq_no == len(payloads), what="the request acknowledged")
    await sink.close()


async def test_each_attempt_of_a_firehose_request_is_a_span_under_its_first_records_trace(
        serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Firehose(failing=1)
    await firehose_deliver(f"{await serve_app(endpoint.app())}/ingest", ["a", "b", "c"],
                           {1: f"{SAMPLED}\nvendor=1", 3: NOT_SAMPLED})
    await flush()

    first, second = sorted(receiver.named("delivery attempt"), key=lambda span: span.attributes["egress.attempt"])
    [(_, request_id), _] = endpoint.got
    for span in (first, second):  # both in the trace of the first record, children of its span
        assert span.trace_id == TRACE
        assert span.parent_span_id == "00f067aa0ba902b7"
        assert span.attributes["egress.records"] == 3
        assert span.attributes["egress.firehose_request_id"] == request_id
        assert span.attributes["egress.sink_id"] == "firehose"
    assert (first.attributes["egress.attempt"], second.attributes["egress.attempt"]) == (1, 2)
    assert first.attributes["http.response.status_code"] == 503
    assert first.status_code == 2
    assert second.attributes["http.response.status_code"] == 200
    assert second.status_code != 2
    # Each request carried its attempt's span as the parent, in the first record's trace.
    assert [(tp[3:35], tp[36:52]) for tp, _ in endpoint.got if tp is not None] == [
        (TRACE, first.span_id), (TRACE, second.span_id)]


async def test_a_firehose_request_whose_first_record_carries_no_context_is_a_trace_of_its_own(
        serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Firehose()
    await firehose_deliver(f"{await serve_app(endpoint.app())}/ingest", ["a", "b"], {2: SAMPLED})
    await flush()
    [span] = receiver.named("delivery attempt")
    assert span.trace_id != TRACE
    assert span.parent_span_id == ""
    [(sent, _)] = endpoint.got
    assert sent is not None
    assert (sent[3:35], sent[36:52]) == (span.trace_id, span.span_id)


async def test_a_firehose_sink_with_propagate_trace_context_false_sends_no_traceparent(
        serve_app: ServerFactory, otlp: tuple[OtlpReceiver, Callable[[], object]]) -> None:
    receiver, flush = otlp
    endpoint = Firehose()
    await firehose_deliver(f"{await serve_app(endpoint.app())}/ingest", ["a"], {1: SAMPLED},
                           propagate_trace_context=False)
    await flush()
    assert [sent for sent, _ in endpoint.got] == [None]
    [span] = receiver.named("delivery attempt")  # still traced, only not sent on
    assert span.trace_id == TRACE
