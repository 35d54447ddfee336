"""Append notifications on NATS: a commit with log appends publishes a note (core NATS, not stored)
naming the log partitions it grew, and carrying its small log chunks whole; other engine instances
subscribe."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from nats.aio.msg import Msg
from nats.errors import Error as NatsClientError

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.notices import SKIP, CoreNotices
from egress.engines.protocols import AppendsCallback

logger = logging.getLogger(__name__)

NOTE_CARRIES = 64 * 1024
"""Bytes: an appends note carries a commit's log chunks whole, in order, while together they stay
within this (and the server's ``max_payload``); a chunk past it is named only. A reader that heard
the note then reads a carried chunk with no request (a direct get per chunk and reading job, each a
round trip the server answers from its store), at the price of every instance receiving its bytes:
worth it for the small chunks of frequent commits (an http source's), not for the large ones of a
bulk read, which one job reads by one get."""


class NatsAppends(NatsConnection):
    """:meth:`on_appends` and the note each commit with log appends sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._instance = uuid.uuid4().hex  # tells this engine's appends notes from other instances'
        self._appends_notices: CoreNotices[set[tuple[str, int]] | None] = CoreNotices(
            self, "append notes", lambda: self._layout.appends, self._slots_of)

    async def _opened(self) -> None:
        await super()._opened()
        await self._appends_notices.opened()

    async def close(self) -> None:
        await self._appends_notices.close()
        await super().close()

    def on_appends(self, callback: AppendsCallback) -> None:
        """Call ``callback`` with the slots another engine instance's commit appended to: each commit
        with log appends publishes an appends note on :attr:`Layout.appends` (core NATS: not stored,
        lost when nobody listens or the connection is down), to which this engine subscribes once a
        callback is registered (at ``open()`` if not yet open). Notes this instance sent are ignored."""
        self._appends_notices.add(callback)

    def _slots_of(self, message: Msg) -> set[tuple[str, int]] | object:
        """The slots another instance's appends note names (its chunks noted for the log's reader
        on the way), or ``SKIP`` for an unreadable note or one of this instance's own."""
        try:
            sender, slots, chunks = records.read_appends_note(message.data)
        except (ValueError, TypeError) as error:
            logger.warning("NATS %s: %s: an unreadable appends note: %s", self.url, message.subject, error)
            return SKIP
        if sender == self._instance:
            return SKIP
        self._chunks_noted(chunks)
        return slots

    def _chunks_noted(self, chunks: list[records.NotedPayload]) -> None:
        """Another instance stored these log chunks (from its appends note, each with its payload
        when the note carries it): the log's reader (:class:`~egress.engines.nats.log.NatsLog`)
        learns where they are."""

    async def _notify_appends(self, slots: list[tuple[str, int]], chunks: list[records.NotedPayload]) -> None:
        """Tell other instances which log partitions a commit grew and where its log ``chunks`` are
        stored (each with its payload, the chunk as stored), so that their reads fetch each by its
        sequence rather than search the stream for it; the note carries the payloads of the first
        chunks within :data:`NOTE_CARRIES` bytes, which a reader then needs no request for (best
        effort: the commit stands)."""
        connection = self._connection
        if connection is None or not slots:
            return
        room = min(NOTE_CARRIES, self._budget // 2)  # the rest of max_payload: the names
        payloads: list[bytes | None] = []
        for _, payload in chunks:
            size = 0 if payload is None else len(payload)
            payloads.append(payload if 0 < size <= room else None)
            room = room - size if 0 < size <= room else 0  # in order: a reader's next chunk, not a later one
        note = records.appends_note(self._instance, slots, [chunk for chunk, _ in chunks], payloads)
        try:
            await connection.publish(self._layout.appends, note)
        except (NatsClientError, OSError) as error:
            logger.debug("NATS %s: an appends note was not sent: %s", self.url, error)
