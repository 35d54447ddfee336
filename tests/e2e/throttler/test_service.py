"""``egress throttler serve`` as a real process shared by three clients; kill it and restart it.

The three "jobs" are three factories in this process, each with its own HTTP connection pool,
calling a real endpoint after every ``throttle(1)`` (``tests/e2e/throttler/test_shared_runs.py``
does the same with ``egress run`` processes). Timing is real: the envelope is checked with the
exact request times the endpoint saw.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from egress.clock import RealClock
from egress.throttler.envelope import worst_excess
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.http_transport import HttpTransport
from egress.throttler.service import load_throttlers
from tests.e2e.throttler_support import launch

pytestmark = pytest.mark.e2e

LIMIT, PERIOD, REQUEST_PERIOD = 50.0, 1.0, 0.5
OUTAGE = 8 * REQUEST_PERIOD  # seconds the service is away


async def test_three_clients_share_one_limit_and_survive_a_service_restart(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic.yaml"
    dynamic.write_text(yaml.safe_dump({"throttlers": {"api": {
        "limit": LIMIT, "period": f"{int(PERIOD * 1000)}ms", "request_period": f"{int(REQUEST_PERIOD * 1000)}ms",
        "retrying_channel": {"retry_backoff_time": "50ms", "max_backoff_time": "200ms"}}}}))
    seen: list[float] = []

    async def endpoint(_: web.Request) -> web.Response:
        seen.append(time.monotonic())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/call", endpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint_port = runner.addresses[0][1]
    process, port = launch(dynamic)
    transports = [HttpTransport(f"http://127.0.0.1:{port}") for _ in range(3)]
    factories = [ThrottlerFactory(t, RealClock(), load_throttlers(dynamic), client_id=f"job{i}")
                 for i, t in enumerate(transports)]
    stop = asyncio.Event()
    errors: list[BaseException] = []

    async def job(factory: ThrottlerFactory) -> None:
        handle = factory.get_throttler_or_throw("api")
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                try:
                    await handle.throttle(1)
                except Exception as error:  # pragma: no cover - reported below
                    errors.append(error)
                    return
                async with session.post(f"http://127.0.0.1:{endpoint_port}/call", data=b"x") as response:
                    assert response.status == 200

    jobs = [asyncio.create_task(job(f)) for f in factories]
    try:
        await asyncio.sleep(3.0)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = time.monotonic()
        # The service is away: jobs spend what they prefetched (one request period), then wait;
        # OUTAGE is 8 request periods, so the window checked for silence below spans 6 of them.
        await asyncio.sleep(OUTAGE)
        process, _ = launch(dynamic, port)
        restarted_at = time.monotonic()
        await asyncio.sleep(3.0)
    finally:
        stop.set()
        await asyncio.gather(*jobs, return_exceptions=True)
        for factory in factories:
            await factory.aclose()
        for transport in transports:
            await transport.aclose()
        process.send_signal(signal.SIGTERM)
        process.wait(10)
        await runner.cleanup()
    assert errors == []
    # The envelope over every window, the restart included (the restarted service resumes from its
    # restart horizon); one unit for the calls' own travel to the endpoint.
    assert worst_excess([(t, 1.0) for t in seen], LIMIT, LIMIT * PERIOD) <= 1.0
    during = [t for t in seen if killed_at + REQUEST_PERIOD * 2 < t < restarted_at]
    assert during == []  # nothing beyond the prefetch while the service was dead
    after = [t for t in seen if t > restarted_at]
    assert after, "no request after the restart"
    # granting resumes within one request_period (plus the 200 ms backoff ceiling and process start)
    assert after[0] - restarted_at <= REQUEST_PERIOD + 0.2 + 0.5
    assert len(seen) >= LIMIT * 5  # the limit was used: ~3 s before, ~3 s after, plus bursts
