"""OpenTelemetry tracing of a run against a real OTLP/HTTP receiver in the test process
(``tests/otlp_receiver.py``): the span tree of an epoch, the ``Input.Throttle`` span's length on the
virtual clock, and the trace context an endpoint receives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

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
