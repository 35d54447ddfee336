"""The loading half of ``CheckpointStore`` on SQLite: a partition job's checkpoint and keyed state."""

from __future__ import annotations

from egress.engines.protocols import Checkpoint, KeyedState, OutboxMessage, SinkProgress
from egress.engines.sqlite.batches import outbox_entries
from egress.engines.sqlite.connection import SqliteConnection
from egress.keys import partition_of


class SqliteCheckpoints(SqliteConnection):
    """:meth:`load_checkpoint` and :meth:`load_keyed_state` of the connection's database (shared:
    each from one snapshot)."""

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str], *,
                              with_outbox: bool = True) -> Checkpoint:
        return await self._read_call(self._load_checkpoint_sync, consumer, partition, sinks, with_outbox)

    def _load_checkpoint_sync(self, consumer: str, partition: int, sinks: list[str],
                              with_outbox: bool = True) -> Checkpoint:
        assert self._db is not None
        positions = {
            (stream, stream_partition): int(offset)
            for stream, stream_partition, offset in self._db.execute(
                "SELECT stream, stream_partition, offset FROM positions WHERE consumer = ? AND partition = ?",
                (consumer, partition),
            )
        }
        progress = {sink: SinkProgress() for sink in sinks}
        for sink, producer, message_id, seq, sink_state in self._db.execute(
            "SELECT sink, producer_id, max_persisted_message_id, max_persisted_seq_no, sink_state FROM sink_progress "
            "WHERE consumer = ? AND partition = ?",
            (consumer, partition),
        ):
            progress[sink] = SinkProgress(producer, message_id, int(seq), bytes(sink_state))
        low = min((p.max_persisted_seq_no for p in progress.values()), default=0)
        trimmed = self._db.execute("SELECT seq FROM outbox_acknowledged WHERE consumer = ? AND partition = ?",
                                   (consumer, partition)).fetchone()
        # Batches are deleted whole: what an earlier commit trimmed may still be stored beside the rest.
        low = max(low, 0 if trimmed is None else int(trimmed[0]))
        db = self._db
        outbox = sorted(
            (OutboxMessage(seq, stream, *entry)
             for stream, first, blob in db.execute(
                 "SELECT stream, first_seq, messages FROM outbox_batches WHERE consumer = ? AND partition = ? "
                 "AND last_seq > ?", (consumer, partition, low)).fetchall()
             for seq, *entry in outbox_entries(db, first, blob) if seq > low),
            key=lambda message: message.seq) if with_outbox else []
        (last_seq,) = self._db.execute(
            "SELECT MAX(last_seq) FROM outbox_batches WHERE consumer = ? AND partition = ?", (consumer, partition)
        ).fetchone()
        high = max([int(last_seq or 0), *(p.max_persisted_seq_no for p in progress.values())])
        return Checkpoint(positions, progress, outbox, high + 1)

    async def read_outbox(self, consumer: str, partition: int, after_seq: int, last_seq: int) -> list[OutboxMessage]:
        """The committed outbox messages with ``after_seq < seq <= last_seq`` (``OutboxReader``)."""
        return await self._read_call(self._read_outbox_sync, consumer, partition, after_seq, last_seq)

    def _read_outbox_sync(self, consumer: str, partition: int, after_seq: int, last_seq: int) -> list[OutboxMessage]:
        db = self._db
        assert db is not None
        return sorted(
            (OutboxMessage(seq, stream, *entry)
             for stream, first, blob in db.execute(
                 "SELECT stream, first_seq, messages FROM outbox_batches WHERE consumer = ? AND partition = ? "
                 "AND last_seq > ? AND first_seq <= ?", (consumer, partition, after_seq, last_seq)).fetchall()
             for seq, *entry in outbox_entries(db, first, blob) if after_seq < seq <= last_seq),
            key=lambda message: message.seq)

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external_tables: list[str]) -> KeyedState:
        return await self._read_call(self._load_keyed_state_sync, consumer, partition, partition_count, external_tables)

    def _load_keyed_state_sync(self, consumer: str, partition: int, partition_count: int,
                               external_tables: list[str]) -> KeyedState:
        db = self._db
        assert db is not None

        def mine(key: bytes) -> bool:
            return partition_of(key, partition_count) == partition

        internal: dict[str, dict[bytes, bytes]] = {}
        for name, key, value in db.execute("SELECT name, key, value FROM state WHERE consumer = ?", (consumer,)):
            if mine(key):
                internal.setdefault(name, {})[bytes(key)] = bytes(value)
        external: dict[str, dict[bytes, bytes]] = {table: {} for table in external_tables}
        for table in external_tables:
            for key, value in db.execute("SELECT key, row FROM external_state WHERE name = ?", (table,)):
                if mine(key):
                    external[table][bytes(key)] = bytes(value)
        timers = [(bytes(key), float(ts), str(domain)) for key, ts, domain in db.execute(
            "SELECT key, trigger_ts, domain FROM timers WHERE consumer = ? AND partition = ?", (consumer, partition))]
        row = db.execute("SELECT watermark FROM watermarks WHERE consumer = ? AND partition = ?",
                         (consumer, partition)).fetchone()
        return KeyedState(internal, external, timers, None if row is None else float(row[0]))
