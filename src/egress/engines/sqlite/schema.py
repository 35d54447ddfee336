"""The state directory's SQLite schema: its tables, its layout version and the names of its files."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 3
"""The state layout this egress writes. 2: log, outbox and external state rows are MessagePack;
3: the log and the outbox in batches (one row per commit and stream)."""
READABLE_SCHEMA_VERSIONS = ("1", "2", "3")
"""Layouts this egress opens: 1 stored rows as JSON, 1 and 2 one row per message; both are converted."""
PAGE_SIZE = 16384
"""SQLite's page size (bytes) for new state directories; existing ones keep theirs."""
MIGRATION_BATCH = 1024
"""Messages per batch row when a directory of layout 1 or 2 is converted."""
DATABASE_NAME = "egress.sqlite3"
FREE_SPACE_NEEDED = 32 * 1024 * 1024
"""Bytes a state directory needs free to go on, told when its filesystem is full: SQLite's
write-ahead log grows to ``wal_autocheckpoint`` (1000) pages of :data:`PAGE_SIZE` (15.6 MiB) before
a checkpoint copies them into the database file, which may grow as much."""
LOCK_NAME = "egress.lock"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ownership (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (consumer, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_batches (
    stream TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL, count INTEGER NOT NULL,
    messages BLOB NOT NULL,
    PRIMARY KEY (stream, partition, offset));
CREATE TABLE IF NOT EXISTS positions (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, stream TEXT NOT NULL,
    stream_partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (consumer, partition, stream, stream_partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox_batches (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
    stream TEXT NOT NULL, count INTEGER NOT NULL, messages BLOB NOT NULL,
    PRIMARY KEY (consumer, partition, first_seq));
CREATE TABLE IF NOT EXISTS outbox_acknowledged (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (consumer, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_progress (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, sink TEXT NOT NULL,
    producer_id TEXT NOT NULL, max_persisted_message_id BLOB, max_persisted_seq_no INTEGER NOT NULL,
    sink_state BLOB NOT NULL DEFAULT x'',
    PRIMARY KEY (consumer, partition, sink)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (
    consumer TEXT NOT NULL, name TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (consumer, name, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timers (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, key BLOB NOT NULL, trigger_ts REAL NOT NULL,
    domain TEXT NOT NULL DEFAULT 'processing',
    PRIMARY KEY (consumer, partition, domain, trigger_ts, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS external_state (
    name TEXT NOT NULL, key BLOB NOT NULL, row BLOB NOT NULL, PRIMARY KEY (name, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, owner TEXT NOT NULL, expires_at REAL,
    PRIMARY KEY (consumer, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS members (
    worker_id TEXT NOT NULL PRIMARY KEY, spec_digest TEXT NOT NULL, details TEXT NOT NULL,
    expires_at REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_traces (
    stream TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL, context TEXT NOT NULL,
    PRIMARY KEY (stream, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox_traces (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, seq INTEGER NOT NULL, context TEXT NOT NULL,
    PRIMARY KEY (consumer, partition, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watermarks (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, watermark REAL NOT NULL,
    PRIMARY KEY (consumer, partition)) WITHOUT ROWID;
"""


def table_names(db: sqlite3.Connection) -> set[str]:
    return {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
