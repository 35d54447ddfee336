"""A loopback TCP proxy on an event loop in a thread of its own: the base of the tests' network faults.

:class:`LoopbackProxy` forwards 127.0.0.1:``port`` to an upstream port on loopback; a synchronous
test, a benchmark and other processes can use it. What it does to the bytes is a subclass's
:meth:`LoopbackProxy._pump` (one direction of one connection); :meth:`LoopbackProxy._admit` may hold
a new connection before it is forwarded. ``tests/blackhole.py`` stalls, ``tests/delay_proxy.py``
delays.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Self

Pump = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def relay(client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                server: tuple[asyncio.StreamReader, asyncio.StreamWriter], pump: Pump,
                writers: set[asyncio.StreamWriter]) -> None:
    """Run ``pump`` from ``client`` to ``server`` and back until one direction ends, then close
    both connections; their writers are in ``writers`` meanwhile (for a proxy that closes them all)."""
    writers.update((client[1], server[1]))
    pumps = [asyncio.ensure_future(pump(client[0], server[1])), asyncio.ensure_future(pump(server[0], client[1]))]
    await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    for task in pumps:
        task.cancel()
    for writer in (client[1], server[1]):
        writer.close()
        writers.discard(writer)


class LoopbackProxy:
    """A loopback TCP proxy to ``upstream_port``: :meth:`start` returns its port, :meth:`stop`
    closes every connection and the listener; ``connections`` counts those accepted so far."""

    thread_name = "loopback-proxy"

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=self.thread_name)

    def start(self) -> int:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self.port

    def stop(self) -> None:
        """Close every connection and the listener, and end the thread."""
        async def close() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _admit(self) -> None:
        """Awaited for each accepted connection before it dials upstream; the default admits at once."""

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self._admit()
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        await relay((client_reader, client_writer), (server_reader, server_writer), self._pump, self._writers)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction of one connection until its end; a subclass says how."""
        raise NotImplementedError
