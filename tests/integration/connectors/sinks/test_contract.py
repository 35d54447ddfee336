"""The Sink protocol's contract, the same for every sink class (egress.connectors.base.Sink), against
a real aiohttp endpoint on loopback: queries change nothing, the sink reports each prefix it advances
to (``SinkContext.on_progress``, the one direction of acknowledgements), ``progress()`` is the last
report, and ``unacknowledged`` counts the distributed messages not in it; a held sink starts no
delivery until resumed."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from egress.clock import RealClock
from egress.connectors.base import Sink, SinkContext
from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.connectors.sinks.firehose_http import FirehoseHttpSink
from egress.connectors.sinks.firehose_parameters import FirehoseHttpSinkDynamicParameters, FirehoseHttpSinkParameters
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.observe import Metrics, StatusTree
from tests.conftest import ServerFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAST = {"retry_initial_delay": "10ms", "retry_maximum_delay": "20ms"}


@dataclass
class HoldingEndpoint:
    """Accepts both sinks' requests; the one carrying the payload ``first`` waits for ``release``."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        request_id = request.headers.get("X-Amz-Firehose-Request-Id")
        payloads = [body] if request_id is None else [
            base64.b64decode(r["data"]) for r in json.loads(body)["records"]]
        if b"first" in payloads:
            await self.release.wait()
        if request_id is None:
            return web.Response(text="done")
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/ingest", self.handle)
        return app


SinkFactory = Callable[[str, Metrics, list[SinkProgress]], tuple[Sink, Callable[[], float]]]


def async_http(url: str, metrics: Metrics, reports: list[SinkProgress]) -> tuple[Sink, Callable[[], float]]:
    context = SinkContext("deliver", "http", 0, RealClock(), metrics, StatusTree(), reports.append)
    sink = AsyncHttpSink(context,
                         AsyncHttpSinkParameters.model_validate({"url": url, "payload_column": "payload"}),
                         AsyncHttpSinkDynamicParameters.model_validate({**FAST, "retry_minimum_delay": "10ms"}),
                         SinkProgress())
    return sink, lambda: metrics.value("egress_sink_records_delivered_total", sink_id="http")


def firehose_http(url: str, metrics: Metrics, reports: list[SinkProgress]) -> tuple[Sink, Callable[[], float]]:
    context = SinkContext("deliver", "firehose", 0, RealClock(), metrics, StatusTree(), reports.append)
    parameters = FirehoseHttpSinkParameters.model_validate({
        "url": url, "payload_column": "payload", "stream_name": "flights",
        "buffering_hints": {"size_in_mbs": 5, "interval_in_seconds": 0}})  # one batch per distribute
    sink = FirehoseHttpSink(context, parameters, FirehoseHttpSinkDynamicParameters.model_validate(FAST),
                            SinkProgress())
    return sink, lambda: metrics.value("egress_sink_records_delivered_total", sink_id="firehose")


SINK_CLASSES = [pytest.param(async_http, id="async_http"), pytest.param(firehose_http, id="firehose_http")]


def message(seq: int, payload: str) -> OutboxMessage:
    return OutboxMessage(seq, "requests", f"message-{seq}".encode(), b"[]", None, {"payload": payload})


@pytest.mark.parametrize("make", SINK_CLASSES)
async def test_the_sink_reports_the_contiguous_prefix_and_unacknowledged_counts_what_is_not_in_it(
        serve_app: ServerFactory, make: SinkFactory) -> None:
    endpoint = HoldingEndpoint()
    reports: list[SinkProgress] = []
    sink, delivered = make(f"{await serve_app(endpoint.app())}/ingest", Metrics(), reports)
    try:
        sink.flush()  # in the protocol for every sink; nothing buffered: nothing happens
        sink.distribute([message(1, "first")])
        sink.distribute([message(2, "second")])
        sink.committed(sink.progress())  # as a partition job commits after distributing
        await eventually(lambda: delivered() == 1)  # "second" is acknowledged, "first" still waits
        assert reports, "a finished delivery is reported"
        assert reports[-1].max_persisted_seq_no == 0, "the prefix is contiguous"
        assert sink.progress() == reports[-1]
        assert sink.unacknowledged == 2, "an acknowledged message behind an unacknowledged one still counts"
        endpoint.release.set()
        await eventually(lambda: delivered() == 2)
        reported = reports[-1]
        assert (reported.max_persisted_seq_no, reported.max_persisted_message_id) == (2, b"message-2")
        assert sink.progress() == reported, "progress() is the last report"
        assert sink.unacknowledged == 0
        count = len(reports)
        assert sink.progress() == reported, "a query changes nothing"
        assert sink.unacknowledged == 0
        assert len(reports) == count, "a query reports nothing"
    finally:
        endpoint.release.set()  # a failed check must not leave the request held
        await sink.close()


@pytest.mark.parametrize("make", SINK_CLASSES)
async def test_a_held_sink_starts_no_delivery_until_resumed(serve_app: ServerFactory, make: SinkFactory) -> None:
    endpoint = HoldingEndpoint()
    endpoint.release.set()
    sink, delivered = make(f"{await serve_app(endpoint.app())}/ingest", Metrics(), [])
    try:
        sink.hold()
        sink.distribute([message(1, "one")])
        sink.committed(sink.progress())  # a batching sink may now send the batch: held, it does not
        assert sink.in_flight == 0, "a held sink starts no delivery"
        sink.resume()
        assert sink.in_flight == 1, "resume starts what was held back at once"
        await eventually(lambda: delivered() == 1)
        sink.resume()  # not held: nothing changes
        assert sink.progress().max_persisted_seq_no == 1
    finally:
        await sink.close()
