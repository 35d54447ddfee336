"""What only the SQLite engine does: one owner per state directory, one pipeline per directory,
upgrades of directories written by earlier versions. The behaviours every engine shares are the
conformance suite in ``tests/engines/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.engines import EpochCommit, OutboxMessage, SinkProgress, SqliteEngine
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
    assert read_metadata(tmp_path) == {"pipeline": "p", "schema_version": "2", "spec_layout": '{"partition_count": 2}'}
    await engine.close()
    again = SqliteEngine(tmp_path, "p")
    await again.open()
    assert await again.read_meta("spec_layout") == '{"partition_count": 2}'
    await again.close()


def _layout_version_1(tmp_path: Path) -> None:
    """Make ``tmp_path`` a state directory as layout version 1 wrote it: JSON rows in the log, the
    outbox and an external state table (and the same tables, which version 2 did not change)."""
    import sqlite3

    import orjson

    from egress.engines.sqlite import _SCHEMA

    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    db.executescript(_SCHEMA)
    with db:
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [("pipeline", "p"), ("schema_version", "1")])
        db.execute("INSERT INTO ownership VALUES ('c', 0, 3)")
        db.execute("INSERT INTO log VALUES ('out', 0, 0, x'01', ?, 1.5, ?)",
                   (b'["k"]', orjson.dumps({"payload": "old", "n": 7})))
        db.execute("INSERT INTO outbox VALUES ('c', 0, 1, 'requests', x'02', ?, NULL, ?)",
                   (b"[]", orjson.dumps({"payload": "old \u00e9"})))
        db.execute("INSERT INTO external_state VALUES ('/t', ?, ?)", (b'["k"]', orjson.dumps({"total": 3})))
    db.close()


async def test_a_directory_of_layout_version_1_opens_and_reads_its_json_rows_beside_new_ones(tmp_path: Path) -> None:
    import sqlite3

    from egress.cli.state import state_lines

    _layout_version_1(tmp_path)
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    assert epoch == 4
    await engine.commit(EpochCommit("c", 0, epoch,
                                    log_appends=[("out", 0, b"\x03", b'["k"]', None, {"payload": b"\xff"})],
                                    outbox=[OutboxMessage(2, "requests", b"\x04", b"[]", None, {"payload": b"\x00"})],
                                    external_state_writes={("/t", b'["j"]'): b"\x81\xa5total\x04"}))
    assert [m.row for m in await engine.read("out", 0, 0, 10)] == [{"payload": "old", "n": 7}, {"payload": b"\xff"}]
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert [(m.seq, m.row) for m in checkpoint.outbox] == [(1, {"payload": "old \u00e9"}), (2, {"payload": b"\x00"})]
    keyed = await engine.load_keyed_state("c", 0, 1, ["/t"])
    assert set(keyed.external["/t"]) == {b'["k"]', b'["j"]'}
    await engine.close()
    assert [(line["key"], line["row"]) for line in state_lines(tmp_path)] == [(["j"], {"total": 4}),
                                                                             (["k"], {"total": 3})]
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
    db.close()


async def test_a_directory_of_an_unknown_layout_is_refused_naming_its_version(tmp_path: Path) -> None:
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    with db:
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    with pytest.raises(StateDirectoryError, match="state layout version 3 is not one this egress reads"):
        await engine.open()
    await engine.close()


async def test_shared_engines_open_a_directory_without_its_lock(tmp_path: Path) -> None:
    parent = SqliteEngine(tmp_path, "p")  # as `egress run --processes N` holds the directory
    await parent.open()
    children = [SqliteEngine(tmp_path, "p", shared=True) for _ in range(2)]
    for child in children:
        await child.open()
    epoch = await children[0].try_acquire("c", 0, "w0", 10.0)
    assert epoch is not None
    assert await children[1].try_acquire("c", 0, "w1", 10.0) is None
    for child in children:
        await child.close()
    await parent.close()


async def test_shared_engines_give_dense_offsets_to_appends_each_commits_to_one_log_partition(tmp_path: Path) -> None:
    engines = [SqliteEngine(tmp_path, "p", shared=True) for _ in range(2)]
    for engine in engines:
        await engine.open()
    epochs = [await engine.acquire(f"c{i}", 0) for i, engine in enumerate(engines)]
    for n in range(3):
        for i, engine in enumerate(engines):
            assert await engine.end_offset("out", 0) == 2 * n + i
            await engine.commit(EpochCommit(f"c{i}", 0, epochs[i], log_appends=[
                ("out", 0, f"{i}:{n}".encode(), b"[]", None, {})]))
    assert [(m.offset, m.message_id) for m in await engines[0].read("out", 0, 0, 10)] == [
        (o, f"{o % 2}:{o // 2}".encode()) for o in range(6)]
    for engine in engines:
        await engine.close()


async def test_a_lease_of_a_directory_from_before_leases_never_lapses(tmp_path: Path) -> None:
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    epoch = await engine.acquire("c", 0)
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    db.execute("DROP TABLE leases")  # as an earlier version left it: an epoch, no lease row
    db.commit()
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    await engine.commit(EpochCommit("c", 0, epoch, {("in", 0): 1}))
    assert [(lease.consumer, lease.owner, lease.epoch, lease.expires_in) for lease in await engine.leases()] == [
        ("c", "", epoch, None)]
    await engine.close()


def test_the_appends_watch_counts_own_appends_as_seen_unless_another_process_grew_the_slot_before() -> None:
    from egress.engines.sqlite import _AppendsWatch

    watch = _AppendsWatch(1, {("a", 0): 5, ("b", 0): 3})
    watch.own({("a", 0): 5, ("c", 0): 0}, {("a", 0): 7, ("c", 0): 2})  # only this process appended
    assert (watch.grown, watch.ends) == (set(), {("a", 0): 7, ("b", 0): 3, ("c", 0): 2})
    watch.own({("b", 0): 4}, {("b", 0): 6})  # the end was 4, not the 3 last seen: another's append came first
    assert (watch.grown, watch.ends[("b", 0)]) == ({("b", 0)}, 6)
