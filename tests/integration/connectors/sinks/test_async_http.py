"""The async HTTP sink against real aiohttp servers on loopback (real sockets, real libcurl)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from egress.clock import RealClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.observe import Metrics, StatusTree
from tests.conftest import ServerFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAST_RETRIES = {"retry_initial_delay": "10ms", "retry_minimum_delay": "10ms", "retry_maximum_delay": "20ms"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Recorder:
    """An endpoint that records every request and answers with ``respond(request, attempt)``."""

    def __init__(self, respond: Callable[[bytes, str, int], Awaitable[int]] | None = None) -> None:
        self.requests: list[tuple[bytes, dict[str, str]]] = []
        self.attempts: Counter[str] = Counter()
        self._respond = respond

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        self.attempts[key] += 1
        self.requests.append((body, dict(request.headers)))
        status = await self._respond(body, key, self.attempts[key]) if self._respond else 200
        return web.Response(status=status, text="done")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


def make_sink(url: str, *, static: dict[str, Any] | None = None, dynamic: dict[str, Any] | None = None,
              progress: SinkProgress | None = None) -> tuple[AsyncHttpSink, Metrics, StatusTree, asyncio.Event]:
    metrics = Metrics()
    status = StatusTree()
    changed = asyncio.Event()
    context = SinkContext("deliver", "http", 0, RealClock(), metrics, status, lambda _progress: changed.set())
    sink = AsyncHttpSink(
        context,
        AsyncHttpSinkParameters.model_validate({"url": url, "payload_column": "payload", **(static or {})}),
        AsyncHttpSinkDynamicParameters.model_validate({**FAST_RETRIES, **(dynamic or {})}),
        progress or SinkProgress(),
    )
    return sink, metrics, status, changed


def sink_counter(metrics: Metrics, name: str) -> float:
    """The value of sensor sample ``name`` for sink ``http``, whatever other labels it carries."""
    return sum(sample.value for family in metrics.registry.collect() for sample in family.samples
               if sample.name == name and sample.labels.get("sink_id") == "http")


def messages(payloads: list[Any], first_seq: int = 1) -> list[OutboxMessage]:
    return [OutboxMessage(first_seq + i, "requests", f"message-{first_seq + i}".encode(), b"[]", None,
                          {"payload": p}) for i, p in enumerate(payloads)]


async def test_posts_payload_bytes_unchanged_with_the_hex_message_id_as_idempotency_key(
        serve_app: ServerFactory) -> None:
    recorder = Recorder()
    base = await serve_app(recorder.app())
    sink, _, _, _ = make_sink(f"{base}/events", static={"headers": {"X-Pipeline": "flights"}})
    payloads = ['{"origin":"EWR","delay":-3}', "Zürich ✈ 東京", "x" * 100_000, ""]
    sink.distribute(messages(payloads))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 4)
    assert sorted(body for body, _ in recorder.requests) == sorted(p.encode() for p in payloads)
    by_body = {body: headers for body, headers in recorder.requests}
    headers = by_body[payloads[0].encode()]
    assert headers["Idempotency-Key"] == b"message-1".hex().upper()
    assert headers["X-Pipeline"] == "flights"
    assert "Content-Type" not in headers  # libcurl's form-urlencoded default must not leak in
    assert "Expect" not in by_body[payloads[2].encode()]
    assert sink.progress() == SinkProgress("", b"message-4", 4)
    await sink.close()


async def test_idempotency_header_can_be_renamed_or_disabled(serve_app: ServerFactory) -> None:
    recorder = Recorder()
    base = await serve_app(recorder.app())
    renamed, _, _, _ = make_sink(f"{base}/events", static={"idempotency_header": "X-Message-Id"})
    renamed.distribute(messages(["a"]))
    disabled, _, _, _ = make_sink(f"{base}/events", static={"idempotency_header": ""})
    disabled.distribute(messages(["b"]))
    await eventually(lambda: len(recorder.requests) == 2)
    headers = {body: h for body, h in recorder.requests}
    assert headers[b"a"]["X-Message-Id"] == b"message-1".hex().upper()
    assert "Idempotency-Key" not in headers[b"a"]
    assert not any(name.lower() in ("idempotency-key", "x-message-id") for name in headers[b"b"])
    await renamed.close()
    await disabled.close()


async def test_null_payloads_are_acknowledged_in_order_without_a_request(serve_app: ServerFactory) -> None:
    recorder = Recorder()
    base = await serve_app(recorder.app())
    sink, metrics, _, _ = make_sink(f"{base}/events")
    sink.distribute(messages([None, "a", None, None]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 4)
    assert [body for body, _ in recorder.requests] == [b"a"]
    assert metrics.total("egress_sink_responses_total") == 1
    await sink.close()


async def test_acknowledgements_advance_only_as_a_contiguous_prefix(serve_app: ServerFactory) -> None:
    release = asyncio.Event()

    async def respond(body: bytes, key: str, attempt: int) -> int:
        if body == b"slow":
            await release.wait()
        return 200

    recorder = Recorder(respond)
    base = await serve_app(recorder.app())
    sink, metrics, _, _ = make_sink(f"{base}/events")
    sink.distribute(messages(["fast-1", "slow", "fast-3", "fast-4"]))
    await eventually(lambda: len(recorder.requests) == 4)
    await eventually(lambda: sink_counter(metrics, "egress_sink_records_delivered_total") == 3)  # 1, 3 and 4
    assert sink.progress().max_persisted_seq_no == 1  # seq 2 is still in flight: nothing past it
    assert sink.unacknowledged == 3
    release.set()
    await eventually(lambda: sink.progress().max_persisted_seq_no == 4)
    await sink.close()


async def test_transient_failures_are_retried_with_the_same_body_and_key(serve_app: ServerFactory) -> None:
    async def respond(body: bytes, key: str, attempt: int) -> int:
        return 503 if attempt <= 2 else 200

    recorder = Recorder(respond)
    base = await serve_app(recorder.app())
    sink, metrics, status, _ = make_sink(f"{base}/events")
    sink.distribute(messages(["a", "b", "c"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    assert set(recorder.attempts.values()) == {3}
    bodies_by_key: dict[str, set[bytes]] = {}
    for body, headers in recorder.requests:
        bodies_by_key.setdefault(headers["Idempotency-Key"], set()).add(body)
    assert all(len(bodies) == 1 for bodies in bodies_by_key.values())
    assert metrics.value("egress_sink_responses_total", sink_id="http", status_code="503") == 6
    assert metrics.value("egress_sink_retries_total", sink_id="http") == 6
    assert status.error("/sinks/http/async_http_sink") is None  # cleared once nothing fails
    await sink.close()


async def test_exhausted_retries_are_terminal_and_block_later_messages(serve_app: ServerFactory) -> None:
    async def respond(body: bytes, key: str, attempt: int) -> int:
        return 500 if body == b"poison" else 200

    recorder = Recorder(respond)
    base = await serve_app(recorder.app())
    sink, metrics, status, _ = make_sink(f"{base}/events", dynamic={"max_attempt_count": 3})
    sink.distribute(messages(["ok-1", "poison"]))
    await eventually(lambda: sink.terminal_error is not None)
    assert sink.terminal_error is not None
    assert sink.terminal_error.startswith("Async HTTP POST retry policy exhausted after 3 attempt(s)")
    assert "HTTP status 500" in sink.terminal_error
    sent = sink_counter(metrics, "egress_sink_requests_total")
    sink.distribute(messages(["later-3", "later-4"], first_seq=3))
    for _ in range(10):  # turns of the loop, not time: a request is counted when it is submitted
        await asyncio.sleep(0)
    assert sink_counter(metrics, "egress_sink_requests_total") == sent
    assert recorder.attempts[b"message-2".hex().upper()] == 3
    assert not any(body.startswith(b"later") for body, _ in recorder.requests)
    assert sink.progress().max_persisted_seq_no == 1
    assert (status.error("/sinks/http/async_http_sink") or "").startswith("Async HTTP POST retry policy exhausted")
    await sink.close()


async def test_connection_refused_acknowledges_nothing(unused_tcp_port: int) -> None:
    sink, metrics, _, _ = make_sink(f"http://127.0.0.1:{unused_tcp_port}/events", dynamic={"max_attempt_count": 2})
    sink.distribute(messages(["a"]))
    await eventually(lambda: sink.terminal_error is not None)
    assert sink.progress().max_persisted_seq_no == 0
    assert metrics.value("egress_sink_attempt_failures_total", sink_id="http") == 2
    assert "curl error 7" in (sink.terminal_error or "")
    await sink.close()


async def test_messages_persisted_before_a_restart_are_not_posted_again(serve_app: ServerFactory) -> None:
    recorder = Recorder()
    base = await serve_app(recorder.app())
    sink, _, _, _ = make_sink(f"{base}/events", progress=SinkProgress("", b"message-2", 2))
    sink.distribute(messages(["a", "b", "c"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    assert [body for body, _ in recorder.requests] == [b"c"]
    await sink.close()
