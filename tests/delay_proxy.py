"""A TCP proxy that delays every byte by a fixed one-way time: a far host on loopback.

This kernel has no ``netem``, so :class:`DelayProxy` stands for the network between hosts: it
forwards 127.0.0.1:``port`` to an upstream port on loopback, on an event loop in a thread of its own
(a synchronous test, a benchmark and other processes can use it), and hands each chunk it reads to
the other side ``delay`` seconds after it arrived, in each direction, keeping the byte order (one
queue per direction, chunks leave in the order they came). What it reads meanwhile is not held
back: the delay adds latency, not a bandwidth limit, as a long link with large windows would. A
round trip through it costs ``2 × delay`` plus the event loop's timer granularity (asyncio waits in
whole milliseconds on Linux: about 1 ms more per direction for a delay under 1 ms; measure the
round trip rather than assume it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.blackhole import relay


class DelayProxy:
    """A loopback TCP proxy to ``upstream_port`` adding ``delay`` seconds (one way) to each
    direction; :meth:`start` returns its port, :meth:`stop` closes everything."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"delay {delay!r}: a one-way delay is 0 seconds or more")
        self.upstream_port = upstream_port
        self.delay = delay
        self.port = 0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="delay-proxy")

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``: the proxy's address for a NATS client."""
        return f"nats://127.0.0.1:{self.port}"

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

    def __enter__(self) -> DelayProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        await relay((client_reader, client_writer), (server_reader, server_writer), self._pump, self._writers)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read as fast as the sender sends; write each chunk ``delay`` after it was read, in order."""
        loop = asyncio.get_running_loop()
        waiting: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await waiting.get()
                if not data:
                    return
                pause = due - loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    waiting.put_nowait((loop.time() + self.delay, data))
            waiting.put_nowait((loop.time() + self.delay, b""))  # the end of stream, after the rest
            with contextlib.suppress(OSError):
                await sender
        finally:
            sender.cancel()
