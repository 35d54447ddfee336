"""Throttlers inside ``egress run``: automatic input throttling, manual ``ctx.get_throttler_or_throw``,
and the async HTTP sink's ``throttler_id``, against a real endpoint on loopback (real clock: a
throttle guarantees a lower bound on elapsed time, which is what these tests check)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from egress.errors import ProcessFunctionError, SpecErrors
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.throttler import THROTTLER_STATE_NAME
from egress.throttler.envelope import worst_excess
from tests.conftest import ServerFactory, payload_spec

pytestmark = pytest.mark.integration
LIMIT = 100  # units per second


class TimedEndpoint:
    """Records the loop time of every request."""

    def __init__(self) -> None:
        self.times: list[float] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.times.append(asyncio.get_running_loop().time())
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


def with_dynamic(dynamic: Path, **computation: Any) -> None:
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"api": {"limit": LIMIT, "period": "1s"}}
    document["computations"]["deliver"].update(computation)
    dynamic.write_text(yaml.safe_dump(document))


def with_function(spec: Path, reference: str) -> None:
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["processing_function"] = reference
    spec.write_text(yaml.safe_dump(document))


TRANSIT = 0.05
"""Seconds a request may take from its unit's release to the endpoint on a quiet loop."""


class LoopLag:
    """The longest stall of this process's event loop while it runs (the pipeline and the endpoint
    share the loop): requests released before a stall reach the endpoint after it, together with
    those released after it, so the receiver sees up to ``LIMIT · stall`` more in a window than the
    throttler released in it. The exact envelope at release is proven on the virtual clock
    (``tests/unit/throttler/test_envelope.py``); here the measured stall widens the allowance."""

    TICK = 0.01

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.TICK)
            self.worst = max(self.worst, loop.time() - before - self.TICK)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def assert_envelope(times: list[float], stall: float = 0.0) -> None:
    """At most LIMIT·T + LIMIT·period requests in every window of T seconds, give or take what was
    released up to TRANSIT (plus the loop's worst ``stall``) before the window: the requests' own travel."""
    assert worst_excess([(t, 1.0) for t in times], LIMIT, LIMIT * 1.0) <= LIMIT * (TRANSIT + stall)


async def run(spec: Path, dynamic: Path, state: Path) -> tuple[Any, Pipeline]:
    pipeline = Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True))
    return await pipeline.run(), pipeline


async def test_input_batches_wait_for_the_rows_throttler(tmp_path: Path, serve_app: ServerFactory) -> None:
    endpoint = TimedEndpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(300)])
    with_dynamic(dynamic, input_rows_throttler_id="api")
    loop = asyncio.get_running_loop()
    started = loop.time()
    result, pipeline = await run(spec, dynamic, tmp_path / "state")
    assert result.drained
    assert loop.time() - started >= (300 - 2 * LIMIT) / LIMIT  # burst of one period, then the rate
    assert (tmp_path / "state" / THROTTLER_STATE_NAME).exists()  # a restarted run starts from its horizon
    assert pipeline.metrics.value("egress_computation_input_throttle_seconds_total", computation_id="deliver") > 0.5


async def test_a_process_function_throttles_itself_through_the_context(tmp_path: Path,
                                                                       serve_app: ServerFactory) -> None:
    endpoint = TimedEndpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(300)])
    with_dynamic(dynamic)
    with_function(spec, "tests.pipelines:CallsApiPolitely")
    loop = asyncio.get_running_loop()
    started = loop.time()
    result, _ = await run(spec, dynamic, tmp_path / "state")
    assert result.drained
    assert len(endpoint.times) == 300
    assert loop.time() - started >= (300 - 2 * LIMIT) / LIMIT


async def test_an_unknown_throttler_is_a_clear_error(tmp_path: Path, serve_app: ServerFactory) -> None:
    base = await serve_app(TimedEndpoint().app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", ["a"])
    with_dynamic(dynamic)
    with_function(spec, "tests.pipelines:AsksForAnUnknownThrottler")
    result, _ = await run(spec, dynamic, tmp_path / "state")
    assert isinstance(result.error, ProcessFunctionError)
    assert 'Throttler "nope" is not configured for this client' in str(result.error)


async def test_the_sink_shares_one_global_rate_with_retries_included(tmp_path: Path,
                                                                     serve_app: ServerFactory) -> None:
    endpoint = TimedEndpoint()
    base = await serve_app(endpoint.app())
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(400)], partition_count=3,
                                 sink_parameters={"throttler_id": "api"})
    with_dynamic(dynamic)
    with LoopLag() as lag:
        result, _ = await run(spec, dynamic, tmp_path / "state")
    assert result.drained
    assert len(endpoint.times) == 400
    assert_envelope(endpoint.times, lag.worst)
    assert max(endpoint.times) - min(endpoint.times) >= (400 - 2 * LIMIT) / LIMIT


async def test_a_sink_naming_an_undeclared_throttler_is_a_spec_error(tmp_path: Path) -> None:
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"], sink_parameters={"throttler_id": "x"})
    with pytest.raises(SpecErrors, match='parameters/throttler_id: Throttler "x" is not configured'):
        load_plan(spec, dynamic)
