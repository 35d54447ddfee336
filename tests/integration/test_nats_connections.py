"""egress.nats_connections: a first connection that cannot be made fails within ``connect_timeout``
quietly, and a stop does not wait for it; a closed nats-py connection stops reconnecting to a lost
server, so the event loop of the engine, the ``nats`` source or the throttler's transport can end."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from nats.aio.client import Client

from egress.engines.nats import NatsEngine
from egress.nats_connections import NatsUnreachableError, close_connection, connect
from egress.runtime import Pipeline, load_plan
from tests.conftest import payload_spec
from tests.nats_server import NatsServer

pytestmark = pytest.mark.integration


def reconnecting() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if "_attempt_reconnect" in repr(task.get_coro())]


async def test_closing_a_connection_to_a_lost_server_ends_its_reconnecting() -> None:
    server = NatsServer().start()
    try:
        for _ in range(10):  # a cancel swallowed by wait_for is a race: give it a few chances to show
            disconnected = asyncio.Event()

            async def on_disconnected() -> None:
                disconnected.set()  # noqa: B023 (this round's event)

            client = Client()
            await client.connect(servers=[server.url], max_reconnect_attempts=-1, reconnect_time_wait=0,
                                 connect_timeout=1, disconnected_cb=on_disconnected)
            server.kill()
            await asyncio.wait_for(disconnected.wait(), 10)
            assert reconnecting(), "nats-py reconnects after the server is lost"
            await close_connection(client, server.url)
            assert client.is_closed
            assert reconnecting() == []
            server.restart()
    finally:
        server.shut_down()


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{probe.getsockname()[1]}"  # refused once the probe is closed


async def test_a_first_connection_that_cannot_be_made_fails_within_connect_timeout_quietly_and_leaves_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = Client()
    with pytest.raises(NatsUnreachableError, match=r"^ConnectionRefusedError: \[Errno 111\]"):
        async with asyncio.timeout(30):  # a failure guard: connect_timeout is 1 s
            await connect(client, [closed_port_url()], 1.0, label="test")
    assert client.is_closed
    assert reconnecting() == []
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG] == []  # no traceback per attempt


async def test_a_pipeline_whose_nats_engine_does_not_answer_stops_at_once_when_asked(tmp_path: Path) -> None:
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, and never a byte: no INFO, so nats-py waits
        accepted.set()

    blackhole = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"nats://127.0.0.1:{blackhole.sockets[0].getsockname()[1]}"
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", worker_id="w1",
                        engine_factory=lambda state, name, options: NatsEngine(url, name, owner="w1",
                                                                               connect_timeout=3600))
    try:
        running = asyncio.create_task(pipeline.run())
        async with asyncio.timeout(30):  # a failure guard: the engine would wait for an hour
            await accepted.wait()
            pipeline.request_stop()
            result = await running
    finally:
        for writer in held:
            writer.close()
        blackhole.close()
        await blackhole.wait_closed()
    assert result.error is None
    assert not result.drained
