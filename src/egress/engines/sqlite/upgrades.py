"""Conversions of state directories written by earlier layouts, applied inside the opening transaction."""

from __future__ import annotations

import sqlite3

from egress.engines.sqlite.schema import MIGRATION_BATCH, table_names
from egress.errors import StateDirectoryError
from egress.rows import decode_row, pack_batch


def upgrade_to_batches(db: sqlite3.Connection) -> None:
    """Directories of layout 1 and 2 keep one row per message in ``log`` and ``outbox`` (rows as
    JSON in layout 1): move them into batches of :data:`MIGRATION_BATCH` and drop the old tables
    (inside the caller's transaction)."""
    tables = table_names(db)
    if "log" in tables:
        for stream, partition in db.execute("SELECT DISTINCT stream, partition FROM log").fetchall():
            rows = db.execute("SELECT offset, message_id, key, event_timestamp, row FROM log WHERE stream = ? "
                              "AND partition = ? ORDER BY offset", (stream, partition))
            while chunk := rows.fetchmany(MIGRATION_BATCH):  # a batch at a time: memory stays flat
                db.execute("INSERT INTO log_batches (stream, partition, offset, count, messages) "
                           "VALUES (?, ?, ?, ?, ?)", (stream, partition, chunk[0][0], len(chunk),
                            pack_batch([(bytes(m), bytes(k), t, decode_row(r)) for _, m, k, t, r in chunk])))
        db.execute("DROP TABLE log")
    if "outbox" in tables:
        groups = db.execute("SELECT DISTINCT consumer, partition, stream FROM outbox").fetchall()
        for consumer, partition, stream in groups:
            rows = db.execute("SELECT seq, message_id, key, event_timestamp, row FROM outbox WHERE consumer = ? AND "
                              "partition = ? AND stream = ? ORDER BY seq", (consumer, partition, stream))
            while stored := rows.fetchmany(MIGRATION_BATCH):
                chunk = [(int(q), bytes(m), bytes(k), t, decode_row(r)) for q, m, k, t, r in stored]
                db.execute("INSERT INTO outbox_batches (consumer, partition, first_seq, last_seq, stream, count, "
                           "messages) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (consumer, partition, chunk[0][0], chunk[-1][0], stream, len(chunk), pack_batch(chunk)))
        db.execute("DROP TABLE outbox")



def upgrade_timers(db: sqlite3.Connection) -> None:
    """Directories made before timers existed have an empty ``timers`` table without ``domain``:
    replace it (it was never written, so nothing is lost)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(timers)")]
    if columns and "domain" not in columns:
        (count,) = db.execute("SELECT COUNT(*) FROM timers").fetchone()
        if count:
            raise StateDirectoryError("the timers table has rows but no domain column; this state directory "
                                      "was written by an unknown egress version")
        db.execute("DROP TABLE timers")


def upgrade_sink_progress(db: sqlite3.Connection) -> None:
    """Directories made before sinks had committed state lack ``sink_progress.sink_state``: add it,
    empty (no sink then kept any)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(sink_progress)")]
    if columns and "sink_state" not in columns:
        db.execute("ALTER TABLE sink_progress ADD COLUMN sink_state BLOB NOT NULL DEFAULT x''")

