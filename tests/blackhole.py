"""A TCP proxy that can turn into a blackhole: connections stay open and nothing gets through.

:class:`Blackhole` forwards 127.0.0.1:``port`` to an upstream port on loopback, on an event loop in
a thread of its own (so that a synchronous test and other processes can use it). :meth:`stall`
stops forwarding in both directions without closing anything: what either side sends waits in
the sockets' buffers, as behind a network that drops every packet while TCP retransmits, and no
side sees an error or an end of stream. :meth:`flow` forwards again, what waited first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable

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


class Blackhole:
    """A loopback TCP proxy to ``upstream_port``; :meth:`start` returns its port."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="blackhole")

    def start(self) -> int:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self.port

    def stall(self) -> None:
        """Forward nothing from now on (connections stay open) until :meth:`flow`."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def flow(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

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

    async def _listen(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self._flowing.wait()  # a connection made while stalled waits too (its SYN was answered by the kernel)
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        await relay((client_reader, client_writer), (server_reader, server_writer), self._pump, self._writers)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: read no more, the rest waits in the kernel's buffers
                writer.write(data)
                await writer.drain()
