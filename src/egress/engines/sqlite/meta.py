"""The pipeline's metadata (the ``meta`` table) and the inventory of committed work, on SQLite."""

from __future__ import annotations

from egress.engines.protocols import CommittedInventory
from egress.engines.sqlite.batches import outbox_entries
from egress.engines.sqlite.log import SqliteLog


class SqliteMeta(SqliteLog):
    """:meth:`read_meta`, :meth:`write_meta` and :meth:`inventory` of the connection's database."""

    async def read_meta(self, key: str) -> str | None:
        """The directory's metadata value ``key`` (``None`` when never written)."""
        return await self._call(self._read_meta_sync, key)

    def _read_meta_sync(self, key: str) -> str | None:
        assert self._db is not None
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    async def write_meta(self, key: str, value: str) -> None:
        """Set the metadata value ``key``, durably (its own transaction)."""
        await self._call(self._write_meta_sync, key, value)

    def _write_meta_sync(self, key: str, value: str) -> None:
        assert self._db is not None
        with self._transaction():
            self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                             "ON CONFLICT DO UPDATE SET value = excluded.value", (key, value))

    async def inventory(self) -> CommittedInventory:
        """Where committed work waits (:class:`CommittedInventory`); reads indexes only for the log."""
        return await self._read_call(self._inventory_sync)

    def _inventory_sync(self) -> CommittedInventory:
        db = self._db
        assert db is not None
        log_ends = self._log_ends_sync()
        read_positions: dict[tuple[str, int], list[int]] = {}
        for stream, stream_partition, offset in db.execute(
                "SELECT stream, stream_partition, offset FROM positions WHERE consumer NOT LIKE 'source:%'"):
            read_positions.setdefault((str(stream), int(stream_partition)), []).append(int(offset))
        acknowledged = {(str(c), int(p)): int(seq) for c, p, seq in db.execute(
            "SELECT consumer, partition, seq FROM outbox_acknowledged")}
        outbox: dict[tuple[str, int, str], int] = {}
        for c, p, first, s, n in db.execute(
                "SELECT consumer, partition, first_seq, stream, count FROM outbox_batches").fetchall():
            low = acknowledged.get((c, p), 0)
            # A batch the sinks have persisted part of is kept whole: count only what is beyond.
            waiting = int(n) if first > low else sum(1 for seq, *_ in outbox_entries(db, first, db.execute(
                "SELECT messages FROM outbox_batches WHERE consumer = ? AND partition = ? AND first_seq = ?",
                (c, p, first)).fetchone()[0]) if seq > low)
            if waiting:
                outbox[(str(c), int(p), str(s))] = outbox.get((str(c), int(p), str(s)), 0) + waiting
        timers = {(str(c), int(p)): int(n) for c, p, n in db.execute(
            "SELECT consumer, partition, COUNT(*) FROM timers GROUP BY consumer, partition")}
        return CommittedInventory(log_ends, read_positions, outbox, timers)
