"""``Log`` on NATS: log chunks ``log.<stream>.<partition>.<first offset>``, read through what this
process knows of them (:class:`~egress.engines.nats.log_index.LogIndex`)."""

from __future__ import annotations

import bisect
from typing import Any

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.jetstream import Stored
from egress.engines.nats.log_index import Chunk, LogIndex
from egress.engines.protocols import LogMessage
from egress.rows import decode_row

SEARCH_PERIOD = 0.25
"""Seconds: how often at most a read from a log partition's known end searches the stream for a
chunk past it (:meth:`NatsLog.read`)."""


class NatsLog(NatsConnection):
    """:class:`~egress.engines.protocols.Log` of the bucket."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._log_ends: dict[tuple[str, int], tuple[int, int]] = {}
        self._indexes: dict[tuple[str, int], LogIndex] = {}
        self._searched: dict[tuple[str, int], float] = {}  # when a read from the known end last found nothing
        self._last_log_seq: int | None = None  # the bucket's last log chunk at the last appends_missed()
        self._wake_until: float | None = None  # appends_missed() says True until a call at or after this

    async def appends_missed(self) -> bool:
        """``MissedAppends``: whether the bucket's last log chunk (one direct get) moved since the
        last call, or moved less than :data:`SEARCH_PERIOD` before this one. A chunk stored before
        a call that saw it move is read by a job woken at a call :data:`SEARCH_PERIOD` or more after
        that (a read from the known end may skip its search within that period of the last, which
        may have come before the chunk); so ``True`` lasts until such a call."""
        stored = await self._js().last(self._layout.all_log_chunks())
        last = 0 if stored is None else stored.seq
        now = self._clock.monotonic()
        if last != self._last_log_seq:
            self._last_log_seq, self._wake_until = last, now + SEARCH_PERIOD
            return True
        if self._wake_until is None:
            return False
        if now >= self._wake_until:
            self._wake_until = None
        return True

    async def read(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        """Up to ``limit`` messages after ``after``. A read that has messages stops at the end this
        process knows (its own appends, the appends notes): the search for a chunk past it is a
        round trip to the server that finds nothing in the usual case, each epoch of a job that
        keeps up; a chunk a missed note did not announce is read by the next read, at the latest
        on the jobs' wake every ``remote_poll_period``, as when the job is idle. A read from the
        known end searches (a note may have been missed), but at most once per
        :data:`SEARCH_PERIOD` (the clock's) while those searches find nothing: a job woken by every
        commit of every reader of its input reads most of its lanes at their ends each epoch, and
        each search is a request the server answers with nothing; a missed note's chunk is then read
        within :data:`SEARCH_PERIOD` of the job's next wake."""
        messages: list[LogMessage] = []
        offset = after
        slot = (stream, partition)
        while len(messages) < limit:
            known_end = self._log_ends.get(slot)
            at_end = known_end is not None and offset >= known_end[0]
            if at_end and (messages or self._clock.monotonic() - self._searched.get(slot, -SEARCH_PERIOD)
                           < SEARCH_PERIOD):
                break
            chunk = await self._chunk_containing(slot, offset)
            if chunk is None and at_end:
                self._searched[slot] = self._clock.monotonic()
            if chunk is None or chunk.entries is None:
                break
            offset = max(offset, chunk.first)  # below a chunk only when retention purged the offsets between
            start = offset - chunk.first
            taken = chunk.entries[start:start + limit - len(messages)]
            if not taken:
                break
            messages.extend(LogMessage(stream, partition, offset + i, message_id, key, timestamp, decode_row(row))
                            for i, (message_id, key, timestamp, row) in enumerate(taken))
            offset += len(taken)
        return messages

    async def end_offset(self, stream: str, partition: int) -> int:
        stored = await self._js().last(self._layout.log_chunks(stream, partition))
        if stored is None:
            return 0
        first, count = records.log_chunk_extent(stored.data)
        return first + count

    def _index(self, slot: tuple[str, int]) -> LogIndex:
        index = self._indexes.get(slot)
        if index is None:
            index = self._indexes[slot] = LogIndex()
        return index

    async def _chunk_containing(self, slot: tuple[str, int], offset: int) -> Chunk | None:
        """The decoded chunk holding ``offset``, or the first stored one after it (retention purged
        the offsets before), or ``None`` when ``offset`` is at the end."""
        index = self._index(slot)
        while True:
            known = index.floor(offset)
            if known is None:
                found = await self._first_chunk_from(slot, offset)
                if found is None or found.first > offset:
                    return found
                continue
            if offset < known.end:
                if known.entries is None and known.payload is not None:  # an appends note carried it
                    known = self._decoded(slot, known.seq, known.payload)
                if known.entries is None:
                    stored = await self._js().get(known.seq)
                    if stored is None:  # purged meanwhile
                        return await self._first_chunk_from(slot, offset)
                    known = self._remember(slot, stored)
                return known
            following = await self._js().scan(self._layout.log_chunks(*slot), known.seq + 1, limit=2)
            if not following:
                return None
            for stored in following:
                self._remember(slot, stored)

    async def _first_chunk_from(self, slot: tuple[str, int], offset: int) -> Chunk | None:
        """Look a chunk up: the one holding ``offset``, else the first stored after it (``None``
        when there is none). The last stored chunk is got first (a direct get): a log partition
        with none is empty, and an ``offset`` at or past that chunk's first needs nothing more, so
        the reads of an idle job (an empty lane, or one read to its end) cost no search of the
        stored chunk subjects (a STREAM.INFO: an API request the server answers with an advisory
        and a walk of the subjects), which only an offset before the last chunk needs."""
        js = self._js()
        last = await js.last(self._layout.log_chunks(*slot))
        if last is None:
            self._advance_log_end(slot, 0, 0)
            return None
        first, count = records.log_chunk_extent(last.data)
        self._advance_log_end(slot, first + count, last.seq)
        if offset >= first + count:
            self._index(slot).add(Chunk(first, count, last.seq))
            return None
        if offset >= first:
            return self._remember(slot, last)
        firsts = sorted(int(subject.rsplit(".", 1)[1])
                        for subject in await js.subjects(self._layout.log_chunks(*slot)))
        if not firsts:
            return None
        at = bisect.bisect_right(firsts, offset)
        first = firsts[at - 1] if at else firsts[0]
        stored = await js.last(self._layout.log_chunk(*slot, first))
        return None if stored is None else self._remember(slot, stored)

    def _chunks_noted(self, chunks: list[records.NotedPayload]) -> None:
        """Index the log chunks another instance's appends note names (stream sequence, offsets, and
        the chunk itself when the note carries it): a read reaching a carried one decodes it with
        no request, one reaching another gets it by its sequence, not by searching the stream for
        the next chunk of its subject (which costs the server a walk over the messages after the
        last one known); and a writer to the same log partition knows its new end before its next append
        (else that append is refused, and the end read back whole: the last chunk). A note is at
        most once, and may come late: a chunk it missed is searched for as before, and an end it
        gives that is not the last makes an append fail its expectation and read the end again."""
        for (stream, partition, first, count, seq), payload in chunks:
            slot = (stream, partition)
            self._index(slot).add(Chunk(first, count, seq, payload=payload))
            self._advance_log_end(slot, first + count, seq)

    def _advance_log_end(self, slot: tuple[str, int], end: int, seq: int) -> None:
        """Record ``(end, seq)`` as the log partition's end unless a later chunk is known already."""
        known = self._log_ends.get(slot)
        if known is None or seq > known[1]:
            self._log_ends[slot] = (end, seq)

    def _remember(self, slot: tuple[str, int], stored: Stored) -> Chunk:
        return self._decoded(slot, stored.seq, stored.data)

    def _decoded(self, slot: tuple[str, int], seq: int, data: bytes) -> Chunk:
        """Index the log chunk ``data`` stored at stream sequence ``seq``, its entries decoded."""
        first, entries = records.log_chunk_entries(data)
        return self._index(slot).add(Chunk(first, len(entries), seq, entries))

    async def _log_end(self, slot: tuple[str, int]) -> tuple[int, int]:
        """``(end offset, sequence of its last chunk)`` of a log partition, as last known here."""
        end = self._log_ends.get(slot)
        if end is None:
            stored = await self._js().last(self._layout.log_chunks(*slot))
            if stored is None:
                end = (0, 0)
            else:
                first, count = records.log_chunk_extent(stored.data)
                self._index(slot).add(Chunk(first, count, stored.seq))
                end = (first + count, stored.seq)
            self._log_ends[slot] = end
        return end

    def _hint(self, slot: tuple[str, int], offset: int) -> int:
        known = self._indexes.get(slot)
        chunk = None if known is None else known.floor(offset)
        return 0 if chunk is None else chunk.seq
