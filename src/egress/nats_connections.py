"""Connecting and closing nats-py connections: shared by every NATS user of egress (the engine,
the ``nats`` source, the throttler's NATS transport).

**Connecting** (:func:`connect`). The first connection must succeed within ``connect_timeout``
seconds (every server tried again and again, 1 s apart, meanwhile), or :class:`NatsUnreachableError`
names the last attempt's error: with nats-py's ``max_reconnect_attempts=-1`` alone the first
connect is retried for ever, each failure logged with a traceback. Once connected, a lost
connection is retried for ever; each change of state is logged once (a warning when it is lost, one
when it is back), the failed attempts in between only at debug level.

**Closing** (:func:`close_connection`). nats-py's ``Client.close()`` cancels its reconnect task
once. On Python 3.11 ``asyncio.wait_for`` swallows a cancel that lands as the connect it waits for
fails (a server gone refuses at once); nats-py then tries the next connect and goes on for ever,
so the event loop could never end after a lost server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from egress.errors import EgressError

if TYPE_CHECKING:  # nats-py is imported by the user of a connection: `import egress` stays without it
    from nats.aio.client import Client

logger = logging.getLogger("egress.nats")

RECONNECT_CANCEL_ATTEMPTS = 100
"""Times :func:`close_connection` cancels nats-py's reconnect task, 0.1 s apart, before it gives up."""
RECONNECT_TIME_WAIT = 1
"""Seconds between two attempts to reach the same server (the first connection's and after a loss)."""


class NatsUnreachableError(EgressError):
    """No server of a NATS connection answered within its ``connect_timeout``: ``cause`` is the last
    attempt's error as text. Each user raises its own error from it, naming the fix."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


async def connect(client: Client, servers: Sequence[str], connect_timeout: float, *, label: str,
                  on_disconnected: Callable[[], None] | None = None, on_reconnected: Callable[[], None] | None = None,
                  on_closed: Callable[[], None] | None = None, disconnected_note: str = "", **options: Any) -> None:
    """Connect ``client`` (a new ``nats.aio.client.Client``) to one of ``servers``
    (``nats://HOST:PORT`` or ``tls://HOST:PORT``) within ``connect_timeout`` seconds, else close it
    and raise :class:`NatsUnreachableError` (a cancel closes it too). ``label`` names the connection
    in the log; ``disconnected_note`` ends the line logged when it is lost. ``on_disconnected``,
    ``on_reconnected`` and ``on_closed`` are called as the connection changes state; ``options``
    are passed on to ``Client.connect`` (``name``, ``pending_size``, credentials, ...)."""
    from nats.errors import Error as NatsClientError

    failures: list[Exception] = []
    connected = False

    async def error_callback(error: Exception) -> None:
        if not connected:
            failures.append(error)
        # The attempts of a first connection or of a reconnection fail quietly: their outcome is logged once.
        level = logging.WARNING if client.is_connected else logging.DEBUG
        logger.log(level, "NATS %s: %s", label, error or type(error).__name__)

    async def disconnected_callback() -> None:
        if connected and not client.is_closed:
            logger.warning("NATS %s: disconnected; reconnecting%s", label, disconnected_note)
        if on_disconnected is not None:
            on_disconnected()

    async def reconnected_callback() -> None:
        where = client.connected_url.netloc if client.connected_url else "?"
        logger.warning("NATS %s: reconnected to %s", label, where)
        if on_reconnected is not None:
            on_reconnected()

    async def closed_callback() -> None:
        if on_closed is not None:
            on_closed()

    try:
        await asyncio.wait_for(client.connect(
            servers=list(servers), connect_timeout=max(1, round(connect_timeout)),
            reconnect_time_wait=RECONNECT_TIME_WAIT, max_reconnect_attempts=-1, allow_reconnect=True,
            error_cb=error_callback, disconnected_cb=disconnected_callback, reconnected_cb=reconnected_callback,
            closed_cb=closed_callback, **options), connect_timeout)
    except (TimeoutError, OSError, NatsClientError) as error:
        await close_connection(client, label)
        cause = failures[-1] if failures else error
        raise NatsUnreachableError(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
                                   ) from None
    except BaseException:  # cancelled (the run stops): nothing may go on connecting
        await close_connection(client, label)
        raise
    connected = True


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
