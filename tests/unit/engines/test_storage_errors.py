"""A full filesystem under a state directory becomes one StateDirectoryFullError naming the
directory and the space needed (egress.engines.storage_errors); other storage errors pass as they are.
SQLite's own ``SQLITE_FULL`` is produced for real with ``PRAGMA max_page_count``."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from egress.engines.storage_errors import is_disk_full, storage_error
from egress.errors import StateDirectoryError, StateDirectoryFullError


def sqlite_full_error(path: Path) -> sqlite3.OperationalError:
    database = sqlite3.connect(path)
    try:
        database.execute("CREATE TABLE t (b BLOB)")
        database.execute("PRAGMA max_page_count = 3")
        with pytest.raises(sqlite3.OperationalError) as raised:
            database.execute("INSERT INTO t VALUES (zeroblob(1000000))")
        return raised.value
    finally:
        database.close()


def test_sqlite_full_becomes_a_state_directory_full_error_naming_the_directory_and_the_space(
        tmp_path: Path) -> None:
    error = sqlite_full_error(tmp_path / "x.sqlite3")
    assert str(error) == "database or disk is full"
    mapped = storage_error(error, tmp_path, 32 * 1024 * 1024)
    assert isinstance(mapped, StateDirectoryFullError)
    assert isinstance(mapped, StateDirectoryError)
    assert mapped.needed_bytes == 32 * 1024 * 1024
    assert str(mapped).startswith(f"{tmp_path}: the state directory's filesystem is full (")
    assert "free at least 32.0 MiB there" in str(mapped)
    assert "\n" not in str(mapped)


def test_a_failed_rollback_after_sqlite_full_is_still_a_full_filesystem(tmp_path: Path) -> None:
    rollback = sqlite3.OperationalError("cannot rollback - no transaction is active")
    rollback.__context__ = sqlite_full_error(tmp_path / "x.sqlite3")  # raised while handling it
    assert is_disk_full(rollback)

def test_enospc_is_a_full_filesystem_and_other_errors_pass_unchanged(tmp_path: Path) -> None:
    assert isinstance(storage_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path, 1),
                      StateDirectoryFullError)
    other = sqlite3.OperationalError("database is locked")
    assert storage_error(other, tmp_path, 1) is other
    permission = OSError(errno.EACCES, "Permission denied")
    assert storage_error(permission, tmp_path, 1) is permission
