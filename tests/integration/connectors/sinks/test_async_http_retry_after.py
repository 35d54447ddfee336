"""Retry-After against a real aiohttp server answering 503 (real sockets, real libcurl, real time).

Times are compared on one monotonic clock (server and sink run in this process); only lower bounds are
asserted, so the tests do not depend on the machine's speed.
"""

from __future__ import annotations

import datetime
import time
from collections import defaultdict
from collections.abc import Callable
from email.utils import format_datetime

import pytest
from aiohttp import web

from tests.conftest import ServerFactory
from tests.integration.connectors.sinks.test_async_http import make_sink, messages
from tests.waiting import eventually

pytestmark = pytest.mark.integration

RETRY_AFTER_UP_TO_5S = {"retry_after_maximum_delay": "5s"}  # the fast backoff's 20 ms would be the cap


class Unavailable:
    """Answers the first request of each idempotency key 503 with ``Retry-After: retry_after()``, then 200;
    notes when each request arrived."""

    def __init__(self, retry_after: Callable[[], str]) -> None:
        self.retry_after = retry_after
        self.arrivals: dict[str, list[float]] = defaultdict(list)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        arrivals = self.arrivals[request.headers["Idempotency-Key"]]
        arrivals.append(time.monotonic())
        if len(arrivals) == 1:
            return web.Response(status=503, text="busy", headers={"Retry-After": self.retry_after()})
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


def http_date_in_two_seconds() -> str:
    """An IMF-fixdate about 2 s ahead; whole seconds, so the wait is between 1 and 2 s."""
    return format_datetime(datetime.datetime.fromtimestamp(time.time() + 2, datetime.UTC), usegmt=True)


@pytest.mark.parametrize("retry_after", [lambda: "1", http_date_in_two_seconds], ids=["delay-seconds", "http-date"])
async def test_a_503_with_retry_after_pauses_the_delivery_and_its_endpoint(
        serve_app: ServerFactory, retry_after: Callable[[], str]) -> None:
    endpoint = Unavailable(retry_after)
    base = await serve_app(endpoint.app())
    sink, metrics, _, _ = make_sink(f"{base}/events", dynamic=RETRY_AFTER_UP_TO_5S)
    sink.distribute(messages(["first"]))
    await eventually(lambda: metrics.value("egress_sink_retry_after_total", sink_id="http") == 1)
    sink.distribute(messages(["second"], first_seq=2))  # a first attempt during the pause: held
    await eventually(lambda: sink.progress().max_persisted_seq_no == 2)
    await sink.close()
    first, second = (endpoint.arrivals[f"message-{n}".encode().hex().upper()] for n in (1, 2))
    assert len(first) == 2
    assert first[1] - first[0] >= 1.0  # the backoff alone would have been 10 ms
    assert second[0] - first[0] >= 1.0


async def test_a_garbage_retry_after_is_counted_and_the_backoff_applies(serve_app: ServerFactory) -> None:
    endpoint = Unavailable(lambda: "in a while")
    base = await serve_app(endpoint.app())
    sink, metrics, _, _ = make_sink(f"{base}/events", dynamic=RETRY_AFTER_UP_TO_5S)
    sink.distribute(messages(["only"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()
    assert metrics.value("egress_sink_retry_after_invalid_total", sink_id="http") == 1
    assert metrics.value("egress_sink_retry_after_total", sink_id="http") == 0
