"""Append notifications on NATS: a commit with log appends publishes a note (core NATS, not stored)
naming the log partitions it grew; other engine instances subscribe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsClientError

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError
from egress.engines.protocols import AppendsCallback

logger = logging.getLogger(__name__)


class NatsAppends(NatsConnection):
    """:meth:`on_appends` and the note each commit with log appends sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._instance = uuid.uuid4().hex  # tells this engine's appends notes from other instances'
        self._appends_callbacks: list[AppendsCallback] = []
        self._appends_subscription: Subscription | None = None
        self._subscribing: asyncio.Task[None] | None = None

    async def _opened(self) -> None:
        await super()._opened()
        if self._appends_callbacks:
            await self._subscribe_appends()

    async def close(self) -> None:
        subscribing, self._subscribing = self._subscribing, None
        if subscribing is not None:
            subscribing.cancel()
            with contextlib.suppress(asyncio.CancelledError, NatsEngineError, NatsUnavailableError):
                await subscribing
        self._appends_subscription = None  # closing the connection ends it
        await super().close()

    def on_appends(self, callback: AppendsCallback) -> None:
        """Call ``callback`` with the slots another engine instance's commit appended to: each commit
        with log appends publishes an appends note on :attr:`Layout.appends` (core NATS: not stored,
        lost when nobody listens or the connection is down), to which this engine subscribes once a
        callback is registered (at ``open()`` if not yet open). Notes this instance sent are ignored."""
        self._appends_callbacks.append(callback)
        if self._connection is not None and self._appends_subscription is None and self._subscribing is None:
            self._subscribing = asyncio.get_running_loop().create_task(self._subscribe_appends())
            self._subscribing.add_done_callback(self._subscribed)

    def _subscribed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("NATS %s: no append notes: %s", self.url, task.exception())
            self._subscribing = None  # the next registration tries again

    async def _subscribe_appends(self) -> None:
        connection = self._connection
        if connection is None or self._appends_subscription is not None:
            return

        async def on_note(message: Msg) -> None:
            try:
                sender, slots = records.appends_note_slots(message.data)
                chunks = records.appends_note_chunks(message.data)
            except (ValueError, TypeError) as error:
                logger.warning("NATS %s: %s: an unreadable appends note: %s", self.url, message.subject, error)
                return
            if sender == self._instance:
                return
            self._chunks_noted(chunks)
            for callback in list(self._appends_callbacks):
                try:
                    callback(slots)
                except Exception:  # one callback's failure must not end the notifications
                    logger.exception("an on_appends callback failed")

        async with self._js().answering("the subscription to append notes"):
            self._appends_subscription = await connection.subscribe(self._layout.appends, cb=on_note)
            await connection.flush(timeout=max(1, round(self.request_timeout)))

    def _chunks_noted(self, chunks: list[records.NotedChunk]) -> None:
        """Another instance stored these log chunks (from its appends note): the log's reader
        (:class:`~egress.engines.nats.log.NatsLog`) learns where they are."""

    async def _notify_appends(self, slots: list[tuple[str, int]], chunks: list[records.NotedChunk]) -> None:
        """Tell other instances which log partitions a commit grew and where its log ``chunks`` are
        stored, so that their reads fetch each by its sequence rather than search the stream for it
        (best effort: the commit stands)."""
        connection = self._connection
        if connection is None or not slots:
            return
        try:
            await connection.publish(self._layout.appends, records.appends_note(self._instance, slots, chunks))
        except (NatsClientError, OSError) as error:
            logger.debug("NATS %s: an appends note was not sent: %s", self.url, error)
