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

from tests.loopback_proxy import LoopbackProxy


class DelayProxy(LoopbackProxy):
    """A loopback TCP proxy to ``upstream_port`` adding ``delay`` seconds (one way) to each
    direction; :meth:`start` returns its port, :meth:`stop` closes everything."""

    thread_name = "delay-proxy"

    def __init__(self, upstream_port: int, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"delay {delay!r}: a one-way delay is 0 seconds or more")
        super().__init__(upstream_port)
        self.delay = delay

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``: the proxy's address for a NATS client."""
        return f"nats://127.0.0.1:{self.port}"

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
