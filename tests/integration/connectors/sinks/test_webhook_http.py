"""The webhook sink against real aiohttp servers on loopback: per-endpoint isolation, the committed
per-endpoint prefixes a restart resumes from, per-key order, signatures, the breaker."""

from __future__ import annotations

import asyncio
import base64
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from egress.clock import RealClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.webhook_endpoints import decode_state
from egress.connectors.sinks.webhook_http import WebhookHttpSink
from egress.connectors.sinks.webhook_parameters import WebhookSinkDynamicParameters, WebhookSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.keys import idempotency_key
from egress.observe import Metrics, StatusTree
from tests.conftest import ServerFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
FAST = {"retry_initial_delay": "10ms", "retry_minimum_delay": "10ms", "retry_maximum_delay": "20ms",
        "max_attempt_count": 2, "breaker": {"open_for": "100ms"}}


class Endpoints:
    """One server, one path per endpoint; ``down`` paths answer 503; every request is verified with
    the reference library and recorded by path: (key, payload)."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.got: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.requests: dict[str, int] = defaultdict(int)
        self.bad_signatures = 0
        self._verifier = Webhook(SECRET)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        name = request.match_info["name"]
        self.requests[name] += 1
        try:
            self._verifier.verify(body, dict(request.headers), json_parse=False)
        except Exception:
            self.bad_signatures += 1
            return web.Response(status=401)
        if name in self.down:
            return web.Response(status=503)
        self.got[name].append((request.headers["webhook-id"], body.decode()))
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hooks/{name}", self.handle)
        return app


class Harness:
    def __init__(self, base: str, secret_file: Path, names: list[str], **dynamic: Any) -> None:
        self.status = StatusTree()
        self.metrics = Metrics()
        self.reported: list[SinkProgress] = []
        self.dynamic = {**FAST, "endpoints": {
            name: {"url": f"{base}/hooks/{name}", "secret_file": str(secret_file)} for name in names}, **dynamic}
        self.outbox: list[OutboxMessage] = []

    def sink(self, progress: SinkProgress | None = None, **static: Any) -> WebhookHttpSink:
        async def read_outbox(after: int, last: int) -> list[OutboxMessage]:
            return [m for m in self.outbox if after < m.seq <= last]

        context = SinkContext("deliver", "hooks", 0, RealClock(), self.metrics, self.status, self.reported.append,
                              read_outbox=read_outbox if static.pop("spill", False) else None)
        return WebhookHttpSink(
            context, WebhookSinkParameters.model_validate(
                {"payload_column": "payload", "endpoint_column": "customer", **static}),
            WebhookSinkDynamicParameters.model_validate(self.dynamic), progress or SinkProgress())

    def messages(self, plan: list[tuple[str, str]]) -> list[OutboxMessage]:
        """(customer, key) per message, seq 1..n; the payload names customer, key and seq."""
        self.outbox = [OutboxMessage(seq, "events", f"m{seq}".encode(), key.encode(), None,
                                     {"customer": customer, "payload": f"{customer}/{key}/{seq}"})
                       for seq, (customer, key) in enumerate(plan, 1)]
        return self.outbox

    @property
    def last(self) -> SinkProgress:
        return self.reported[-1] if self.reported else SinkProgress()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    return path


def plan_of(names: list[str], count: int, keys: int = 3) -> list[tuple[str, str]]:
    return [(names[i % len(names)], f"k{i % keys}") for i in range(count)]


async def test_a_failing_endpoint_holds_back_only_its_own_messages_and_they_follow_in_order_once_it_returns(
        serve_app: ServerFactory, secret_file: Path) -> None:
    endpoints = Endpoints()
    base = await serve_app(endpoints.app())
    names = ["a", "b", "c"]
    harness = Harness(base, secret_file, names)
    endpoints.down.add("b")
    sink = harness.sink()
    messages = harness.messages(plan_of(names, 60))
    sink.distribute(messages)
    await eventually(lambda: len(endpoints.got["a"]) == 20 and len(endpoints.got["c"]) == 20)
    await eventually(lambda: decode_state(harness.last.sink_state) == {"a": 58, "c": 60})
    assert harness.last.max_persisted_seq_no == 1  # below b's first message, seq 2: the outbox keeps it
    assert endpoints.got["b"] == []
    assert sink.unacknowledged >= 20  # b's messages are still held
    assert harness.status.error("/sinks/hooks/webhook/b") is not None
    endpoints.down.clear()
    await eventually(lambda: len(endpoints.got["b"]) == 20)
    await eventually(lambda: harness.last.max_persisted_seq_no == 60)
    assert harness.last.sink_state == b""  # nobody is beyond the partition-wide prefix
    for name in names:  # per endpoint and key, in seq order; each once
        seqs = [int(payload.rsplit("/", 1)[1]) for _, payload in endpoints.got[name]]
        by_key: dict[str, list[int]] = defaultdict(list)
        for _, payload in endpoints.got[name]:
            by_key[payload.split("/")[1]].append(int(payload.rsplit("/", 1)[1]))
        assert all(keyed == sorted(keyed) for keyed in by_key.values())
        assert sorted(seqs) == [m.seq for m in messages if m.row["customer"] == name]
    assert endpoints.bad_signatures == 0
    await sink.close()


async def test_a_restart_resumes_each_endpoint_exactly_at_its_committed_prefix(
        serve_app: ServerFactory, secret_file: Path) -> None:
    endpoints = Endpoints()
    base = await serve_app(endpoints.app())
    names = ["a", "b", "c"]
    harness = Harness(base, secret_file, names)
    endpoints.down.add("b")
    sink = harness.sink()
    messages = harness.messages(plan_of(names, 30))
    sink.distribute(messages)
    await eventually(lambda: decode_state(harness.last.sink_state) == {"a": 28, "c": 30})
    committed = harness.last
    await sink.close()
    sent_before = {name: list(endpoints.got[name]) for name in names}
    endpoints.down.clear()
    restarted = harness.sink(committed)
    restarted.distribute(messages)  # the job hands the untrimmed outbox over again
    await eventually(lambda: harness.last.max_persisted_seq_no == 30)
    assert endpoints.got["a"] == sent_before["a"]
    assert endpoints.got["c"] == sent_before["c"]
    assert [p for _, p in endpoints.got["b"]] == [m.row["payload"] for m in messages if m.row["customer"] == "b"]
    await restarted.close()


async def test_the_breaker_opens_stops_calling_pauses_after_disable_after_and_resumes_on_request(
        serve_app: ServerFactory, secret_file: Path) -> None:
    endpoints = Endpoints()
    base = await serve_app(endpoints.app())
    harness = Harness(base, secret_file, ["a", "b"], breaker={
        "minimum_requests": 3, "failure_ratio": 0.5, "window": "10s", "open_for": "200ms", "disable_after": "1s"})
    endpoints.down.add("b")
    sink = harness.sink()
    sink.distribute(harness.messages(plan_of(["a", "b"], 20)))
    await eventually(lambda: "paused by its breaker" in str(harness.status.error("/sinks/hooks/webhook/b/breaker")),
                     timeout=30)
    assert [r["state"] for r in sink.endpoint_rows() if r["endpoint"] == "b"] == ["paused"]
    calls = endpoints.requests["b"]
    assert len(endpoints.got["a"]) == 10
    endpoints.down.clear()
    assert sink.resume_endpoint("b")
    await eventually(lambda: len(endpoints.got["b"]) == 10)
    assert endpoints.requests["b"] >= calls + 10
    assert harness.metrics.value("egress_webhook_endpoint_opened_total", endpoint="b") >= 1
    assert harness.metrics.value("egress_webhook_endpoint_state", endpoint="b") == 0
    await sink.close()


async def test_a_slow_endpoints_backlog_beyond_its_memory_bound_is_read_back_from_the_outbox(
        serve_app: ServerFactory, secret_file: Path) -> None:
    endpoints = Endpoints()
    base = await serve_app(endpoints.app())
    harness = Harness(base, secret_file, ["a", "b"])
    endpoints.down.add("b")
    sink = harness.sink(max_buffered_per_endpoint=4, spill=True)
    messages = harness.messages(plan_of(["a", "b"], 200))
    sink.distribute(messages)
    await eventually(lambda: len(endpoints.got["a"]) == 100)
    b = next(e for e in sink._endpoints.values() if e.name == "b")
    assert len(b.pending) <= 4
    assert len(b.spilled) == 96
    endpoints.down.clear()
    await eventually(lambda: len(endpoints.got["b"]) == 100)
    assert [p for _, p in endpoints.got["b"]] == [m.row["payload"] for m in messages if m.row["customer"] == "b"]
    await eventually(lambda: harness.last.max_persisted_seq_no == 200)
    await sink.close()


async def test_an_endpoint_added_to_the_table_live_gets_the_messages_that_waited_for_it(
        serve_app: ServerFactory, secret_file: Path) -> None:
    endpoints = Endpoints()
    base = await serve_app(endpoints.app())
    harness = Harness(base, secret_file, ["a"])
    sink = harness.sink()
    sink.distribute(harness.messages(plan_of(["a", "new"], 10)))
    await eventually(lambda: len(endpoints.got["a"]) == 5)
    assert "not in the DynamicSpec's endpoint table" in str(
        harness.status.error("/sinks/hooks/webhook/new/configuration"))
    harness.dynamic["endpoints"]["new"] = {"url": f"{base}/hooks/new", "secret_file": str(secret_file)}
    sink.reconfigure(WebhookSinkDynamicParameters.model_validate(harness.dynamic))
    await eventually(lambda: len(endpoints.got["new"]) == 5)
    assert harness.status.error("/sinks/hooks/webhook/new/configuration") is None
    await asyncio.sleep(0)
    await sink.close()


async def test_an_endpoint_without_a_secret_gets_each_messages_key_as_webhook_id_unsigned(
        serve_app: ServerFactory, secret_file: Path) -> None:
    got: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        got.append(dict(request.headers))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/plain", handle)
    base = await serve_app(app)
    harness = Harness(base, secret_file, [])
    harness.dynamic["endpoints"] = {"u": {"url": f"{base}/plain"}}
    sink = harness.sink()
    sink.distribute(harness.messages(plan_of(["u"], 5)))
    await eventually(lambda: harness.last.max_persisted_seq_no == 5)
    assert sorted(headers["webhook-id"] for headers in got) == sorted(
        idempotency_key(f"m{seq}".encode()) for seq in range(1, 6))  # the key a signed endpoint gets
    assert all(headers["webhook-timestamp"].isdecimal() for headers in got)
    assert not any("webhook-signature" in headers for headers in got)
    await sink.close()
