"""Adaptive epochs end to end: a lone event POSTed to the http source reaches the endpoint long
before the epoch period, which only bounds how long acknowledgements wait to be committed.

A real pipeline (SQLite, the http source, the async HTTP sink) with an ``epoch_period`` of 600 s,
and an endpoint in this process that notes, as each event arrives, how many epochs the pipeline
had committed: the event's own epoch was committed, and the acknowledgement of an earlier event
was not (it waits for the epoch period, or for the next epoch that input starts, which carries it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, pass_through_spec
from tests.ports import free_port
from tests.waiting import eventually

pytestmark = pytest.mark.integration

EPOCH_PERIOD = 600.0  # seconds: far beyond any wait of this test (eventually's guard is 60 s)


class Endpoint:
    """Answers 200 to every POST, noting ``(payload, epochs committed then)`` in arrival order."""

    def __init__(self, pipeline: list[Pipeline]) -> None:
        self._pipeline = pipeline
        self.arrived: list[tuple[str, float]] = []
        self.app = web.Application()
        self.app.router.add_post("/events", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        payload = (await request.read()).decode()
        self.arrived.append((payload, self._pipeline[0].metrics.total("egress_epochs_committed_total")))
        return web.Response()


async def test_a_lone_event_is_delivered_long_before_the_epoch_period(tmp_path: Path, serve_app: ServerFactory) -> None:
    holder: list[Pipeline] = []
    endpoint = Endpoint(holder)
    port = free_port()
    spec = pass_through_spec(tmp_path / "spec.yaml", "adaptive", {"source_class_name": "http",
                                                                  "parameters": {"port": port}},
                             f"{await serve_app(endpoint.app)}/events")
    pipeline = Pipeline(load_plan(spec), tmp_path / "state", options=RunOptions(epoch_period=EPOCH_PERIOD))
    holder.append(pipeline)
    run = asyncio.create_task(pipeline.run())
    url = f"http://127.0.0.1:{port}/events"
    async with aiohttp.ClientSession() as session:

        async def listening() -> bool:
            async with session.get(url) as response:  # 405: listening (only POST is routed)
                return response.status == 405

        await eventually(listening, what="the http source listening", interval=0.02,
                         ignoring=(aiohttp.ClientConnectionError,))
        for number in (1, 2):  # one key, so one partition's job
            async with session.post(url, data=f'{{"id": 7, "payload": "event {number}"}}\n') as response:
                assert response.status == 200  # committed to the log by the source reader
            await eventually(lambda n=number: len(endpoint.arrived) == n, what=f"event {number} delivered")
    # Event 1 arrived after its own epoch (1 committed); event 2 after the one that input started,
    # which also carried event 1's acknowledgement (2): no epoch in between, though 1 was answered.
    assert endpoint.arrived == [("event 1", 1.0), ("event 2", 2.0)]
    assert pipeline.metrics.total("egress_epochs_committed_total") == 2
    pipeline.request_stop()
    result = await run
    assert result.ok, result.error
    # The stop committed the acknowledgement of event 2, which was waiting for the epoch period.
    assert pipeline.metrics.total("egress_epochs_committed_total") == 3
