"""Storage failures of a state directory, as the :class:`~egress.errors.EgressError` that says what
to do: a full filesystem (SQLite's ``SQLITE_FULL``, ``database or disk is full``, or ``ENOSPC`` from
a file write) becomes :class:`~egress.errors.StateDirectoryFullError`.

SQLite rolls back the transaction that ran out of space, so nothing committed before it is lost:
the run stops, and a run started after space is freed resumes from the last commit.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

from egress.errors import StateDirectoryFullError


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from or while handling (a ``ROLLBACK`` that
    failed after SQLite had rolled back on its own), is a full filesystem."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error) and getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        current = current.__cause__ or current.__context__
    return False


def storage_error(error: BaseException, state_dir: Path, needed_bytes: int) -> BaseException:
    """The error to raise for ``error`` from the storage of ``state_dir``: a
    :class:`StateDirectoryFullError` naming the directory, its free bytes (``shutil.disk_usage``)
    and ``needed_bytes`` (the free space the engine needs to go on) when the filesystem is full,
    else ``error`` itself."""
    if not is_disk_full(error):
        return error
    try:
        free = shutil.disk_usage(state_dir).free
    except OSError:
        free = 0
    return StateDirectoryFullError(str(state_dir), free_bytes=free, needed_bytes=needed_bytes)

