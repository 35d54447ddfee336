"""A background publisher into a JetStream stream, for the NATS source's kill and cluster tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import nats
import orjson
from nats.js.api import StreamConfig


class Publisher:
    """Makes the stream ``config`` describes and publishes ``{"id": i, "payload": "order i"}`` to
    ``subject(i)`` in order, 20 every 20 ms (about 1,000 a second), on its own thread and event loop,
    until :meth:`stop`; ``count`` says how many were acknowledged."""

    def __init__(self, url: str, config: StreamConfig, subject: Callable[[int], str]) -> None:
        self.url, self.config, self.subject = url, config, subject
        self.count = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._publish()), daemon=True)

    def start(self) -> None:
        """Start publishing once the stream exists (so the first run finds it)."""
        self._thread.start()
        assert self._ready.wait(timeout=30), "the stream was not created"

    def stop(self) -> int:
        """Stop publishing; the count of acknowledged messages."""
        self._stop.set()
        self._thread.join(timeout=30)
        return self.count

    async def _publish(self) -> None:
        client = await nats.connect(self.url)
        js = client.jetstream()
        await js.add_stream(self.config)
        self._ready.set()
        while not self._stop.is_set():
            for _ in range(20):
                message = {"id": self.count, "payload": f"order {self.count}"}
                await js.publish(self.subject(self.count), orjson.dumps(message))
                self.count += 1
            await asyncio.sleep(0.02)
        await client.close()
