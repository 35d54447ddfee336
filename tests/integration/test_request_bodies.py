"""Every aiohttp server of egress that reads a request body reads it whole however it arrives, up
to its limit (413) and within its deadline (408, the connection closed), through
``egress.http_body``: ``egress receiver``, the throttler service and the Firehose receiver, from
raw sockets on loopback. (The http source's bodies: ``test_http_source.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web

from egress.clock import RealClock
from egress.firehose import FirehoseReceiver, ReceiverOptions
from egress.firehose import protocol as p
from egress.receiver import Receiver, ReceiverConfig
from egress.spec import DynamicSpec
from egress.throttler.controller import ThrottlerController
from egress.throttler.models import validate_dynamic_throttlers
from egress.throttler.service import REQUEST_QUOTA_PATH, make_app
from egress.throttler.wire import encode_call
from tests import raw_http
from tests.conftest import ServerFactory

pytestmark = pytest.mark.integration

BODY_TIMEOUT = 0.5
MAX_BODY_BYTES = 10_000  # the receivers' limit here (the throttler's is its own 1 MiB)


@dataclass
class Served:
    """One server on loopback: where to POST a valid ``body`` with ``headers``, and ``taken()``,
    how many bodies it has taken whole so far (``None``: the answer is the only effect, a grant)."""

    port: int
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    taken: Callable[[], int] | None


@pytest.fixture
async def serve_lingering() -> AsyncIterator[ServerFactory]:
    """Serve aiohttp applications on loopback with an hour of lingering close: after an answer,
    aiohttp reads and drops the rest of an unfinished body for that long before it closes the
    connection, so a connection closes within a test only if the server ended the body itself (or
    the body ended). Yields a function returning the base URL."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None, lingering_time=3600.0)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture(params=["receiver", "throttler", "firehose"])
async def served(request: pytest.FixtureRequest, serve_lingering: ServerFactory) -> AsyncIterator[Served]:
    name = request.param
    serve_app = serve_lingering
    if name == "receiver":
        receiver = Receiver(ReceiverConfig(max_body_bytes=MAX_BODY_BYTES, body_timeout=BODY_TIMEOUT))
        yield Served(await port_of(serve_app, receiver.app), "/events", [], b"x" * 1_000,
                     lambda: receiver.stats.requests)
    elif name == "throttler":
        throttlers = validate_dynamic_throttlers(DynamicSpec.model_validate({"throttlers": {"q": {}}}))
        controller = ThrottlerController(throttlers, RealClock())  # unlimited: any amount granted at once
        body = encode_call("q", 1, timestamp=0.0, quota_class_id=None, client_id="c", hold=0.0)
        yield Served(await port_of(serve_app, make_app(controller, body_timeout=BODY_TIMEOUT)), REQUEST_QUOTA_PATH,
                     [], body, None)
        await controller.aclose()
    else:
        records: list[bytes] = []

        async def store(request_id: str, batch: list[bytes], attributes: dict[str, str]) -> None:
            records.extend(batch)

        firehose = FirehoseReceiver(store, ReceiverOptions(max_body_bytes=MAX_BODY_BYTES, body_timeout=BODY_TIMEOUT))
        body = p.encode_request_body("r-1", 0, [b"first", b"second"])
        headers = [(p.HEADER_REQUEST_ID, "r-1"), ("Content-Type", p.CONTENT_TYPE_JSON)]
        yield Served(await port_of(serve_app, firehose.app), "/", headers, body, lambda: len(records) // 2)


async def port_of(serve_app: ServerFactory, app: web.Application) -> int:
    return int((await serve_app(app)).rsplit(":", 1)[1])


def pieces(served: Served, framing: str) -> list[bytes]:
    """``served``'s valid request in two writes: the head and the body's first half, then the rest."""
    body = served.body
    half = len(body) // 2
    if framing == "chunked":
        return [raw_http.chunked_head(served.path, served.headers) + raw_http.chunk(body[:half]),
                raw_http.chunk(body[half:]) + raw_http.chunk(b"")]
    request = raw_http.with_length(served.path, body, served.headers)
    split = len(request) - (len(body) - half)
    return [request[:split], request[split:]]


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_body_in_two_writes_is_read_whole(served: Served, framing: str) -> None:
    answer = await asyncio.to_thread(raw_http.send_in_pieces, served.port, pieces(served, framing), 0.2)
    assert answer.status == 200, answer
    assert served.taken is None or served.taken() == 1


async def test_a_client_stalling_mid_body_gets_408_after_the_body_timeout_and_the_connection_closes(
        served: Served) -> None:
    started = time.monotonic()
    with raw_http.connect(served.port) as connection:
        connection.sendall(pieces(served, "length")[0])  # then nothing more
        answer = await asyncio.to_thread(raw_http.read_answer, connection)
        await asyncio.to_thread(raw_http.wait_closed, connection)  # not an hour later: the body is not coming
    assert time.monotonic() - started >= BODY_TIMEOUT
    assert answer.status == 408, answer
    assert b"did not arrive whole within" in answer.body
    assert answer.headers["connection"] == "close"
    assert served.taken is None or served.taken() == 0


async def test_a_chunked_body_growing_over_the_limit_is_413(served: Served) -> None:
    blocks = [*(raw_http.chunk(b"x" * 65_536) for _ in range(64)), raw_http.chunk(b"")]  # 4 MiB, over every limit
    head = raw_http.chunked_head(served.path, served.headers)
    answer = await asyncio.to_thread(raw_http.refused_while_sending, served.port, head, blocks)
    assert answer.status == 413, answer
    assert answer.headers["connection"] == "close"
    assert served.taken is None or served.taken() == 0
