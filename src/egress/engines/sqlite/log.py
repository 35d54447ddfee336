"""``Log`` on SQLite: reads of the stored log batches, served from memory where this process
committed them last."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egress.engines.protocols import ChunkAt, LogMessage
from egress.engines.sqlite.batches import BatchRests, LogTail, batch_messages, entry_messages
from egress.engines.sqlite.connection import SqliteConnection
from egress.line_chunks import LineChunk, is_packed, unpack_chunk

TAIL_BYTES = 512 * 1024
"""How many bytes of just-committed log batches an engine keeps for readers in the same process
(:class:`LogTail`): a downstream job that keeps up (live input: small commits) reads them without a
SELECT (512 KiB: ~1,500 messages of ~330 bytes); a reader further behind (a backlog, where the
source runs far ahead of the jobs) reads the database, and every MiB held for it was a MiB of peak
RSS draining a backlog."""
FRESH_CHUNKS = 4
"""How many just-committed chunks of lines an engine keeps as objects for readers in the same process."""
RESTS_MESSAGES = 2048
"""How many decoded log messages an engine keeps for reads that continue inside a batch an earlier
read stopped in (:class:`BatchRests`): epochs of a few hundred messages read batches of a
thousand (a source chunk of 4,096 over 4 partitions), which were otherwise decoded once per read."""



class SqliteLog(SqliteConnection):
    """:class:`~egress.engines.protocols.Log` of the connection's database: the log is stored in
    batches, one row of ``log_batches`` per commit and ``(stream, partition)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Unshared only (the directory's one writer): the ends it wrote, and what it appended last,
        # stay true. Shared, another process may append next, so the database is asked every time.
        self._end_offsets: dict[tuple[str, int], int] = {}
        self._tail = LogTail(TAIL_BYTES)
        self._rests = BatchRests(RESTS_MESSAGES)
        # Unshared only: the chunks of lines this process committed last, as the objects committed
        # (immutable), so that reading one back copies nothing; by (stream, partition, offset).
        self._fresh_chunks: dict[tuple[str, int, int], LineChunk] = {}

    def _close_sync(self) -> None:
        self._fresh_chunks.clear()
        self._tail = LogTail(TAIL_BYTES)
        self._rests.clear()
        super()._close_sync()

    async def read(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        if self.shared:  # another process may have appended: the database alone knows the end
            return await self._read_call(self._read_sync, stream, partition, after, limit)
        end = self._end_offsets.get((stream, partition))
        if end is not None and after >= end:
            return []  # at the durable end: nothing to ask the database
        return await self._call(self._read_sync, stream, partition, after, limit)

    def _read_sync(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        # A read that stopped inside a batch left the rest of it decoded: the next read from there
        # (the same reader's next epoch, usually) starts with it instead of decoding the batch again.
        rest = self._rests.take(stream, partition, after)
        if rest is None:
            return self._read_stored(stream, partition, after, limit)
        messages = entry_messages(stream, partition, after, rest[:limit])
        if len(rest) > limit:
            self._rests.keep(stream, partition, after + limit, rest[limit:])
            return messages
        if len(messages) < limit:
            messages.extend(self._read_stored(stream, partition, after + len(messages), limit - len(messages)))
        return messages

    def _read_stored(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        """:meth:`read` from the stored batches (the tail's or the database's)."""
        return batch_messages(stream, partition, after, after + limit,
                              self._stored_batches(stream, partition, after, limit), self._rests)

    def _stored_batches(self, stream: str, partition: int, after: int, limit: int) -> Iterable[tuple[int, bytes]]:
        """``(offset, blob)`` of the stored batches holding offsets ``after`` .. ``after + limit - 1``."""
        # What this process committed last is decoded from memory, without a SELECT; the tail is
        # used only when it reaches the durable end offset (else it may miss messages), and only
        # unshared (a shared engine keeps neither the tail nor the end offsets).
        kept = None if self.shared else self._tail.batches(
            stream, partition, after, self._end_offsets.get((stream, partition)))
        if kept is not None:
            return kept
        db = self._db
        assert db is not None
        first = db.execute(
            "SELECT offset FROM log_batches WHERE stream = ? AND partition = ? AND offset <= ? "
            "ORDER BY offset DESC LIMIT 1", (stream, partition, after)).fetchone()
        return db.execute(
            "SELECT offset, messages FROM log_batches WHERE stream = ? AND partition = ? AND offset >= ? "
            "AND offset < ? AND offset + count > ? ORDER BY offset",
            (stream, partition, after if first is None else first[0], after + limit, after))

    async def read_chunks(self, stream: str, partition: int, after: int, limit: int) -> list[ChunkAt | LogMessage]:
        """``LineChunkLog.read_chunks``: stored chunks as :class:`ChunkAt`, stored rows as messages."""
        if self.shared:
            return await self._read_call(self._read_chunks_sync, stream, partition, after, limit)
        end = self._end_offsets.get((stream, partition))
        if end is not None and after >= end:
            return []
        return await self._call(self._read_chunks_sync, stream, partition, after, limit)

    def _read_chunks_sync(self, stream: str, partition: int, after: int, limit: int) -> list[ChunkAt | LogMessage]:
        rest = self._rests.take(stream, partition, after)
        if rest is not None:  # inside a batch of rows a read stopped in: rows
            self._rests.keep(stream, partition, after, rest)
            return list(self._read_sync(stream, partition, after, limit))
        items: list[ChunkAt | LogMessage] = []
        position, end = after, after + limit
        for offset, blob in self._stored_batches(stream, partition, after, limit):
            if position >= end:
                break
            if is_packed(blob):
                chunk = self._fresh_chunks.get((stream, partition, offset)) or unpack_chunk(blob)
                if offset + chunk.count > position:
                    items.append(ChunkAt(position, chunk.tail(position - offset)))
                    position = offset + chunk.count
            else:
                messages = batch_messages(stream, partition, position, end, [(offset, blob)], self._rests)
                items.extend(messages)
                position += len(messages)
        return items

    async def end_offset(self, stream: str, partition: int) -> int:
        return await self._call(self._end_offset_sync, stream, partition)

    def _end_offset_sync(self, stream: str, partition: int) -> int:
        """The end offset of ``(stream, partition)``: from the cache unshared, else (shared: always)
        from the database, which inside a write transaction no other process can move."""
        assert self._db is not None
        if not self.shared:
            cached = self._end_offsets.get((stream, partition))
            if cached is not None:
                return cached
        last = self._db.execute(
            "SELECT offset + count FROM log_batches WHERE stream = ? AND partition = ? ORDER BY offset DESC LIMIT 1",
            (stream, partition)).fetchone()
        end = 0 if last is None else int(last[0])
        if not self.shared:
            self._end_offsets[(stream, partition)] = end
        return end

    def _log_ends_sync(self) -> dict[tuple[str, int], int]:
        """The end offset of every log partition written."""
        db = self._db
        assert db is not None
        log_ends: dict[tuple[str, int], int] = {}
        # One indexed MAX per (stream, partition), found by skipping from slot to slot, instead of
        # a GROUP BY over every log row.
        slot = db.execute("SELECT stream, partition FROM log_batches ORDER BY stream, partition LIMIT 1").fetchone()
        while slot is not None:
            stream, partition = str(slot[0]), int(slot[1])
            log_ends[(stream, partition)] = self._end_offset_sync(stream, partition)
            slot = db.execute(
                "SELECT stream, partition FROM log_batches WHERE stream > ? OR (stream = ? AND partition > ?) "
                "ORDER BY stream, partition LIMIT 1", (stream, stream, partition)).fetchone()
        return log_ends

