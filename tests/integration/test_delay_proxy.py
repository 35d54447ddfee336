"""tests/delay_proxy.py: every byte arrives ``delay`` later in each direction, in the order sent,
and chunks in flight do not wait for each other (latency, not a bandwidth limit)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.delay_proxy import DelayProxy

pytestmark = pytest.mark.integration

DELAY = 0.2  # seconds one way: far above any scheduling noise, so the lower bounds below are exact


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback TCP echo server (one thread per connection)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    def accept() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    stopped.set()
    listener.close()


def receive(connection: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = connection.recv(size - len(got))
        assert chunk, "the proxy closed the connection"
        got += chunk
    return got


def test_a_round_trip_through_the_proxy_takes_at_least_twice_the_one_way_delay(echo_port: int) -> None:
    with DelayProxy(echo_port, DELAY) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as connection:
        sent = time.monotonic()
        connection.sendall(b"ping")
        assert receive(connection, 4) == b"ping"
        assert time.monotonic() - sent >= 2 * DELAY


def test_bytes_sent_in_many_writes_come_back_in_their_order_and_in_flight_together(echo_port: int) -> None:
    messages = [f"{number:06d};".encode() for number in range(2000)]
    with DelayProxy(echo_port, DELAY) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as connection:
        sent = time.monotonic()
        for message in messages:
            connection.sendall(message)
        assert receive(connection, sum(map(len, messages))) == b"".join(messages)
        # 2,000 writes each waiting a round trip alone would take 800 s; in flight together, about one.
        assert time.monotonic() - sent < 100 * 2 * DELAY


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="0 seconds or more"):
        DelayProxy(1, -0.001)
