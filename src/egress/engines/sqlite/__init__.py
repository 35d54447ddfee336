"""The embedded engine: one SQLite database in WAL mode, ``synchronous=FULL`` by default.

All database work runs on one thread of its own, so an fsync never stalls the event loop; the
async methods hand work to it. Each :class:`EpochCommit` is one transaction: positions, log
appends, outbox, sink progress, state and timers land together or not at all.

The log and the outbox are stored in batches: one row of ``log_batches`` holds the messages one
commit appended to one ``(stream, partition)`` (dense offsets from the row's ``offset``), one row of
``outbox_batches`` the output messages one commit added for one stream (their seqs inside), each as
one MessagePack array (``egress.rows``, which keeps ``bytes`` values exact). SQLite's cost is per
row (measured here: ~7 µs to insert a ~330-byte message row, ~3 µs a message in a batch), so a batch
of a thousand messages costs about what one message row did; a read that stops inside a batch
leaves the rest decoded for the read that continues there (:class:`BatchRests`). External state
rows stay one row per key. Directories of layout versions 1 and 2 (one row per message, rows as
JSON in version 1) are converted on open, in one transaction, and marked version 3, which an egress
of version 2 cannot read.

Leases (``leases``: owner and expiry beside ``ownership``'s generation, stored in its column
``epoch``) and cluster members
(``members``) are tables of the same database; their TTLs are measured on the engine's clock
(wall-clock seconds, so that processes sharing the database agree). With ``shared=True`` several
processes work on one state directory: each write transaction (``BEGIN IMMEDIATE``, one writer at a
time) reads the offsets it extends from the database, so nothing is cached per process: the
end-offset cache and the log tail (:class:`LogTail`) serve only an unshared engine, the directory's
The engine is :class:`SqliteEngine` (``engine.py``), one class per role on a shared connection
(``connection.py``): ``log.py`` (``Log``), ``checkpoints.py`` and ``commits.py``
(``CheckpointStore``), ``ownership.py`` (``Ownership``), ``membership.py`` (``Membership``),
``meta.py`` (metadata and inventory), ``appends.py`` (append notifications), ``retention.py`` (log
trimming); ``schema.py`` and ``upgrades.py`` are the layout, ``directory.py`` the read-only access,
``batches.py`` the decoded batches kept in memory.
"""

from egress.engines.sqlite.directory import check_metadata, read_metadata, read_outbox, read_state, state_directory
from egress.engines.sqlite.engine import SqliteEngine
from egress.engines.sqlite.schema import (
    DATABASE_NAME,
    LOCK_NAME,
    MIGRATION_BATCH,
    PAGE_SIZE,
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
)

__all__ = [
    "DATABASE_NAME",
    "LOCK_NAME",
    "MIGRATION_BATCH",
    "PAGE_SIZE",
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "SqliteEngine",
    "check_metadata",
    "read_metadata",
    "read_outbox",
    "read_state",
    "state_directory",
]
