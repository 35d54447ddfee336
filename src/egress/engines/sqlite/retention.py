"""Log retention on SQLite: the log batches every reader is past are deleted."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from egress.engines.sqlite.log import SqliteLog
from egress.line_chunks import unpack_reference

REFERENCE_BYTES = 256
"""Outbox blobs at most this long may be references to the log (``length()`` of a blob reads no page of it)."""


class SqliteRetention(SqliteLog):
    """:meth:`trim_log`, called by ``egress.runtime.retention``."""

    async def trim_log(self, readers: Mapping[str, Collection[str]], keep: int = 0) -> int:
        """Delete the log batches of each stream in ``readers`` (stream id → the consumers that read
        it) that every one of its consumers has committed a position past, by more than ``keep``
        messages (kept for replay). A partition one of them has no position in is not trimmed, and
        its last batch never is (its end is the log's end offset). Returns the batches deleted; the
        pages they held are reused by later commits, so the file stops growing."""
        return await self._call(self._trim_log_sync, readers, keep)

    def _trim_log_sync(self, readers: Mapping[str, Collection[str]], keep: int) -> int:
        db = self._db
        assert db is not None
        deleted = 0
        self._rests.clear()  # what it deletes is read no more; a rest of it must not be either
        with self._transaction():
            referenced = self._referenced_sync()
            for stream, consumers in readers.items():
                if not consumers:
                    continue
                marks = ", ".join("?" * len(consumers))
                lows = db.execute(
                    f"SELECT stream_partition, MIN(offset), COUNT(*) FROM positions WHERE stream = ? AND consumer IN "
                    f"({marks}) GROUP BY stream_partition", (stream, *consumers)).fetchall()
                for partition, low, known in lows:
                    if known < len(consumers):
                        continue  # a consumer without a position there has read nothing yet
                    end = self._end_offset_sync(stream, int(partition))
                    low = min(int(low), referenced.get((stream, int(partition)), int(low)) + keep)
                    deleted += db.execute(
                        "DELETE FROM log_batches WHERE stream = ? AND partition = ? AND offset < ? "
                        "AND offset + count <= ? AND offset + count < ?",
                        (stream, partition, int(low) - keep, int(low) - keep, end)).rowcount
        return deleted

    def _referenced_sync(self) -> dict[tuple[str, int], int]:
        """The lowest log offset an outbox reference (``egress.line_chunks``) names, per log partition:
        a reference's records must stay until its outbox batch is trimmed."""
        assert self._db is not None
        lows: dict[tuple[str, int], int] = {}
        for (blob,) in self._db.execute("SELECT messages FROM outbox_batches WHERE length(messages) <= ?",
                                        (REFERENCE_BYTES,)):
            reference = unpack_reference(bytes(blob))
            if reference is not None:
                slot = (reference.stream, reference.partition)
                lows[slot] = min(lows.get(slot, reference.offset), reference.offset)
        return lows
