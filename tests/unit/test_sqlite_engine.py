"""What only the SQLite engine does: one owner per state directory, one pipeline per directory,
upgrades of directories written by earlier versions. The behaviours every engine shares are the
conformance suite in ``tests/engines/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.engines import EpochCommit, SinkProgress, SqliteEngine
from egress.engines.sqlite import read_metadata
from egress.errors import StateDirectoryError


async def test_one_process_owns_a_state_directory(tmp_path: Path) -> None:
    first = SqliteEngine(tmp_path, "p")
    await first.open()
    second = SqliteEngine(tmp_path, "p")
    with pytest.raises(StateDirectoryError, match="in use by pid"):
        await second.open()
    await second.close()
    await first.close()


async def test_a_state_directory_belongs_to_one_pipeline(tmp_path: Path) -> None:
    first = SqliteEngine(tmp_path, "flights")
    await first.open()
    await first.close()
    other = SqliteEngine(tmp_path, "weather")
    with pytest.raises(StateDirectoryError, match="belongs to pipeline 'flights'"):
        await other.open()
    await other.close()


async def test_a_directory_from_before_sink_state_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, epoch, sink_progress={"http": SinkProgress("", b"id2", 2)}))
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")  # as the previous layout had it: no sink_state column
    db.execute("ALTER TABLE sink_progress DROP COLUMN sink_state")
    db.commit()
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert checkpoint.sink_progress["http"] == SinkProgress("", b"id2", 2, b"")
    await engine.close()


async def test_metadata_values_are_kept_across_reopening_and_read_without_taking_the_directory(
        tmp_path: Path) -> None:
    assert read_metadata(tmp_path / "none") is None
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    assert await engine.read_meta("spec_layout") is None
    await engine.write_meta("spec_layout", "{}")
    await engine.write_meta("spec_layout", '{"partition_count": 2}')
    assert read_metadata(tmp_path) == {"pipeline": "p", "schema_version": "1", "spec_layout": '{"partition_count": 2}'}
    await engine.close()
    again = SqliteEngine(tmp_path, "p")
    await again.open()
    assert await again.read_meta("spec_layout") == '{"partition_count": 2}'
    await again.close()
