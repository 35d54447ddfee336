"""Notices on NATS: a core subscription (not stored, at most once) opened once a callback is
registered, serving the engine's append notes and member notices alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError

if TYPE_CHECKING:
    from egress.engines.nats.connection import NatsConnection

logger = logging.getLogger(__name__)

T = TypeVar("T")

SKIP = object()
"""What a notice's decoder returns for a message no callback should see (unreadable, or this
instance's own)."""


class CoreNotices(Generic[T]):
    """The callbacks of one kind of notice on ``engine``'s connection: ``subject()`` the subject
    subscribed to (read when subscribing: the layout exists once the engine is open), ``decode``
    turns a message into the value each callback gets (or :data:`SKIP`), ``what`` names the
    notices in logs ("append notes"). Subscribed once a callback is registered, at
    :meth:`opened` if the engine is not yet open; a failed subscription is logged and tried again
    at the next registration; a callback's failure is logged and does not end the notices."""

    def __init__(self, engine: NatsConnection, what: str, subject: Callable[[], str],
                 decode: Callable[[Msg], T | object]) -> None:
        self._engine = engine
        self._what = what
        self._subject = subject
        self._decode = decode
        self.callbacks: list[Callable[[T], None]] = []
        self._subscription: Subscription | None = None
        self._subscribing: asyncio.Task[None] | None = None

    def add(self, callback: Callable[[T], None]) -> None:
        """Register ``callback``; subscribe now if the engine is open and not subscribed yet."""
        self.callbacks.append(callback)
        if self._engine._connection is not None and self._subscription is None and self._subscribing is None:
            self._subscribing = asyncio.get_running_loop().create_task(self.subscribe())
            self._subscribing.add_done_callback(self._subscribed)

    async def opened(self) -> None:
        """The engine opened: subscribe if a callback is registered."""
        if self.callbacks:
            await self.subscribe()

    async def close(self) -> None:
        """Stop a subscription under way; closing the connection ends an open one."""
        subscribing, self._subscribing = self._subscribing, None
        if subscribing is not None:
            subscribing.cancel()
            with contextlib.suppress(asyncio.CancelledError, NatsEngineError, NatsUnavailableError):
                await subscribing
        self._subscription = None

    def _subscribed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("NATS %s: no %s: %s", self._engine.url, self._what, task.exception())
            self._subscribing = None  # the next registration tries again

    async def subscribe(self) -> None:
        """Subscribe to ``subject()`` and flush, so notices published after this returns arrive."""
        engine = self._engine
        connection = engine._connection
        if connection is None or self._subscription is not None:
            return

        async def on_message(message: Msg) -> None:
            value = self._decode(message)
            if value is SKIP:
                return
            for callback in list(self.callbacks):
                try:
                    callback(value)  # type: ignore[arg-type]  # not SKIP: a T
                except Exception:  # one callback's failure must not end the notices
                    logger.exception("a callback of %s failed", self._what)

        async with engine._js().answering(f"the subscription to {self._what}"):
            self._subscription = await connection.subscribe(self._subject(), cb=on_message)
            await connection.flush(timeout=max(1, round(engine.request_timeout)))
