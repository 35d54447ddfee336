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
one writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from egress.clock import Clock, RealClock
from egress.engines.protocols import (
    AppendsCallback,
    Checkpoint,
    CommittedInventory,
    EpochCommit,
    FencedError,
    KeyedState,
    LeaseInfo,
    LogMessage,
    MemberInfo,
    OutboxMessage,
    SinkProgress,
    StateLocation,
)
from egress.engines.storage_errors import storage_error
from egress.errors import RowEncodingError, SpecMismatchError, StateDirectoryError
from egress.keys import partition_of
from egress.rows import decode_row, first_unstorable_row_error, pack_batch, unpack_batch

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
APPENDS_POLL_INTERVAL = 0.05
"""Seconds between two ``PRAGMA data_version`` looks of a shared engine with an appends callback."""
SHARED_BUSY_TIMEOUT = 60.0
"""Seconds a shared engine's transaction waits for another process's write transaction to end."""
_RELEASED = -math.inf
"""``leases.expires_at`` of a released lease: lapsed whatever the clock says."""

logger = logging.getLogger(__name__)

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS watermarks (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, watermark REAL NOT NULL,
    PRIMARY KEY (consumer, partition)) WITHOUT ROWID;
"""

T = TypeVar("T")
_new_tuple = tuple.__new__

TAIL_BYTES = 16 * 1024 * 1024
"""How many bytes of just-committed log batches an engine keeps for readers in the same process
(:class:`LogTail`): a downstream job reads them without a SELECT (16 MiB: ~50,000 messages of
~330 bytes, a few epochs of every partition)."""
RESTS_MESSAGES = 16384
"""How many decoded log messages an engine keeps for reads that continue inside a batch an earlier
read stopped in (:class:`BatchRests`): epochs of a few hundred messages read batches of a
thousand (a source chunk of 4,096 over 4 partitions), which were otherwise decoded once per read."""


class SqliteEngine:
    """``Log``, ``CheckpointStore``, ``Ownership`` and ``Membership`` on one SQLite file in ``state_dir``.

    ``open()`` creates the directory and schema, takes an exclusive lock on the directory (a
    second process gets :class:`StateDirectoryError` naming the first's pid) and checks that the
    directory belongs to ``pipeline``. ``synchronous`` is SQLite's setting (``FULL`` survives a
    power loss; ``NORMAL`` only a process crash). ``clock`` (default :class:`RealClock`) measures
    lease and member TTLs (its ``now()``, wall-clock seconds).

    ``shared=True`` is for one of several processes on one state directory (``egress run
    --processes N``: the parent holds the directory's lock, each child opens a shared engine): it
    takes no lock, reads each log partition's end offset inside the transaction that appends to it
    (SQLite lets one write transaction run at a time, waiting up to :data:`SHARED_BUSY_TIMEOUT`
    seconds for another's), and calls :meth:`on_appends` callbacks for the other processes' log
    appends.
    """

    def __init__(self, state_dir: str | Path, pipeline: str, *, synchronous: str = "FULL",
                 clock: Clock | None = None, shared: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.pipeline = pipeline
        self.synchronous = synchronous
        self.shared = shared
        self._clock = clock if clock is not None else RealClock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="egress-sqlite")
        self._db: sqlite3.Connection | None = None
        self._lock_file: Any = None
        # Unshared only (the directory's one writer): the ends it wrote, and what it appended last,
        # stay true. Shared, another process may append next, so the database is asked every time.
        self._end_offsets: dict[tuple[str, int], int] = {}
        self._tail = LogTail(TAIL_BYTES)
        self._rests = BatchRests(RESTS_MESSAGES)
        self._appends_callbacks: list[AppendsCallback] = []
        self._appends_watch: _AppendsWatch | None = None
        self._appends_poller: asyncio.Task[None] | None = None
        self._queue_lock = threading.Lock()
        self._queued: list[tuple[EpochCommit, asyncio.Future[None]]] = []
        self._draining = False

    @property
    def location(self) -> StateLocation:
        return state_directory(self.state_dir)

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self._call(self._open_sync)
        if self._appends_callbacks:
            self._start_appends_poller()

    async def close(self) -> None:
        poller, self._appends_poller = self._appends_poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if self._db is not None:
            await self._call(self._close_sync)
        self._executor.shutdown(wait=True)

    def _enter_wal(self, db: sqlite3.Connection) -> None:
        """``PRAGMA journal_mode=WAL``. In shared mode another process or pipeline opening or writing
        the same directory can hold the lock the pragma needs, and SQLite may then answer ``database
        is locked`` without waiting out its busy timeout: the pragma is asked again every 50 ms for
        up to ``SHARED_BUSY_TIMEOUT`` seconds, so that workers starting together all start."""
        attempts = int(SHARED_BUSY_TIMEOUT / 0.05) if self.shared else 1
        for attempt in range(attempts):
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or attempt == attempts - 1:
                    raise
                threading.Event().wait(0.05)  # in the engine's own thread, before the engine is open

    def _open_sync(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self.shared:
            self._lock_directory()
        db = sqlite3.connect(self.state_dir / DATABASE_NAME, isolation_level=None, check_same_thread=False,
                             timeout=SHARED_BUSY_TIMEOUT if self.shared else 5.0)
        # Only a new database takes it (before its first table; WAL fixes it): batches of
        # thousands of ~330-byte messages span fewer pages and overflow chains (measured: ~10 %
        # less engine CPU per message than 4 KiB pages, and less than 64 KiB, whose small updates
        # of positions and progress each rewrite a large page).
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        self._enter_wal(db)
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        # Debian's SQLite is built with SECURE_DELETE, which zeroes every page a DELETE frees and
        # so writes each acknowledged outbox batch a second time (its pages of zeros, ~15 % of the
        # write-ahead log's frames). FAST still clears deleted cells inside table pages; freed
        # overflow pages keep their bytes until a later commit reuses them, as the log keeps the
        # same messages until it is trimmed.
        db.execute("PRAGMA secure_delete=FAST")
        self._db = db
        with self._transaction():  # one at a time: processes sharing the directory may open together
            _upgrade_timers(db)
            _upgrade_sink_progress(db)
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("pipeline", self.pipeline), ("schema_version", str(SCHEMA_VERSION))],
                )
            else:
                check_metadata(meta, self.state_dir, self.pipeline)
                if meta.get("schema_version") != str(SCHEMA_VERSION):
                    # from now on it holds batches, which older versions cannot read
                    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            if {"log", "outbox"} & _tables(db):  # layout 1 or 2 (checked above): converted in this transaction
                _upgrade_to_batches(db)

    def _lock_directory(self) -> None:
        """Take the state directory's exclusive lock, or raise naming the pid that holds it."""
        self._lock_file = open(self.state_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held until close
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "another process"
            self._lock_file.close()
            self._lock_file = None
            raise StateDirectoryError(
                f"{self.state_dir}: the state directory is in use by pid {holder}; "
                "stop that egress run or choose another --state-dir"
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def _close_sync(self) -> None:
        assert self._db is not None
        self._tail = LogTail(TAIL_BYTES)
        self._rests.clear()
        self._db.close()
        self._db = None
        if self._lock_file is not None:
            self._lock_file.close()

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        except Exception as error:
            mapped = self._storage_error(error)
            if mapped is error:
                raise
            raise mapped from error

    def _storage_error(self, error: BaseException) -> BaseException:
        """``error`` as the one to raise: a full filesystem as StateDirectoryFullError (storage_errors)."""
        return storage_error(error, self.state_dir, FREE_SPACE_NEEDED)

    async def _read_call(self, function: Callable[..., T], *args: Any) -> T:
        """:meth:`_call` for a read of several statements: shared, they read one snapshot (a read
        transaction, which in WAL mode never blocks a writer), not what other processes committed
        between them."""
        if not self.shared:
            return await self._call(function, *args)
        return await self._call(self._in_snapshot, function, *args)

    def _in_snapshot(self, function: Callable[..., T], *args: Any) -> T:
        assert self._db is not None
        self._db.execute("BEGIN")
        try:
            return function(*args)
        finally:
            self._db.execute("COMMIT")

    def _transaction(self) -> _Transaction:
        assert self._db is not None
        return _Transaction(self._db)

    # -- metadata and inventory --------------------------------------------------------------

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
            waiting = int(n) if first > low else sum(1 for seq, *_ in unpack_batch(db.execute(
                "SELECT messages FROM outbox_batches WHERE consumer = ? AND partition = ? AND first_seq = ?",
                (c, p, first)).fetchone()[0]) if seq > low)
            if waiting:
                outbox[(str(c), int(p), str(s))] = outbox.get((str(c), int(p), str(s)), 0) + waiting
        timers = {(str(c), int(p)): int(n) for c, p, n in db.execute(
            "SELECT consumer, partition, COUNT(*) FROM timers GROUP BY consumer, partition")}
        return CommittedInventory(log_ends, read_positions, outbox, timers)

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

    # -- Ownership ---------------------------------------------------------------------------

    async def acquire(self, consumer: str, partition: int) -> int:
        return await self._call(self._acquire_sync, consumer, partition)

    def _acquire_sync(self, consumer: str, partition: int) -> int:
        assert self._db is not None
        with self._transaction():
            generation = self._next_generation_sync(consumer, partition)
            self._write_lease_sync(consumer, partition, "", None)
        return generation

    def _next_generation_sync(self, consumer: str, partition: int) -> int:
        """Raise the generation of ``(consumer, partition)`` (inside a write transaction) and return it."""
        assert self._db is not None
        self._db.execute(
            "INSERT INTO ownership (consumer, partition, epoch) VALUES (?, ?, 1) "
            "ON CONFLICT (consumer, partition) DO UPDATE SET epoch = epoch + 1",
            (consumer, partition),
        )
        (generation,) = self._db.execute(
            "SELECT epoch FROM ownership WHERE consumer = ? AND partition = ?", (consumer, partition)
        ).fetchone()
        return int(generation)

    def _write_lease_sync(self, consumer: str, partition: int, owner: str, expires_at: float | None) -> None:
        assert self._db is not None
        self._db.execute(
            "INSERT INTO leases (consumer, partition, owner, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at",
            (consumer, partition, owner, expires_at),
        )

    def _held_sync(self, consumer: str, partition: int) -> tuple[int, str, float | None] | None:
        """``(generation, owner, expires_at)`` of the live lease of ``(consumer, partition)``, ``None``
        when it is lapsed, released or was never taken. Directories of earlier versions have
        generations without a lease row: those never lapse, like :meth:`acquire`'s."""
        assert self._db is not None
        row = self._db.execute(
            "SELECT o.epoch, l.owner, l.expires_at, l.consumer IS NOT NULL FROM ownership o LEFT JOIN leases l "
            "ON l.consumer = o.consumer AND l.partition = o.partition WHERE o.consumer = ? AND o.partition = ?",
            (consumer, partition),
        ).fetchone()
        if row is None:
            return None
        generation, owner, expires_at, has_lease = row
        if has_lease and expires_at is not None and float(expires_at) <= self._clock.now():
            return None
        return int(generation), str(owner or ""), None if expires_at is None else float(expires_at)

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """Take the lease of ``(consumer, partition)`` for ``owner`` until ``ttl`` seconds from now
        on the engine's clock, unless another owner's lease is live (then ``None``). A lease taken
        by :meth:`acquire` names no owner and never lapses: this takes it over (it was a
        single-process run's, which holds the state directory's lock while it runs)."""
        return await self._call(self._try_acquire_sync, consumer, partition, owner, ttl)

    def _try_acquire_sync(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is not None and held[1] not in ("", owner):
                return None
            generation = self._next_generation_sync(consumer, partition)
            self._write_lease_sync(consumer, partition, owner, self._clock.now() + ttl)
        return generation

    async def renew(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        """Make the lease held at ``generation`` lapse ``ttl`` seconds from now; ``False`` when it is not
        held at ``generation`` (lapsed, released or taken). Runs on the engine's one thread, between
        commits, so it never fails one."""
        return await self._call(self._renew_sync, consumer, partition, generation, ttl)

    def _renew_sync(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        assert self._db is not None
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is None or held[0] != generation:
                return False
            self._write_lease_sync(consumer, partition, held[1], self._clock.now() + ttl)
        return True

    async def release(self, consumer: str, partition: int, generation: int) -> None:
        """Let the lease held at ``generation`` lapse now (a no-op when it is not held at ``generation``):
        another owner may take it at once, and commits of ``generation`` are fenced."""
        await self._call(self._release_sync, consumer, partition, generation)

    def _release_sync(self, consumer: str, partition: int, generation: int) -> None:
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is not None and held[0] == generation:
                self._write_lease_sync(consumer, partition, held[1], _RELEASED)

    async def leases(self) -> list[LeaseInfo]:
        """The live leases (those :meth:`acquire` took included, with ``expires_in=None``), sorted
        by ``(consumer, partition)``."""
        return await self._call(self._leases_sync)

    def _leases_sync(self) -> list[LeaseInfo]:
        assert self._db is not None
        now = self._clock.now()
        rows = self._db.execute(
            "SELECT o.consumer, o.partition, l.owner, o.epoch, l.expires_at FROM ownership o LEFT JOIN leases l "
            "ON l.consumer = o.consumer AND l.partition = o.partition "
            "WHERE l.expires_at IS NULL OR l.expires_at > ? ORDER BY o.consumer, o.partition", (now,)).fetchall()
        return [LeaseInfo(str(c), int(p), str(owner or ""), int(generation), None if at is None else float(at) - now)
                for c, p, owner, generation, at in rows]

    # -- Membership --------------------------------------------------------------------------

    async def register(self, member: MemberInfo, ttl: float) -> None:
        """List ``member`` until ``ttl`` seconds from now on the engine's clock (replacing what its
        worker id registered before). ``details`` must be JSON-serialisable."""
        await self._call(self._register_sync, member, ttl)

    def _register_sync(self, member: MemberInfo, ttl: float) -> None:
        assert self._db is not None
        details = json.dumps(member.details, sort_keys=True)
        now = self._clock.now()
        with self._transaction():
            self._db.execute("DELETE FROM members WHERE expires_at <= ?", (now,))
            self._db.execute(
                "INSERT INTO members (worker_id, spec_digest, details, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET spec_digest = excluded.spec_digest, details = excluded.details, "
                "expires_at = excluded.expires_at", (member.worker_id, member.spec_digest, details, now + ttl))

    async def deregister(self, worker_id: str) -> None:
        await self._call(self._deregister_sync, worker_id)

    def _deregister_sync(self, worker_id: str) -> None:
        assert self._db is not None
        with self._transaction():
            self._db.execute("DELETE FROM members WHERE worker_id = ?", (worker_id,))

    async def members(self) -> list[MemberInfo]:
        return await self._call(self._members_sync)

    def _members_sync(self) -> list[MemberInfo]:
        assert self._db is not None
        rows = self._db.execute("SELECT worker_id, spec_digest, details FROM members WHERE expires_at > ? "
                                "ORDER BY worker_id", (self._clock.now(),)).fetchall()
        return [MemberInfo(str(w), str(d), json.loads(details)) for w, d, details in rows]

    # -- append notifications ----------------------------------------------------------------

    def on_appends(self, callback: AppendsCallback) -> None:
        """Call ``callback`` with the ``(stream, partition)`` slots other processes appended to.
        Only a shared engine has other processes' appends to tell: it then looks every
        :data:`APPENDS_POLL_INTERVAL` seconds whether the database changed (``PRAGMA data_version``,
        which changes with another connection's commit), and if so which log partitions grew.
        Unshared, a no-op."""
        if not self.shared:
            return
        self._appends_callbacks.append(callback)
        if self._db is not None:
            self._start_appends_poller()

    def _start_appends_poller(self) -> None:
        if self._appends_poller is None:
            self._appends_poller = asyncio.get_running_loop().create_task(self._poll_appends())

    async def _poll_appends(self) -> None:
        while True:
            grown = await self._read_call(self._grown_sync)
            if grown:
                for callback in list(self._appends_callbacks):
                    try:
                        callback(grown)
                    except Exception:  # one callback's failure must not end the notifications
                        logger.exception("an on_appends callback failed")
            await self._clock.sleep(APPENDS_POLL_INTERVAL)

    def _grown_sync(self) -> set[tuple[str, int]]:
        """The log partitions other processes appended to since the last look."""
        db = self._db
        assert db is not None
        (version,) = db.execute("PRAGMA data_version").fetchone()
        watch = self._appends_watch
        if watch is None:
            self._appends_watch = _AppendsWatch(int(version), self._log_ends_sync())
            return set()
        grown, watch.grown = watch.grown, set()
        if int(version) != watch.data_version:
            watch.data_version = int(version)
            ends = self._log_ends_sync()
            grown |= {slot for slot, end in ends.items() if end > watch.ends.get(slot, 0)}
            watch.ends = ends
        return grown

    # -- Log ---------------------------------------------------------------------------------

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
        messages = _entry_messages(stream, partition, after, rest[:limit])
        if len(rest) > limit:
            self._rests.keep(stream, partition, after + limit, rest[limit:])
            return messages
        if len(messages) < limit:
            messages.extend(self._read_stored(stream, partition, after + len(messages), limit - len(messages)))
        return messages

    def _read_stored(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        """:meth:`read` from the stored batches (the tail's or the database's)."""
        # What this process committed last is decoded from memory, without a SELECT; the tail is
        # used only when it reaches the durable end offset (else it may miss messages), and only
        # unshared (a shared engine keeps neither the tail nor the end offsets).
        kept = None if self.shared else self._tail.batches(
            stream, partition, after, self._end_offsets.get((stream, partition)))
        if kept is not None:
            return _messages(stream, partition, after, after + limit, kept, self._rests)
        db = self._db
        assert db is not None
        first = db.execute(
            "SELECT offset FROM log_batches WHERE stream = ? AND partition = ? AND offset <= ? "
            "ORDER BY offset DESC LIMIT 1", (stream, partition, after)).fetchone()
        batches = db.execute(
            "SELECT offset, messages FROM log_batches WHERE stream = ? AND partition = ? AND offset >= ? "
            "AND offset < ? AND offset + count > ? ORDER BY offset",
            (stream, partition, after if first is None else first[0], after + limit, after))
        return _messages(stream, partition, after, after + limit, batches, self._rests)

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

    # -- CheckpointStore ---------------------------------------------------------------------

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
        return await self._read_call(self._load_checkpoint_sync, consumer, partition, sinks)

    def _load_checkpoint_sync(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
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
        outbox = sorted(
            (OutboxMessage(seq, stream, *entry)
             for stream, blob in self._db.execute(
                 "SELECT stream, messages FROM outbox_batches WHERE consumer = ? AND partition = ? AND last_seq > ?",
                 (consumer, partition, low))
             for seq, *entry in unpack_batch(blob) if seq > low),
            key=lambda message: message.seq)
        (last_seq,) = self._db.execute(
            "SELECT MAX(last_seq) FROM outbox_batches WHERE consumer = ? AND partition = ?", (consumer, partition)
        ).fetchone()
        high = max([int(last_seq or 0), *(p.max_persisted_seq_no for p in progress.values())])
        return Checkpoint(positions, progress, outbox, high + 1)

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

    async def commit(self, commit: EpochCommit) -> None:
        # Group commit: commits that queue while the database thread is busy (several partition
        # jobs and source readers finishing epochs together) are applied in one transaction, each
        # inside its own savepoint with its own fence check, and made durable by one fsync.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._queue_lock:
            self._queued.append((commit, done))
            start, self._draining = not self._draining, True
        if start:
            self._executor.submit(self._drain, loop)
        await done

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the database thread: apply queued commits, a group at a time, until none is queued."""
        while True:
            with self._queue_lock:
                group, self._queued = self._queued, []
                if not group:
                    self._draining = False
                    return
            try:
                outcomes = self._commit_group_sync([commit for commit, _ in group])
            except BaseException as error:  # every committer must hear of it, none may hang
                outcomes = [self._storage_error(error)] * len(group)
            loop.call_soon_threadsafe(_settle, [done for _, done in group], outcomes)

    def _commit_group_sync(self, commits: list[EpochCommit]) -> list[BaseException | None]:
        """Apply ``commits`` in one transaction; each one's outcome (``None``: applied). A commit
        refused on its own (stale generation, unstorable row) is rolled back to its savepoint alone."""
        if len(commits) == 1:
            return [self._commit_alone(commits[0])]
        db = self._db
        assert db is not None
        outcomes: list[BaseException | None] = []
        offsets: dict[tuple[str, int], int] = {}
        applied: list[tuple[str, int, int, int, bytes]] = []
        try:
            with self._transaction():
                for commit in commits:
                    db.execute("SAVEPOINT epoch_commit")
                    try:
                        appended, records = self._apply(commit, offsets)
                    except (FencedError, RowEncodingError) as refused:
                        db.execute("ROLLBACK TO epoch_commit")
                        outcomes.append(refused)
                    else:
                        offsets.update(appended)
                        applied.extend(records)
                        outcomes.append(None)
                    db.execute("RELEASE epoch_commit")
        except Exception:  # not one commit's refusal (e.g. the disk): each alone, with its own outcome
            return [self._commit_alone(commit) for commit in commits]
        self._published(offsets, applied)
        return outcomes

    def _commit_alone(self, commit: EpochCommit) -> BaseException | None:
        try:
            self._commit_sync(commit)
        except Exception as error:  # handed to the committer's future
            return self._storage_error(error)
        return None

    def _commit_sync(self, commit: EpochCommit) -> None:
        with self._transaction():
            appended, records = self._apply(commit, {})
        self._published(appended, records)

    def _published(self, appended: dict[tuple[str, int], int], records: list[tuple[str, int, int, int, bytes]]) -> None:
        """After a transaction is durable (``appended``: each slot's new end; ``records``: the log
        batches stored, in the order written). Unshared, its end offsets and log batches become
        visible to readers in this process. Shared, neither is kept (another process may append
        next); the appends watch counts the slots and start offsets appended as this process's own."""
        if self.shared:
            if self._appends_watch is not None:
                starts: dict[tuple[str, int], int] = {}
                for stream, partition, offset, _, _ in records:
                    starts.setdefault((stream, partition), offset)  # a group's commits continue each other
                self._appends_watch.own(starts, appended)
            return
        for record in records:
            self._tail.add(*record)
        self._end_offsets.update(appended)

    def _apply(self, commit: EpochCommit, offsets: dict[tuple[str, int], int]
               ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int, int, int, bytes]]]:
        """Write ``commit`` inside the open transaction, after its fence check (:class:`FencedError`
        unless its lease is live at its generation). Log appends continue ``offsets`` (the ends earlier
        commits of the same transaction reached) or the durable end offsets; shared, always the
        ends the database holds inside this transaction. Returns the new end offsets and the log
        batches stored, ``(stream, partition, offset, count, messages)``."""
        db = self._db
        assert db is not None
        c, p = commit.consumer, commit.partition
        appended: dict[tuple[str, int], int] = {}
        records: list[tuple[str, int, int, int, bytes]] = []
        held = self._held_sync(c, p)  # the fence: the lease live and still at this commit's generation
        if held is None or held[0] != commit.generation:
            now = "lapsed or released" if held is None else f"now {held[0]}"
            raise FencedError(f"{c} partition {p}: generation {commit.generation} is stale ({now})")
        db.executemany(
            "INSERT INTO positions (consumer, partition, stream, stream_partition, offset) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET offset = excluded.offset",
            [(c, p, s, sp, off) for (s, sp), off in commit.input_positions.items()],
        )
        if commit.log_appends:
            batches: dict[tuple[str, int], list[tuple[bytes, bytes, float | None, dict[str, Any]]]] = {}
            for stream, partition, message_id, key, ts, values in commit.log_appends:
                batch = batches.get((stream, partition))
                if batch is None:
                    batch = batches[(stream, partition)] = []
                batch.append((message_id, key, ts, values))
            try:
                for (stream, partition), batch in batches.items():
                    # Shared, from the database inside this write transaction (which holds what
                    # earlier commits of the group wrote), never from what this process carried.
                    offset = None if self.shared else offsets.get((stream, partition))
                    if offset is None:
                        offset = self._end_offset_sync(stream, partition)
                    appended[(stream, partition)] = offset + len(batch)
                    records.append((stream, partition, offset, len(batch), pack_batch(batch)))
            except TypeError:
                raise first_unstorable_row_error(commit.origin, commit.log_rows()) from None
            db.executemany(
                "INSERT INTO log_batches (stream, partition, offset, count, messages) VALUES (?, ?, ?, ?, ?)",
                records)
        if commit.outbox:
            try:
                outbox = [(c, p, batch[0][0], batch[-1][0], stream, len(batch), pack_batch(batch))
                          for stream, batch in _outbox_batches(commit.outbox).items()]
            except TypeError:
                raise first_unstorable_row_error(commit.origin, commit.outbox_rows()) from None
            db.executemany(
                "INSERT INTO outbox_batches (consumer, partition, first_seq, last_seq, stream, count, messages) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", outbox)
        db.executemany(
            "INSERT INTO sink_progress (consumer, partition, sink, producer_id, max_persisted_message_id, "
            "max_persisted_seq_no, sink_state) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "producer_id = excluded.producer_id, max_persisted_message_id = excluded.max_persisted_message_id, "
            "max_persisted_seq_no = excluded.max_persisted_seq_no, sink_state = excluded.sink_state",
            [(c, p, sink, s.producer_id, s.max_persisted_message_id, s.max_persisted_seq_no, s.sink_state)
             for sink, s in commit.sink_progress.items()],
        )
        if commit.outbox_acknowledged_seq is not None:
            acknowledged = commit.outbox_acknowledged_seq
            db.execute("DELETE FROM outbox_batches WHERE consumer = ? AND partition = ? AND first_seq <= ? "
                       "AND last_seq <= ?", (c, p, acknowledged, acknowledged))
            db.execute("INSERT INTO outbox_acknowledged (consumer, partition, seq) VALUES (?, ?, ?) "
                       "ON CONFLICT DO UPDATE SET seq = excluded.seq", (c, p, acknowledged))
        if commit.state_writes:
            db.executemany("DELETE FROM state WHERE consumer = ? AND name = ? AND key = ?",
                           [(c, name, key) for (name, key), value in commit.state_writes.items() if value is None])
            db.executemany(
                "INSERT INTO state (consumer, name, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [(c, name, key, value) for (name, key), value in commit.state_writes.items() if value is not None],
            )
        if commit.external_state_writes:
            writes = commit.external_state_writes.items()
            db.executemany("DELETE FROM external_state WHERE name = ? AND key = ?",
                           [(name, key) for (name, key), value in writes if value is None])
            db.executemany(
                "INSERT INTO external_state (name, key, row) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET row = excluded.row",
                [(name, key, value) for (name, key), value in writes if value is not None],
            )
        if commit.timers_deleted:
            db.executemany(
                "DELETE FROM timers WHERE consumer = ? AND partition = ? AND key = ? AND trigger_ts = ? AND domain = ?",
                [(c, p, key, ts, _domain(rest)) for key, ts, *rest in commit.timers_deleted],
            )
        if commit.timers_set:
            db.executemany(
                "INSERT OR IGNORE INTO timers (consumer, partition, key, trigger_ts, domain) VALUES (?, ?, ?, ?, ?)",
                [(c, p, key, ts, _domain(rest)) for key, ts, *rest in commit.timers_set],
            )
        if commit.watermark is not None:
            db.execute(
                "INSERT INTO watermarks (consumer, partition, watermark) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET watermark = excluded.watermark",
                (c, p, commit.watermark),
            )
        return appended, records

    # -- Log retention (called by egress.runtime.retention) ---------------------------------

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
                    deleted += db.execute(
                        "DELETE FROM log_batches WHERE stream = ? AND partition = ? AND offset < ? "
                        "AND offset + count <= ? AND offset + count < ?",
                        (stream, partition, int(low) - keep, int(low) - keep, end)).rowcount
        return deleted


def _settle(futures: list[asyncio.Future[None]], outcomes: list[BaseException | None]) -> None:
    """On the event loop: tell each committer its commit's outcome (unless it stopped waiting)."""
    for future, outcome in zip(futures, outcomes, strict=True):
        if future.done():
            continue
        if outcome is None:
            future.set_result(None)
        else:
            future.set_exception(outcome)


def _messages(stream: str, partition: int, after: int, end: int,
              batches: Iterable[tuple[int, bytes]], rests: BatchRests) -> list[LogMessage]:
    """The messages with offsets ``after`` .. ``end - 1`` of stored ``(offset, messages)`` batches
    (in offset order, the first one holding ``after`` or later). When ``end`` falls inside a batch,
    the rest of it, decoded, goes to ``rests`` (the next read from ``end`` starts with it)."""
    messages: list[LogMessage] = []
    for offset, blob in batches:
        if offset >= end:
            break
        start = max(0, after - offset)
        entries = unpack_batch(blob)
        messages.extend(_entry_messages(stream, partition, offset + start, entries[start:end - offset]))
        if len(entries) > end - offset:
            rests.keep(stream, partition, end, entries[end - offset:])
    return messages


def _entry_messages(stream: str, partition: int, first: int, entries: list[list[Any]]) -> list[LogMessage]:
    """Decoded batch entries ``[message id, key, event timestamp, row]`` as the log messages at
    offsets ``first``, ``first + 1``, ..."""
    # tuple.__new__: a LogMessage without the NamedTuple's Python-level __new__ (per message read)
    return [_new_tuple(LogMessage, (stream, partition, index, message_id, key, ts, row))
            for index, (message_id, key, ts, row) in enumerate(entries, first)]


class BatchRests:
    """The decoded rests of log batches that reads stopped inside, by ``(stream, partition, offset
    of the first message left)``: entries ``[message id, key, event timestamp, row]`` as
    :data:`~egress.rows.unpack_batch` returned them. No message of a rest was handed to a reader,
    so each read still gets rows of its own. At most ``limit_messages`` messages are kept, the
    oldest rest dropped first; a rest is taken once. Log batches never change once committed
    (trimming deletes only batches every reader is past, and :meth:`clear` follows it), so a rest
    stays true. Used on the engine's database thread only."""

    def __init__(self, limit_messages: int) -> None:
        self._limit = limit_messages
        self._rests: dict[tuple[str, int, int], list[list[Any]]] = {}
        self.messages = 0

    def keep(self, stream: str, partition: int, offset: int, entries: list[list[Any]]) -> None:
        """Keep ``entries``, the messages of ``(stream, partition)`` from ``offset`` on."""
        self.take(stream, partition, offset)
        self._rests[(stream, partition, offset)] = entries
        self.messages += len(entries)
        while self.messages > self._limit:
            self.messages -= len(self._rests.pop(next(iter(self._rests))))

    def take(self, stream: str, partition: int, offset: int) -> list[list[Any]] | None:
        """The rest that starts at ``offset`` of ``(stream, partition)`` (removed), ``None`` if none is kept."""
        rest = self._rests.pop((stream, partition, offset), None)
        if rest is not None:
            self.messages -= len(rest)
        return rest

    def clear(self) -> None:
        self._rests.clear()
        self.messages = 0


class LogTail:
    """The log batches this process committed last, as stored (MessagePack bytes, so every read
    decodes its own rows: one reader's changes to a row never reach another), at most
    ``limit_bytes`` of them, the oldest dropped first. Per ``(stream, partition)`` the batches are
    contiguous and end where that slot's last commit in this process ended. Used on the engine's
    database thread only."""

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._slots: dict[tuple[str, int], deque[tuple[int, int, bytes]]] = {}
        self._order: deque[tuple[tuple[str, int], int]] = deque()  # (slot, offset) of every batch, oldest first
        self.bytes = 0

    def add(self, stream: str, partition: int, offset: int, count: int, blob: bytes) -> None:
        """Keep the batch of ``count`` messages from ``offset`` just committed to ``(stream, partition)``."""
        slot = (stream, partition)
        batches = self._slots.get(slot)
        if batches and batches[-1][0] + batches[-1][1] != offset:  # a gap: another writer appended
            self.bytes -= sum(len(b) for _, _, b in batches)
            batches = None
        if batches is None:
            batches = self._slots[slot] = deque()
        batches.append((offset, count, blob))
        self._order.append((slot, offset))
        self.bytes += len(blob)
        while self.bytes > self._limit and self._order:
            oldest, at = self._order.popleft()
            kept = self._slots.get(oldest)
            if kept and kept[0][0] == at:
                self.bytes -= len(kept.popleft()[2])

    def batches(self, stream: str, partition: int, after: int, end: int | None) -> list[tuple[int, bytes]] | None:
        """``(offset, messages)`` of the kept batches from the one holding ``after`` on, or ``None``
        when the tail cannot answer: ``after`` is older than what is kept, or the kept batches do not
        reach ``end`` (the slot's durable end offset; ``None``: unknown)."""
        kept = self._slots.get((stream, partition))
        if not kept or end is None or after < kept[0][0] or kept[-1][0] + kept[-1][1] != end:
            return None
        return [(offset, blob) for offset, count, blob in kept if offset + count > after]


def _outbox_batches(messages: list[OutboxMessage]) -> dict[str, list[tuple[Any, ...]]]:
    """A commit's outbox as one batch per stream, in seq order: ``(seq, message id, key, event
    timestamp, row)`` each."""
    batches: dict[str, list[tuple[Any, ...]]] = {}
    for seq, stream, message_id, key, ts, row in messages:
        batch = batches.get(stream)
        if batch is None:
            batch = batches[stream] = []
        batch.append((seq, message_id, key, ts, row))
    return batches


def _upgrade_to_batches(db: sqlite3.Connection) -> None:
    """Directories of layout 1 and 2 keep one row per message in ``log`` and ``outbox`` (rows as
    JSON in layout 1): move them into batches of :data:`MIGRATION_BATCH` and drop the old tables
    (inside the caller's transaction)."""
    tables = _tables(db)
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


def _domain(rest: list[str]) -> str:
    """A timer's domain; ``(key, trigger)`` pairs (the first form of the hook) mean processing time."""
    return rest[0] if rest else "processing"


def _upgrade_timers(db: sqlite3.Connection) -> None:
    """Directories made before timers existed have an empty ``timers`` table without ``domain``:
    replace it (it was never written, so nothing is lost)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(timers)")]
    if columns and "domain" not in columns:
        (count,) = db.execute("SELECT COUNT(*) FROM timers").fetchone()
        if count:
            raise StateDirectoryError("the timers table has rows but no domain column; this state directory "
                                      "was written by an unknown egress version")
        db.execute("DROP TABLE timers")


def _upgrade_sink_progress(db: sqlite3.Connection) -> None:
    """Directories made before sinks had committed state lack ``sink_progress.sink_state``: add it,
    empty (no sink then kept any)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(sink_progress)")]
    if columns and "sink_state" not in columns:
        db.execute("ALTER TABLE sink_progress ADD COLUMN sink_state BLOB NOT NULL DEFAULT x''")


def read_state(state_dir: str | Path) -> dict[str, list[tuple[str, str, bytes, bytes]]]:
    """Read a state directory without taking it over (read-only, safe while a run holds it).

    Returns ``{"internal": [(consumer, state name, encoded key, value bytes)], "external":
    [("", table, encoded key, row bytes)]}`` sorted by name and key. Raises
    :class:`StateDirectoryError` when ``state_dir`` holds no egress state.
    """
    db = _connect_read_only(state_dir)
    if db is None:
        raise StateDirectoryError(f"{state_dir}: no egress state here (no {DATABASE_NAME})")
    try:
        tables = _tables(db)
        internal = [(str(c), str(n), bytes(k), bytes(v)) for c, n, k, v in db.execute(
            "SELECT consumer, name, key, value FROM state ORDER BY consumer, name, key")] if "state" in tables else []
        external = [("", str(n), bytes(k), bytes(v)) for n, k, v in db.execute(
            "SELECT name, key, row FROM external_state ORDER BY name, key")] if "external_state" in tables else []
    finally:
        db.close()
    return {"internal": internal, "external": external}


def read_outbox(state_dir: str | Path) -> list[tuple[str, int, OutboxMessage]]:
    """Every stored outbox message of a state directory as ``(consumer, partition, message)``, sorted
    by consumer, partition and seq, read without taking it over (read-only, safe while a run holds it
    or after it was killed). Messages a commit trimmed but whose batch is still stored are left out.
    Raises :class:`StateDirectoryError` when ``state_dir`` holds no egress state."""
    db = _connect_read_only(state_dir)
    if db is None:
        raise StateDirectoryError(f"{state_dir}: no egress state here (no {DATABASE_NAME})")
    try:
        trimmed = {(str(c), int(p)): int(seq) for c, p, seq in db.execute(
            "SELECT consumer, partition, seq FROM outbox_acknowledged")}
        batches = db.execute("SELECT consumer, partition, stream, messages FROM outbox_batches")
        found = [(str(c), int(p), OutboxMessage(seq, str(stream), *entry))
                 for c, p, stream, blob in batches
                 for seq, *entry in unpack_batch(blob) if seq > trimmed.get((str(c), int(p)), 0)]
    finally:
        db.close()
    return sorted(found, key=lambda item: (item[0], item[1], item[2].seq))


def state_directory(state_dir: str | Path) -> StateLocation:
    """The :class:`StateLocation` of a state directory: a Spec starts over in another one."""
    return StateLocation(f"state directory {state_dir}", "give this Spec another --state-dir")


def check_metadata(meta: dict[str, str], state_dir: str | Path, pipeline: str) -> None:
    """Raise :class:`SpecMismatchError` (without the Spec file) unless the directory's metadata
    ``meta`` says it belongs to ``pipeline``, :class:`StateDirectoryError` unless it has a layout
    version this egress reads (:data:`READABLE_SCHEMA_VERSIONS`)."""
    if meta.get("pipeline") != pipeline:
        location = state_directory(state_dir)
        raise SpecMismatchError(f"{location.name} belongs to pipeline {meta.get('pipeline')!r}, not "
                                f"{pipeline!r}: {location.start_over}", path="pipeline", state_dir=str(state_dir))
    if meta.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise StateDirectoryError(
            f"{state_dir}: state layout version {meta.get('schema_version')} is not one this egress "
            f"reads ({', '.join(READABLE_SCHEMA_VERSIONS)}); use the egress version that wrote it"
        )


def read_metadata(state_dir: str | Path) -> dict[str, str] | None:
    """The metadata of a state directory, read without taking it over (read-only, safe while a run
    holds it); ``None`` when ``state_dir`` holds no egress state yet."""
    db = _connect_read_only(state_dir)
    if db is None:
        return None
    try:
        return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")} if "meta" in _tables(db) else {}
    finally:
        db.close()


def _connect_read_only(state_dir: str | Path) -> sqlite3.Connection | None:
    """A read-only connection to the directory's database (``None`` when it has none)."""
    path = Path(state_dir) / DATABASE_NAME
    if not path.exists():
        return None
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _tables(db: sqlite3.Connection) -> set[str]:
    return {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


class _AppendsWatch:
    """What a shared engine's appends poller last saw: the database's ``data_version``, the log
    ends, and slots other processes grew that this process's own appends since then covered."""

    def __init__(self, data_version: int, ends: dict[tuple[str, int], int]) -> None:
        self.data_version = data_version
        self.ends = ends
        self.grown: set[tuple[str, int]] = set()

    def own(self, starts: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> None:
        """Count this process's appends (``starts`` → ``ends`` per slot) as seen; a slot that had
        grown beyond what was last seen before them is another process's too."""
        for slot, start in starts.items():
            if start > self.ends.get(slot, 0):
                self.grown.add(slot)
            self.ends[slot] = ends[slot]


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
