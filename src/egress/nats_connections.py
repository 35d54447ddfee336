"""Closing a nats-py connection so that it really ends: shared by every NATS user of egress (the
engine, the ``nats`` source, the throttler's NATS transport).

nats-py's ``Client.close()`` cancels its reconnect task once. On Python 3.11 ``asyncio.wait_for``
swallows a cancel that lands as the connect it waits for fails (a server gone refuses at once);
nats-py then tries the next connect and, with ``max_reconnect_attempts=-1`` (every egress client),
goes on for ever, so the event loop could never end after a lost server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("egress.nats")

RECONNECT_CANCEL_ATTEMPTS = 100
"""Times :func:`close_connection` cancels nats-py's reconnect task, 0.1 s apart, before it gives up."""


async def close_connection(connection: Any, url: str) -> None:
    """Close ``connection`` (a ``nats.aio.client.Client``; ``url`` names it in the debug log when
    closing fails, as it does once the server is lost), then cancel its reconnect task until it
    has ended. Never raises for a connection already lost; logs a warning when the reconnect task
    outlives :data:`RECONNECT_CANCEL_ATTEMPTS` cancels."""
    from nats.errors import Error as NatsClientError

    if not connection.is_closed:
        try:
            await connection.close()
        except (NatsClientError, TimeoutError, OSError) as error:  # lost already: nothing left to release
            logger.debug("NATS %s: closing: %s", url, error)
    task: asyncio.Task[None] | None = getattr(connection, "_reconnection_task", None)
    for _ in range(RECONNECT_CANCEL_ATTEMPTS):
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    logger.warning("NATS %s: the closed connection's reconnect task did not end after %d cancels", url,
                   RECONNECT_CANCEL_ATTEMPTS)
