"""The engine's one SQLite connection: opening and locking the state directory, its thread, and
its transactions. Every role of :class:`~egress.engines.sqlite.SqliteEngine` works through it."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from egress.clock import Clock, RealClock
from egress.engines.protocols import StateLocation
from egress.engines.sqlite.directory import check_metadata, state_directory
from egress.engines.sqlite.schema import (
    DATABASE_NAME,
    FREE_SPACE_NEEDED,
    LOCK_NAME,
    PAGE_SIZE,
    SCHEMA,
    SCHEMA_VERSION,
    table_names,
)
from egress.engines.sqlite.upgrades import upgrade_sink_progress, upgrade_timers, upgrade_to_batches
from egress.engines.storage_errors import storage_error
from egress.errors import StateDirectoryError

SHARED_BUSY_TIMEOUT = 60.0
"""Seconds a shared engine's transaction waits for another process's write transaction to end."""

T = TypeVar("T")


class SqliteConnection:
    """The connection of an engine on ``state_dir``'s database, used on one thread of its own
    (``_call`` hands work to it), so an fsync never stalls the event loop. ``open()`` creates the
    directory and schema (converting earlier layouts), takes the directory's exclusive lock unless
    ``shared`` and checks that the directory belongs to ``pipeline``."""

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

    @property
    def location(self) -> StateLocation:
        return state_directory(self.state_dir)

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self._call(self._open_sync)

    async def close(self) -> None:
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
            upgrade_timers(db)
            upgrade_sink_progress(db)
            for statement in SCHEMA.split(";"):
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
            if {"log", "outbox"} & table_names(db):  # layout 1 or 2 (checked above): converted in this transaction
                upgrade_to_batches(db)

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


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
