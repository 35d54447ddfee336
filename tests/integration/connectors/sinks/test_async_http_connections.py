"""The async HTTP sink's connections against real servers: reuse, pool bounds, TLS, restarts, the wire."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from tests.conftest import ServerFactory
from tests.integration.connectors.sinks.test_async_http import Recorder, make_sink, messages
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class PortCounter:
    """An endpoint that records the client port of every request."""

    def __init__(self) -> None:
        self.ports: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)
        await asyncio.sleep(0.005)
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.handle)
        return app


@pytest.mark.parametrize(("static", "expected_ports"), [
    ({"keep_alive": True, "max_idle_connections": 8}, lambda n: n <= 8),
    ({"keep_alive": True, "max_idle_connections": 1}, lambda n: n == 1),
    ({"keep_alive": False}, lambda n: n == 60),
    ({"keep_alive": True, "max_idle_connections": 0}, lambda n: n == 60),
])
async def test_connections_are_reused_and_bounded_by_the_pool(serve_app: ServerFactory, static: dict[str, object],
                                                              expected_ports: object) -> None:
    counter = PortCounter()
    base = await serve_app(counter.app())
    sink, _, _, _ = make_sink(f"{base}/events", static=static)
    sink.distribute(messages([f"m{i}" for i in range(60)]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 60, timeout=30)
    await sink.close()
    assert len(counter.ports) == 60
    assert expected_ports(len(set(counter.ports))), sorted(set(counter.ports))  # type: ignore[operator]


async def test_the_request_line_has_no_question_mark_for_an_empty_query() -> None:
    request_lines: list[bytes] = []

    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_lines.append(head.split(b"\r\n", 1)[0])
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(raw, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sink, _, _, _ = make_sink(f"http://127.0.0.1:{port}/ingest?")
        sink.distribute(messages(["a"]))
        await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
        await sink.close()
    finally:
        server.close()
        await server.wait_closed()
    assert request_lines == [b"POST /ingest HTTP/1.1"]


@pytest.fixture
def certificate_authority(tmp_path: Path) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    return authority, bundle


@pytest.fixture
async def https_server(certificate_authority: tuple[trustme.CA, Path]) -> AsyncIterator[tuple[str, Recorder]]:
    authority, _ = certificate_authority
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    recorder = Recorder()
    runner = web.AppRunner(recorder.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    yield f"https://127.0.0.1:{port}", recorder
    await runner.cleanup()


async def test_follows_an_http_to_https_redirect_with_the_tls_client(
        serve_app: ServerFactory, https_server: tuple[str, Recorder], certificate_authority: tuple[trustme.CA, Path]
) -> None:
    https_base, tls_recorder = https_server

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=308, headers={"Location": f"{https_base}/events"})

    app = web.Application()
    app.router.add_post("/events", redirect)
    base = await serve_app(app)
    sink, metrics, _, _ = make_sink(f"{base}/events", static={"max_redirect_count": 1,
                                                              "tls_ca_file": str(certificate_authority[1])})
    sink.distribute(messages(["over tls"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()
    assert [body for body, _ in tls_recorder.requests] == [b"over tls"]
    assert metrics.value("egress_sink_responses_total", sink_id="http", status_code="308") == 1


async def test_tls_verification_is_on_by_default(https_server: tuple[str, Recorder]) -> None:
    https_base, recorder = https_server
    sink, _, _, _ = make_sink(f"{https_base}/events", dynamic={"max_attempt_count": 1})
    sink.distribute(messages(["a"]))
    await eventually(lambda: sink.terminal_error is not None)
    await sink.close()
    assert "curl error 60" in (sink.terminal_error or "")  # an unknown CA is refused
    assert recorder.requests == []


async def test_a_restarted_receiver_is_reached_again_on_a_fresh_connection(unused_tcp_port: int) -> None:
    """A reset or EOF on a reused keep-alive connection loses nothing, and delivery resumes within one backoff."""
    recorder = Recorder()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(recorder.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
        return runner

    runner = await start()
    sink, _, _, _ = make_sink(f"http://127.0.0.1:{unused_tcp_port}/events",
                              dynamic={"max_attempt_count": 50, "retry_initial_delay": "200ms",
                                       "retry_maximum_delay": "200ms", "retry_minimum_delay": "100ms"})
    sink.distribute(messages([f"before-{i}" for i in range(20)]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 20)
    await runner.cleanup()  # the server goes away: its idle keep-alive connections are closed
    sink.distribute(messages([f"during-{i}" for i in range(5)], first_seq=21))
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    runner = await start()
    returned = loop.time()
    sink.distribute(messages([f"after-{i}" for i in range(5)], first_seq=26))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 30)
    resumed = loop.time() - returned
    await sink.close()
    await runner.cleanup()
    delivered = {body for body, _ in recorder.requests}
    assert delivered == {f"{stage}-{i}".encode() for stage, n in (("before", 20), ("during", 5), ("after", 5))
                         for i in range(n)}
    # One backoff is 0.1-0.24 s; an attempt stuck on a dead keep-alive connection would wait its
    # attempt timeout (10 s). Half of that tells the two apart on a loaded machine as on a quiet one.
    assert resumed < 5.0, f"took {resumed:.2f} s after the receiver returned (one backoff is 0.1-0.24 s)"
