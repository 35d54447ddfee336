"""The batching HTTP sink against a real aiohttp endpoint on loopback (real clock, libcurl client):
the async HTTP sink's delivery rules per batch — retries of a 503 with ``Retry-After``, redirects,
dead letters after the attempt cap, a terminal failure without them, the throttler — each batch
under one ``Idempotency-Key`` and one body on every attempt."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from egress.clock import RealClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.batching_http import BatchingHttpSink, batch_idempotency_key
from egress.connectors.sinks.batching_parameters import BatchingHttpSinkDynamicParameters, BatchingHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.observe import Metrics, StatusTree
from egress.spec import DynamicSpec
from egress.throttler import Throttling
from tests.conftest import ServerFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAST = {"retry_initial_delay": "10ms", "retry_minimum_delay": "10ms", "retry_maximum_delay": "20ms",
        "retry_jitter_ratio": 0.0}


@dataclass
class Seen:
    path: str
    key: str | None
    body: bytes
    at: float


@dataclass
class Endpoint:
    """Records every POST; ``answer(request number, path)`` gives (status, headers) for it."""

    answer: Callable[[int, str], tuple[int, dict[str, str]]] = lambda n, path: (200, {})
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp decompresses a gzip'd body
        self.seen.append(Seen(request.path, request.headers.get("Idempotency-Key"), body,
                              asyncio.get_running_loop().time()))
        status, headers = self.answer(len(self.seen), request.path)
        return web.Response(status=status, headers=headers, text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{path:.*}", self.handle)
        return app


def make_sink(url: str, static: dict[str, Any] | None = None, dynamic: dict[str, Any] | None = None,
              throttling: Throttling | None = None) -> BatchingHttpSink:
    context = SinkContext("deliver", "bulk", 0, RealClock(), Metrics(), StatusTree(), lambda _progress: None,
                          throttling)
    parameters = BatchingHttpSinkParameters.model_validate({"url": url, "payload_column": "p", "max_delay": 0,
                                                            **(static or {})})
    return BatchingHttpSink(context, parameters, BatchingHttpSinkDynamicParameters.model_validate(
        {**FAST, **(dynamic or {})}), SinkProgress())


def messages(count: int, start: int = 1) -> list[OutboxMessage]:
    return [OutboxMessage(seq, "events", f"id-{seq:04d}".encode(), b"[]", None,
                          {"p": json.dumps({"flight": seq})}) for seq in range(start, start + count)]


async def drain(sink: BatchingHttpSink, until: Callable[[SinkProgress], bool], limit: float = 30.0) -> SinkProgress:
    """Commit as a partition job does, every 10 ms, until ``until(progress)``."""

    def committed() -> SinkProgress | None:
        progress = sink.progress()
        sink.committed(progress)
        if until(progress):
            return progress
        assert sink.terminal_error is None, sink.terminal_error
        return None

    return await eventually(committed, what="the batches acknowledged", timeout=limit)


async def test_a_503_with_retry_after_pauses_the_batch_which_comes_back_with_its_key_and_body(
        serve_app: ServerFactory) -> None:
    endpoint = Endpoint(lambda n, path: (503, {"Retry-After": "1"}) if n == 1 else (200, {}))
    sink = make_sink(f"{await serve_app(endpoint.app())}/bulk", {"content_encoding": "gzip"},
                     {"retry_after_maximum_delay": "5s"})  # the cap is retry_maximum_delay (20 ms) without it
    try:
        sink.distribute(messages(5))
        await drain(sink, lambda progress: progress.max_persisted_seq_no == 5)
    finally:
        await sink.close()
    first, second = endpoint.seen
    assert first.key == second.key == batch_idempotency_key(b"id-0001", b"id-0005")
    assert first.body == second.body == b"".join(json.dumps({"flight": i}).encode() + b"\n" for i in range(1, 6))
    assert second.at - first.at >= 1.0, "the retry did not wait the Retry-After (the backoff is 10 ms)"


async def test_a_redirect_is_followed_with_the_batch(serve_app: ServerFactory) -> None:
    endpoint = Endpoint(lambda n, path: (307, {"Location": "/moved"}) if path == "/bulk" else (200, {}))
    sink = make_sink(f"{await serve_app(endpoint.app())}/bulk", {"max_redirect_count": 1})
    try:
        sink.distribute(messages(3))
        await drain(sink, lambda progress: progress.max_persisted_seq_no == 3)
    finally:
        await sink.close()
    assert [(s.path, s.key) for s in endpoint.seen] == [("/bulk", batch_idempotency_key(b"id-0001", b"id-0003")),
                                                         ("/moved", batch_idempotency_key(b"id-0001", b"id-0003"))]
    assert endpoint.seen[0].body == endpoint.seen[1].body


async def test_a_batch_is_dead_lettered_after_the_attempt_cap_and_the_sink_goes_on(
        serve_app: ServerFactory, tmp_path: Path) -> None:
    endpoint = Endpoint(lambda n, path: (500, {}) if n <= 3 else (200, {}))
    dead = tmp_path / "dead.jsonl"
    sink = make_sink(f"{await serve_app(endpoint.app())}/bulk", {"max_events": 2, "dead_letter_path": str(dead)},
                     {"max_attempt_count": 3})
    try:
        sink.distribute(messages(2))
        sink.committed(sink.progress())
        await drain(sink, lambda progress: progress.max_persisted_seq_no == 2)
        sink.distribute(messages(2, start=3))  # the next batch is delivered
        await drain(sink, lambda progress: progress.max_persisted_seq_no == 4)
    finally:
        await sink.close()
    key = batch_idempotency_key(b"id-0001", b"id-0002")
    assert [s.key for s in endpoint.seen] == [key, key, key, batch_idempotency_key(b"id-0003", b"id-0004")]
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [(letter["seq"], letter["idempotency_key"], letter["payload"]) for letter in letters] == [
        (1, key, json.dumps({"flight": 1})), (2, key, json.dumps({"flight": 2}))]
    assert [a["status"] for a in letters[0]["attempts"]] == [500, 500, 500]
    assert "retry policy exhausted after 3 attempt(s)" in letters[0]["error"]


async def test_without_a_dead_letter_file_an_exhausted_batch_stops_the_sink(serve_app: ServerFactory) -> None:
    endpoint = Endpoint(lambda n, path: (500, {}))
    sink = make_sink(f"{await serve_app(endpoint.app())}/bulk", {"max_events": 2, "max_in_flight": 1},
                     {"max_attempt_count": 2})
    try:
        sink.distribute(messages(4))
        sink.committed(sink.progress())
        await eventually(lambda: sink.terminal_error is not None, what="the sink stopped", timeout=30)
        assert "Batching HTTP POST retry policy exhausted after 2 attempt(s)" in sink.terminal_error
        assert sink.progress().max_persisted_seq_no == 0
    finally:
        await sink.close()
    first_key = batch_idempotency_key(b"id-0001", b"id-0002")
    assert [s.key for s in endpoint.seen] == [first_key, first_key], "a later batch was POSTed"


async def test_a_throttled_sink_takes_one_unit_per_post_retries_included(serve_app: ServerFactory) -> None:
    limit = 4  # POSTs per second, burst 4
    endpoint = Endpoint(lambda n, path: (503, {}) if n == 1 else (200, {}))
    throttling = Throttling(DynamicSpec.model_validate({"throttlers": {"api": {"limit": limit, "period": "1s"}}}),
                            RealClock())
    sink = make_sink(f"{await serve_app(endpoint.app())}/bulk", {"max_events": 1, "throttler_id": "api"},
                     throttling=throttling)
    try:
        sink.distribute(messages(8))
        await drain(sink, lambda progress: progress.max_persisted_seq_no == 8)
    finally:
        await sink.close()
        await throttling.aclose()
    times = [s.at - endpoint.seen[0].at for s in endpoint.seen]
    assert len(times) == 9  # 8 batches and one retry, each a unit
    assert times[-1] >= (len(times) - limit) / limit - 0.05, "9 units at 4/s with a burst of 4 take about 1.25 s"
