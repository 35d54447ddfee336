"""Pausing (SIGSTOP) a process that shares a SQLite state directory at a moment it holds no write
transaction.

SQLite lets one write transaction run at a time: a process stopped inside its ``BEGIN IMMEDIATE``
keeps the write lock, and every other process's writes (lease renewals and takeovers included)
wait for it until it runs again. A test pausing a worker to prove that its leases lapse must
therefore pause it outside a write transaction. :func:`pause_outside_write_transaction` stops the
process, waits until the kernel reports it stopped, and then takes the write lock itself (and
rolls back at once): a lock taken proves the stopped process does not hold it, and a stopped
process cannot take it later. A lock not taken within :data:`PROBE_TIMEOUT` (the stopped process
holds it, or a running one holds it that long) resumes the process and tries again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

from egress.engines.sqlite import DATABASE_NAME
from tests.waiting import eventually

PROBE_TIMEOUT = 1.0
"""Seconds the probe waits for the write lock: a running writer's transaction takes milliseconds."""
ATTEMPTS = 20
STOPPED_WITHIN = 10.0
"""Seconds the kernel may take to report a SIGSTOPped process stopped, on a loaded machine."""


def stopped(pid: int) -> bool:
    """Whether ``/proc/<pid>/stat`` says the process is stopped (state ``T``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def write_lock_taken(database: Path, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ``BEGIN IMMEDIATE`` on ``database`` succeeds within ``timeout`` seconds (then rolled back)."""
    connection = sqlite3.connect(database, timeout=timeout, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as error:
        # "locking protocol" (SQLITE_PROTOCOL): the stopped process holds a WAL-index lock mid-update,
        # so the probe's read gave up after SQLite's own retries: the lock is not free either.
        if "locked" not in str(error) and "locking protocol" not in str(error):
            raise
        return False
    finally:
        connection.close()


async def pause_outside_write_transaction(pid: int, state_dir: Path, probe_timeout: float = PROBE_TIMEOUT) -> None:
    """SIGSTOP process ``pid`` at a moment it holds no write transaction on ``state_dir``'s shared
    SQLite database (the probe waits ``probe_timeout`` seconds for the lock); raises
    ``AssertionError`` after :data:`ATTEMPTS` pauses that each found the write lock held."""
    database = state_dir / DATABASE_NAME
    for attempt in range(ATTEMPTS):
        os.kill(pid, signal.SIGSTOP)
        await eventually(lambda: stopped(pid), what=f"process {pid} stopped by SIGSTOP", timeout=STOPPED_WITHIN,
                         interval=0.005)
        if await asyncio.to_thread(write_lock_taken, database, probe_timeout):
            return
        os.kill(pid, signal.SIGCONT)  # let it end its transaction; pause it at another moment
        await asyncio.sleep(0.01 * (attempt + 1))
    raise AssertionError(f"process {pid} held {database}'s write lock at each of {ATTEMPTS} pauses")
