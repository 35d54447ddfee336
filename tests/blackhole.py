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

from tests.loopback_proxy import LoopbackProxy


class Blackhole(LoopbackProxy):
    """A loopback TCP proxy to ``upstream_port``; :meth:`start` returns its port."""

    thread_name = "blackhole"

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._flowing = asyncio.Event()

    def stall(self) -> None:
        """Forward nothing from now on (connections stay open) until :meth:`flow`."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def flow(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    async def _listen(self) -> None:
        self._flowing.set()
        await super()._listen()

    async def _admit(self) -> None:
        await self._flowing.wait()  # a connection made while stalled waits too (its SYN was answered by the kernel)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: read no more, the rest waits in the kernel's buffers
                writer.write(data)
                await writer.drain()
