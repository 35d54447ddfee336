"""egress.nats_connections: a closed nats-py connection stops reconnecting to a lost server, so the
event loop of the engine, the ``nats`` source or the throttler's transport can end."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from egress.nats_connections import close_connection
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
