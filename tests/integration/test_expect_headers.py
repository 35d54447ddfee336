"""A request whose ``Expect`` header is not UTF-8 gets an answer below 500 from the status server
(its dashboard routes and a path it does not serve included) and from the ``http`` source: both
route every path with ``egress.http_expect.expect_handler`` (aiohttp's own answers 500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from egress.clock import RealClock
from egress.connectors.sources.http import HttpSource, HttpSourceParameters
from egress.observe import Metrics
from egress.observe.dashboard import Dashboard
from egress.observe.server import StatusServer
from tests.integration.connectors.sources.test_http import STREAM
from tests.integration.test_receivers_fuzz import exchange, request, status_of
from tests.ports import free_port

pytestmark = pytest.mark.integration

NOT_UTF8 = "\xff"  # sent as the byte 0xff (request() encodes the head as latin-1)


async def answer_to(port: int, method: str, path: str, expect: str | None = NOT_UTF8) -> int | None:
    """The status answered to ``method path`` with ``Expect: expect`` (``None``: without), over a raw
    socket, off the event loop."""
    headers = [("Content-Length", "0")] + ([] if expect is None else [("Expect", expect)])
    data = request(method, path, headers, b"")
    return status_of(await asyncio.to_thread(exchange, port, data))


@pytest.fixture
async def status_port() -> AsyncIterator[int]:
    metrics = Metrics()

    async def status() -> dict[str, Any]:
        return {"running": True, "partitions": [], "sources": {}, "status": {}}

    dashboard = Dashboard(metrics.registry, RealClock(), title="test", status=status)
    server = StatusServer(metrics, status, dashboard=dashboard)
    await server.start()
    assert server.port is not None
    yield server.port
    await server.stop()


@pytest.mark.parametrize(("method", "path"), [("GET", "/metrics"), ("GET", "/status"), ("GET", "/healthz"),
                                          ("GET", "/readyz"), ("GET", "/"), ("GET", "/dashboard.json"),
                                          ("POST", "/status"), ("GET", "/nowhere")])
async def test_the_status_server_answers_a_non_utf8_expect_without_a_5xx(
        status_port: int, method: str, path: str) -> None:
    status = await answer_to(status_port, method, path)
    assert status is not None
    assert status < 500, status


async def test_the_status_server_still_answers_200_404_and_405(status_port: int) -> None:
    assert await answer_to(status_port, "GET", "/status", None) == 200
    assert await answer_to(status_port, "GET", "/nowhere", None) == 404
    assert await answer_to(status_port, "POST", "/metrics", None) == 405


@pytest.fixture
async def http_source_port(tmp_path: Path) -> AsyncIterator[int]:
    port = free_port()
    source = HttpSource("in", HttpSourceParameters(port=port), STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=False)
    yield port
    await source.close()


@pytest.mark.parametrize(("method", "path"), [("POST", "/events"), ("GET", "/events"), ("POST", "/elsewhere")])
async def test_the_http_source_answers_a_non_utf8_expect_without_a_5xx(
        http_source_port: int, method: str, path: str) -> None:
    status = await answer_to(http_source_port, method, path)
    assert status is not None
    assert status < 500, status


async def test_the_http_source_still_answers_405_to_a_get_and_404_elsewhere(http_source_port: int) -> None:
    assert await answer_to(http_source_port, "GET", "/events", None) == 405
    assert await answer_to(http_source_port, "POST", "/elsewhere", None) == 404
