"""A process function's own ``await handle.throttle(...)`` is given up when its job stops (Ctrl-C):
the run ends at once instead of waiting out the quota, the epoch whose function waited is not
committed (its batch is processed again by the next run), and what the endpoint acknowledged is."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.engines import SqliteEngine
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.throttler import ThrottleInterruptedError
from tests.conftest import ServerFactory, payload_spec
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FIRST, MORE = 5, 20
"""Messages the throttler's burst covers (one epoch of them), and messages behind them."""
LIMIT = 0.01
"""Units per second after the burst: the second epoch's first message would wait 100 s."""
DELAY = 0.3
"""Seconds the endpoint holds each request: the first epoch's acknowledgements arrive while the
second epoch's function already waits, so only the commit on the way out can record them."""
STOP_WITHIN = 10.0
"""Seconds from the stop to the run's end the test allows (an epoch and the final commit)."""


class SwallowsTheInterruption(ProcessFunction):
    """As ``tests.pipelines:CallsApiPolitely`` (one unit of throttler ``api`` per message, the
    payload on to ``requests``), but it catches the interruption and emits the message anyway."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        with contextlib.suppress(ThrottleInterruptedError):
            await ctx.get_throttler_or_throw("api").throttle(1)
        output.add_message("requests", {"payload": message.row["payload"]})


class SlowEndpoint:
    def __init__(self) -> None:
        self.payloads: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = (await request.read()).decode()
        await asyncio.sleep(DELAY)  # the endpoint's own latency, not a wait for the test's sake
        self.payloads.append(body)
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


def throttled_spec(tmp_path: Path, url: str, function: str, limit: float) -> tuple[Path, Path]:
    spec, dynamic = payload_spec(tmp_path, url, [f"p{i}" for i in range(FIRST + MORE)],
                                 processing_function=function)
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"api": {"limit": limit, "period": f"{FIRST / limit:g}s"}}  # a burst of FIRST
    dynamic.write_text(yaml.safe_dump(document))
    return spec, dynamic


async def committed(state: Path) -> tuple[int, int]:
    """The committed input position of ``deliver`` partition 0 and its sink's acknowledged seq."""
    engine = SqliteEngine(state, "test_pipeline")
    await engine.open()
    try:
        checkpoint = await engine.load_checkpoint("deliver", 0, ["http"])
        return checkpoint.input_positions.get(("events", 0), 0), checkpoint.sink_progress["http"].max_persisted_seq_no
    finally:
        await engine.close()


@pytest.mark.parametrize("function", ["tests.pipelines:CallsApiPolitely", f"{__name__}:SwallowsTheInterruption"])
async def test_a_stop_gives_up_the_functions_own_throttle_and_commits_the_acknowledged(
        tmp_path: Path, serve_app: ServerFactory, function: str) -> None:
    endpoint = SlowEndpoint()
    url = f"{await serve_app(endpoint.app())}/events"
    spec, dynamic = throttled_spec(tmp_path, url, function, LIMIT)
    state = tmp_path / "state"
    pipeline = Pipeline(load_plan(spec, dynamic), state, options=RunOptions(epoch_max_messages=FIRST))
    run = asyncio.create_task(pipeline.run())
    metrics = pipeline.metrics
    await eventually(lambda: metrics.value("egress_throttler_queue_size") >= 1,
                     what="the second epoch waiting for quota")
    await eventually(lambda: metrics.value("egress_sink_records_delivered_total") >= FIRST,
                     what="the first epoch acknowledged while the second waits")
    assert metrics.value("egress_throttler_queue_size") >= 1, "the second epoch got its quota"
    pipeline.request_stop()
    try:
        result = await asyncio.wait_for(run, STOP_WITHIN)
    except TimeoutError:
        pytest.fail(f"the run did not end within {STOP_WITHIN:g} s of the stop: the throttle wait was not given up")
    assert result.error is None, result.error
    assert sorted(endpoint.payloads) == sorted(f"p{i}" for i in range(FIRST)), "the waiting epoch sent nothing"
    assert await committed(state) == (FIRST, FIRST), "(input position, acknowledged seq) after the stop"

    # With quota to spare the next run processes the rest, and sends nothing acknowledged before.
    spec, dynamic = throttled_spec(tmp_path, url, function, 1000.0)
    result = await Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True)).run()
    assert result.drained, result
    delivered = Counter(endpoint.payloads)
    assert set(delivered) == {f"p{i}" for i in range(FIRST + MORE)}
    assert max(delivered.values()) == 1, "a message acknowledged in the first run was sent again"
