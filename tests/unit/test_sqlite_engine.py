"""The embedded SQLite engine: atomic fenced epochs, checkpoints, outbox, one owner per directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.engines import EpochCommit, FencedError, OutboxMessage, SinkProgress, SqliteEngine
from egress.engines.sqlite import read_metadata
from egress.errors import StateDirectoryError


def outbox(seq: int) -> OutboxMessage:
    return OutboxMessage(seq, "requests", f"id{seq}".encode(), b"[]", 1.5, {"payload": f"p{seq}"})


async def test_an_epoch_commits_positions_log_outbox_and_progress_together(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.commit(EpochCommit(
        "c", 0, epoch, {("flights", 0): 3},
        log_appends=[("out", 1, b"m1", b'["a"]', None, {"x": 1}), ("out", 1, b"m2", b'["a"]', 2.0, {"x": 2})],
        outbox=[outbox(1), outbox(2), outbox(3)],
        sink_progress={"http": SinkProgress("", b"id1", 1)}))
    checkpoint = await engine.load_checkpoint("c", 0, ["http", "other"])
    assert checkpoint.input_positions == {("flights", 0): 3}
    assert checkpoint.sink_progress["http"] == SinkProgress("", b"id1", 1)
    assert checkpoint.sink_progress["other"] == SinkProgress()
    assert [m.seq for m in checkpoint.outbox] == [1, 2, 3]  # "other" has persisted nothing yet
    assert checkpoint.next_seq == 4
    log = await engine.read("out", 1, 0, 10)
    assert [(m.offset, m.message_id, m.row) for m in log] == [(0, b"m1", {"x": 1}), (1, b"m2", {"x": 2})]
    assert await engine.end_offset("out", 1) == 2
    assert [m.offset for m in await engine.read("out", 1, 1, 10)] == [1]
    await engine.close()


async def test_acknowledged_outbox_messages_are_dropped(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, epoch, outbox=[outbox(1), outbox(2), outbox(3)]))
    await engine.commit(EpochCommit("c", 0, epoch, sink_progress={"http": SinkProgress("", b"id2", 2)},
                                    outbox_acknowledged_seq=2))
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert [m.seq for m in checkpoint.outbox] == [3]
    assert checkpoint.next_seq == 4
    await engine.close()


async def test_a_stale_epoch_cannot_commit_and_leaves_nothing_behind(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    old = await engine.acquire("c", 0)
    new = await engine.acquire("c", 0)
    assert new > old
    with pytest.raises(FencedError):
        await engine.commit(EpochCommit("c", 0, old, {("s", 0): 9}, log_appends=[("out", 0, b"m", b"[]", None, {})],
                                        outbox=[outbox(1)]))
    checkpoint = await engine.load_checkpoint("c", 0, [])
    assert checkpoint.input_positions == {}
    assert checkpoint.outbox == []
    assert await engine.read("out", 0, 0, 10) == []
    await engine.close()


async def test_committed_state_survives_reopening(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, epoch, {("s", 0): 5}, outbox=[outbox(1)],
                                    state_writes={("counts", b'["a"]'): b"1"}, timers_set=[(b'["a"]', 10.0)]))
    await engine.close()
    again = SqliteEngine(tmp_path, "p")
    await again.open()
    checkpoint = await again.load_checkpoint("c", 0, ["http"])
    assert checkpoint.input_positions == {("s", 0): 5}
    assert [m.row for m in checkpoint.outbox] == [{"payload": "p1"}]
    assert await again.acquire("c", 0) == epoch + 1
    await again.close()


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


async def test_a_sinks_own_state_is_committed_and_replaced_with_its_progress(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, epoch, sink_progress={"firehose": SinkProgress("", None, 0, b"[3,7]")}))
    await engine.commit(EpochCommit("c", 0, epoch, sink_progress={"firehose": SinkProgress("", b"id3", 3, b"[7]")}))
    await engine.close()
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    checkpoint = await engine.load_checkpoint("c", 0, ["firehose"])
    assert checkpoint.sink_progress["firehose"] == SinkProgress("", b"id3", 3, b"[7]")
    await engine.close()


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


async def test_the_inventory_counts_where_committed_work_waits(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    source = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, source, {("", 0): 5}, log_appends=[
        ("events", p, f"m{i}".encode(), b"[]", None, {}) for i, p in enumerate([0, 0, 2, 2, 2])]))
    job = await engine.acquire("c", 2)
    await engine.commit(EpochCommit("c", 2, job, {("events", 2): 1}, outbox=[outbox(1), outbox(2)],
                                    timers_set=[(b'["a"]', 10.0, "processing")]))
    found = await engine.inventory()
    assert found.log_ends == {("events", 0): 2, ("events", 2): 3}
    assert found.read_positions == {("events", 2): [1]}  # the source reader's position is not a read
    assert found.outbox == {("c", 2, "requests"): 2}
    assert found.timers == {("c", 2): 1}
    await engine.close()
