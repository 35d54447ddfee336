"""What only the SQLite engine does: one owner per state directory, one pipeline per directory,
upgrades of directories written by earlier versions. The behaviours every engine shares are the
conformance suite in ``tests/engines/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from egress.engines import EpochCommit, OutboxMessage, SinkProgress, SqliteEngine
from egress.engines.sqlite import MIGRATION_BATCH, read_metadata
from egress.errors import StateDirectoryError
from egress.rows import unpack_batch


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
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id2", 2)}))
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
    assert read_metadata(tmp_path) == {"pipeline": "p", "schema_version": "3", "spec_layout": '{"partition_count": 2}'}
    await engine.close()
    again = SqliteEngine(tmp_path, "p")
    await again.open()
    assert await again.read_meta("spec_layout") == '{"partition_count": 2}'
    await again.close()


PER_MESSAGE_TABLES = """
DROP TABLE log_batches; DROP TABLE outbox_batches; DROP TABLE outbox_acknowledged;
CREATE TABLE log (
    stream TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    message_id BLOB NOT NULL, key BLOB NOT NULL, event_timestamp REAL, row BLOB NOT NULL,
    PRIMARY KEY (stream, partition, offset)) WITHOUT ROWID;
CREATE TABLE outbox (
    consumer TEXT NOT NULL, partition INTEGER NOT NULL, seq INTEGER NOT NULL, stream TEXT NOT NULL,
    message_id BLOB NOT NULL, key BLOB NOT NULL, event_timestamp REAL, row BLOB NOT NULL,
    PRIMARY KEY (consumer, partition, seq)) WITHOUT ROWID;
"""
"""The log and the outbox of layouts 1 and 2: one row per message."""


def _per_message_layout(tmp_path: Path, version: str) -> Any:
    """An open connection to a new state directory with the tables of layout ``version`` (1 or 2)."""
    import sqlite3

    from egress.engines.sqlite.schema import SCHEMA

    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    db.executescript(SCHEMA + PER_MESSAGE_TABLES)
    with db:
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [("pipeline", "p"), ("schema_version", version)])
    return db


def _layout_version_1(tmp_path: Path) -> None:
    """Make ``tmp_path`` a state directory as layout version 1 wrote it: JSON rows in the log, the
    outbox and an external state table (and the same tables, which version 2 did not change)."""
    import orjson

    db = _per_message_layout(tmp_path, "1")
    with db:
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
    generation = await engine.acquire("c", 0)
    assert generation == 4
    await engine.commit(EpochCommit("c", 0, generation,
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
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
    db.close()


async def test_a_directory_of_layout_version_2_is_converted_to_batches_with_every_message_and_seq(
        tmp_path: Path) -> None:
    """Layout 2 kept one MessagePack row per message: on open they move into batches (more than
    one per partition here), and reads, checkpoints and the inventory see the same messages."""
    import ormsgpack

    db = _per_message_layout(tmp_path, "2")
    count = MIGRATION_BATCH + 5
    with db:
        db.execute("INSERT INTO ownership VALUES ('c', 0, 1)")
        db.executemany("INSERT INTO log VALUES ('in', 1, ?, ?, ?, NULL, ?)",
                       [(i, b"m%d" % i, b'["k"]', ormsgpack.packb({"n": i, "b": b"\xff"})) for i in range(count)])
        db.executemany("INSERT INTO outbox VALUES ('c', 0, ?, 'requests', ?, ?, 2.5, ?)",
                       [(seq, b"o%d" % seq, b"[]", ormsgpack.packb({"payload": seq})) for seq in range(3, 13)])
        db.execute("INSERT INTO sink_progress VALUES ('c', 0, 'http', '', x'00', 2, x'')")
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    assert await engine.end_offset("in", 1) == count
    read = await engine.read("in", 1, MIGRATION_BATCH - 2, 5)
    assert [(m.offset, m.message_id, m.row) for m in read] == [
        (i, b"m%d" % i, {"n": i, "b": b"\xff"}) for i in range(MIGRATION_BATCH - 2, MIGRATION_BATCH + 3)]
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert [(m.seq, m.message_id, m.event_timestamp, m.row) for m in checkpoint.outbox] == [
        (seq, b"o%d" % seq, 2.5, {"payload": seq}) for seq in range(3, 13)]
    assert checkpoint.next_seq == 13
    inventory = await engine.inventory()
    assert inventory.log_ends == {("in", 1): count}
    assert inventory.outbox == {("c", 0, "requests"): 10}
    await engine.close()
    assert read_metadata(tmp_path)["schema_version"] == "3"  # type: ignore[index]


async def test_a_partly_persisted_outbox_batch_counts_and_resends_only_what_is_beyond(tmp_path: Path) -> None:
    """A commit's outbox is one stored batch, deleted only once every message of it is persisted:
    until then the persisted part is neither in the inventory nor handed back on load."""
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("c", 0)
    outbox = [OutboxMessage(seq, "requests", b"id%d" % seq, b"[]", None, {"payload": f"p{seq}"}) for seq in (1, 2, 3)]
    await engine.commit(EpochCommit("c", 0, generation, outbox=outbox))
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id2", 2)},
                                    outbox_acknowledged_seq=2))
    assert (await engine.inventory()).outbox == {("c", 0, "requests"): 1}
    assert (await engine.load_checkpoint("c", 0, ["late"])).outbox == outbox[2:]
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id3", 3)},
                                    outbox_acknowledged_seq=3))
    assert (await engine.inventory()).outbox == {}
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert (checkpoint.outbox, checkpoint.next_seq) == ([], 4)
    await engine.close()


async def test_a_directory_of_an_unknown_layout_is_refused_naming_its_version(tmp_path: Path) -> None:
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    with db:
        db.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    with pytest.raises(StateDirectoryError, match="state layout version 4 is not one this egress reads"):
        await engine.open()
    await engine.close()


async def test_shared_engines_open_a_directory_without_its_lock(tmp_path: Path) -> None:
    parent = SqliteEngine(tmp_path, "p")  # as `egress run --processes N` holds the directory
    await parent.open()
    children = [SqliteEngine(tmp_path, "p", shared=True) for _ in range(2)]
    for child in children:
        await child.open()
    generation = await children[0].try_acquire("c", 0, "w0", 10.0)
    assert generation is not None
    assert await children[1].try_acquire("c", 0, "w1", 10.0) is None
    for child in children:
        await child.close()
    await parent.close()


async def test_shared_engines_give_dense_offsets_to_appends_each_commits_to_one_log_partition(tmp_path: Path) -> None:
    engines = [SqliteEngine(tmp_path, "p", shared=True) for _ in range(2)]
    for engine in engines:
        await engine.open()
    generations = [await engine.acquire(f"c{i}", 0) for i, engine in enumerate(engines)]
    for n in range(3):
        for i, engine in enumerate(engines):
            assert await engine.end_offset("out", 0) == 2 * n + i
            await engine.commit(EpochCommit(f"c{i}", 0, generations[i], log_appends=[
                ("out", 0, f"{i}:{n}".encode(), b"[]", None, {})]))
    assert [(m.offset, m.message_id) for m in await engines[0].read("out", 0, 0, 10)] == [
        (o, f"{o % 2}:{o // 2}".encode()) for o in range(6)]
    for engine in engines:
        await engine.close()


async def test_a_lease_of_a_directory_from_before_leases_never_lapses(tmp_path: Path) -> None:
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("c", 0)
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    db.execute("DROP TABLE leases")  # as an earlier version left it: a generation, no lease row
    db.commit()
    db.close()
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 1}))
    assert [(lease.consumer, lease.owner, lease.generation, lease.expires_in) for lease in await engine.leases()] == [
        ("c", "", generation, None)]
    await engine.close()


def test_the_appends_watch_counts_own_appends_as_seen_unless_another_process_grew_the_slot_before() -> None:
    from egress.engines.sqlite.appends import _AppendsWatch

    watch = _AppendsWatch(1, {("a", 0): 5, ("b", 0): 3})
    watch.own({("a", 0): 5, ("c", 0): 0}, {("a", 0): 7, ("c", 0): 2})  # only this process appended
    assert (watch.grown, watch.ends) == (set(), {("a", 0): 7, ("b", 0): 3, ("c", 0): 2})
    watch.own({("b", 0): 4}, {("b", 0): 6})  # the end was 4, not the 3 last seen: another's append came first
    assert (watch.grown, watch.ends[("b", 0)]) == ({("b", 0)}, 6)


def _appends(stream: str, partition: int, first: int, count: int) -> list[Any]:
    return [(stream, partition, b"m%d" % i, b"[%d]" % i, None, {"n": i}) for i in range(first, first + count)]


async def test_a_batch_just_committed_is_read_from_memory_without_a_query(tmp_path: Path) -> None:
    """The consuming job in the same process reads what was just committed from the engine's tail:
    removed from the database behind the engine's back, it still reads (a query would find nothing)."""
    import sqlite3

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, generation, {("", 0): 5}, log_appends=_appends("in", 0, 0, 5)))
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    with db:
        db.execute("DELETE FROM log_batches")
    db.close()
    assert [(m.offset, m.row) for m in await engine.read("in", 0, 2, 10)] == [(i, {"n": i}) for i in (2, 3, 4)]
    await engine.close()


async def test_rows_read_from_the_tail_belong_to_their_reader(tmp_path: Path) -> None:
    """Each read decodes its own rows: a process function changing its input row changes no other
    reader's (nor a re-read's) copy."""
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, generation, {("", 0): 2}, log_appends=_appends("in", 0, 0, 2)))
    first = await engine.read("in", 0, 0, 10)
    first[0].row["n"] = "changed"
    assert [m.row for m in await engine.read("in", 0, 0, 10)] == [{"n": 0}, {"n": 1}]
    await engine.close()


async def test_the_tail_is_bounded_and_older_messages_are_read_from_the_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import egress.engines.sqlite.log as sqlite_log

    monkeypatch.setattr(sqlite_log, "TAIL_BYTES", 200)
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("source:s", 0)
    for first in range(0, 60, 10):
        await engine.commit(EpochCommit("source:s", 0, generation, {("", 0): first + 10},
                                        log_appends=_appends("in", 0, first, 10)))
    assert engine._tail.bytes <= 200
    assert [m.row["n"] for m in await engine.read("in", 0, 5, 100)] == list(range(5, 60))
    await engine.close()


async def test_a_read_continuing_inside_a_batch_decodes_it_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Epochs of 3 messages reading a batch of 10 decode it once, not once per epoch (from the tail
    and from the database alike)."""
    import egress.engines.sqlite.batches as sqlite_batches

    decoded: list[bytes] = []

    def counting_unpack(blob: bytes) -> list[list[Any]]:
        decoded.append(blob)
        return unpack_batch(blob)

    monkeypatch.setattr(sqlite_batches, "unpack_batch", counting_unpack)
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, generation, {("", 0): 10}, log_appends=_appends("in", 0, 0, 10)))
    for reopened in (False, True):
        if reopened:  # the tail is gone: the batch is read from the database
            await engine.close()
            engine = SqliteEngine(tmp_path, "p")
            await engine.open()
        decoded.clear()
        read: list[int] = []
        while batch := await engine.read("in", 0, len(read), 3):
            read.extend(m.row["n"] for m in batch)
        assert read == list(range(10))
        assert len(decoded) == 1
    await engine.close()


def test_batch_rests_keep_at_most_their_limit_of_messages_dropping_the_oldest_first() -> None:
    from egress.engines.sqlite.batches import BatchRests

    rests = BatchRests(10)
    rests.keep("in", 0, 4, [[b"m%d" % i] for i in range(4, 10)])  # offsets 4..9: 6 messages
    rests.keep("in", 1, 2, [[b"n%d" % i] for i in range(2, 8)])  # 6 more: the first rest is dropped
    assert rests.messages == 6
    assert rests.take("in", 0, 4) is None
    assert rests.take("in", 1, 3) is None  # only the rest starting at its own offset is taken
    assert rests.take("in", 1, 2) == [[b"n%d" % i] for i in range(2, 8)]
    assert rests.take("in", 1, 2) is None
    assert rests.messages == 0


def test_the_tail_answers_only_from_a_contiguous_run_that_reaches_the_durable_end() -> None:
    from egress.engines.sqlite.batches import LogTail

    tail = LogTail(1 << 20)
    tail.add("in", 0, 0, 2, b"a")
    assert tail.batches("in", 0, 1, 2) == [(0, b"a")]
    assert tail.batches("in", 0, 1, 3) is None  # another process appended beyond what this one committed
    tail.add("in", 0, 5, 1, b"b")  # a gap (offsets 2-4 written elsewhere): what was kept no longer reaches it
    assert tail.batches("in", 0, 1, 6) is None
    assert tail.batches("in", 0, 5, 6) == [(5, b"b")]
    assert tail.bytes == 1


def test_the_tail_answers_the_batches_from_the_one_holding_the_offset_to_its_end() -> None:
    from egress.engines.sqlite.batches import LogTail

    tail = LogTail(1 << 20)
    for offset in range(0, 30, 3):
        tail.add("in", 0, offset, 3, b"%d" % offset)
    assert tail.batches("in", 0, 29, 30) == [(27, b"27")]
    assert tail.batches("in", 0, 25, 30) == [(24, b"24"), (27, b"27")]
    assert tail.batches("in", 0, 24, 30) == [(24, b"24"), (27, b"27")]
    assert tail.batches("in", 0, 0, 30) == [(offset, b"%d" % offset) for offset in range(0, 30, 3)]
    assert tail.batches("in", 0, 30, 30) == []  # at the end: nothing kept holds it


async def _queued_behind_a_busy_database(engine: SqliteEngine, commits: list[EpochCommit]) -> list[Any]:
    """Commit ``commits`` at once while the engine's database thread is held busy, so that they
    queue and are applied together; returns each one's outcome (``None`` or its exception), and
    counts the transactions that made them durable in ``engine.transactions`` (a test attribute)."""
    import asyncio
    import threading

    busy = threading.Event()
    transactions: list[str] = []
    engine._db.set_trace_callback(  # type: ignore[union-attr]
        lambda statement: transactions.append(statement) if statement == "COMMIT" else None)
    held = engine._executor.submit(busy.wait)
    tasks = [asyncio.ensure_future(engine.commit(commit)) for commit in commits]
    await asyncio.sleep(0)  # every commit is queued before the thread is free
    busy.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    held.result()
    engine.transactions = len(transactions)  # type: ignore[attr-defined]
    return outcomes


async def test_commits_queued_together_are_applied_in_one_transaction_each_behind_its_own_fence(
        tmp_path: Path) -> None:
    """Group commit: one stale commit among several queued ones is refused (FencedError), the
    others apply, all with one COMMIT (one fsync); appends of two commits to one partition stay dense."""
    from egress.engines import FencedError

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    stale = await engine.acquire("c", 1)
    await engine.acquire("c", 1)  # taken over: commits under ``stale`` are fenced
    generations = {partition: await engine.acquire("c", partition) for partition in (0, 2)}
    commits = [
        EpochCommit("c", 0, generations[0], {("in", 0): 3}, log_appends=_appends("next", 0, 0, 2)),
        EpochCommit("c", 1, stale, {("in", 1): 9}, log_appends=_appends("next", 0, 100, 1)),
        EpochCommit("c", 2, generations[2], {("in", 2): 4}, log_appends=_appends("next", 0, 2, 3),
                    outbox=[OutboxMessage(1, "requests", b"o1", b"[]", None, {"payload": "x"})]),
    ]
    outcomes = await _queued_behind_a_busy_database(engine, commits)
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], FencedError)
    assert engine.transactions == 1  # type: ignore[attr-defined]
    assert [m.message_id for m in await engine.read("next", 0, 0, 10)] == [b"m%d" % i for i in range(5)]
    assert (await engine.load_checkpoint("c", 1, [])).input_positions == {}
    assert (await engine.load_checkpoint("c", 2, ["http"])).input_positions == {("in", 2): 4}
    assert [m.seq for m in (await engine.load_checkpoint("c", 2, ["http"])).outbox] == [1]
    await engine.close()


async def test_an_unstorable_row_in_a_group_refuses_that_commit_alone(tmp_path: Path) -> None:
    from egress.errors import RowEncodingError

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generations = {partition: await engine.acquire("c", partition) for partition in (0, 1)}
    bad = [("next", 0, b"bad", b"[]", None, {"text": "\ud800"})]
    outcomes = await _queued_behind_a_busy_database(engine, [
        EpochCommit("c", 0, generations[0], {("in", 0): 1}, log_appends=bad),
        EpochCommit("c", 1, generations[1], {("in", 1): 2}, log_appends=_appends("next", 0, 0, 2)),
    ])
    assert isinstance(outcomes[0], RowEncodingError)
    assert outcomes[1] is None
    assert [m.message_id for m in await engine.read("next", 0, 0, 10)] == [b"m0", b"m1"]
    assert (await engine.load_checkpoint("c", 0, [])).input_positions == {}
    await engine.close()


async def test_a_new_state_directory_uses_16_kib_pages_and_an_existing_one_keeps_its_own(tmp_path: Path) -> None:
    import sqlite3

    from egress.engines.sqlite import PAGE_SIZE

    engine = SqliteEngine(tmp_path / "new", "p")
    await engine.open()
    await engine.close()
    db = sqlite3.connect(tmp_path / "new" / "egress.sqlite3")
    assert db.execute("PRAGMA page_size").fetchone() == (PAGE_SIZE,) == (16384,)
    db.close()
    _per_message_layout(tmp_path, "2").close()  # made with SQLite's default pages
    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    await engine.close()
    db = sqlite3.connect(tmp_path / "egress.sqlite3")
    assert db.execute("PRAGMA page_size").fetchone() == (4096,)
    db.close()


async def test_deleting_an_acknowledged_outbox_batch_does_not_write_its_freed_pages_again(tmp_path: Path) -> None:
    """The commit that trims a persisted outbox batch of ~20 pages adds a few pages to the
    write-ahead log (the tables it changes), not the batch's pages zeroed (``secure_delete``)."""
    from egress.engines.sqlite import PAGE_SIZE

    engine = SqliteEngine(tmp_path, "p")
    await engine.open()
    generation = await engine.acquire("c", 0)
    outbox = [OutboxMessage(seq, "out", b"m%d" % seq, b"[1]", None, {"payload": "x" * 1000}) for seq in range(1, 301)]
    await engine.commit(EpochCommit("c", 0, generation, outbox=outbox))
    wal = tmp_path / "egress.sqlite3-wal"
    before = wal.stat().st_size
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"m300", 300)},
                                    outbox_acknowledged_seq=300))
    frames = (wal.stat().st_size - before) // (PAGE_SIZE + 24)
    assert (await engine.load_checkpoint("c", 0, ["http"])).outbox == []
    await engine.close()
    assert frames <= 8


async def test_a_shared_engine_reads_and_appends_past_another_process_s_append_to_its_last_log_partition(
        tmp_path: Path) -> None:
    """Shared, what this engine appended last is not the end: another process's append after it is
    read (no early return at this engine's own end, no answer from its log tail), and this engine's
    next appends, alone and in a group commit, continue after it with dense offsets."""
    first, second = SqliteEngine(tmp_path, "p", shared=True), SqliteEngine(tmp_path, "p", shared=True)
    for engine in (first, second):
        await engine.open()
    a0, a1, b0 = await first.acquire("a", 0), await first.acquire("a", 1), await second.acquire("b", 0)
    await first.commit(EpochCommit("a", 0, a0, log_appends=_appends("out", 0, 0, 3)))
    assert len(await first.read("out", 0, 0, 10)) == 3
    await second.commit(EpochCommit("b", 0, b0, log_appends=_appends("out", 0, 3, 2)))
    assert [m.message_id for m in await first.read("out", 0, 3, 10)] == [b"m3", b"m4"]
    assert [m.offset for m in await first.read("out", 0, 0, 10)] == [0, 1, 2, 3, 4]
    assert await first.end_offset("out", 0) == 5
    await first.commit(EpochCommit("a", 0, a0, log_appends=_appends("out", 0, 5, 1)))
    await second.commit(EpochCommit("b", 0, b0, log_appends=_appends("out", 0, 6, 1)))
    outcomes = await _queued_behind_a_busy_database(first, [
        EpochCommit("a", 0, a0, log_appends=_appends("out", 0, 7, 2)),
        EpochCommit("a", 1, a1, log_appends=_appends("out", 0, 9, 1)),
    ])
    assert outcomes == [None, None]
    assert first.transactions == 1  # type: ignore[attr-defined]
    assert [(m.offset, m.message_id) for m in await second.read("out", 0, 0, 100)] == [
        (i, b"m%d" % i) for i in range(10)]
    for engine in (first, second):
        await engine.close()


async def test_the_appends_watch_takes_a_group_commit_s_appends_as_own_unless_another_process_appended_first(
        tmp_path: Path) -> None:
    first, second = SqliteEngine(tmp_path, "p", shared=True), SqliteEngine(tmp_path, "p", shared=True)
    for engine in (first, second):
        await engine.open()
    a0, a1, b0 = await first.acquire("a", 0), await first.acquire("a", 1), await second.acquire("b", 0)
    assert await first._read_call(first._grown_sync) == set()  # the watch starts: every end as seen
    group = [EpochCommit("a", 0, a0, log_appends=_appends("out", 0, 0, 2)),
             EpochCommit("a", 1, a1, log_appends=_appends("out", 0, 2, 1))]
    assert await _queued_behind_a_busy_database(first, group) == [None, None]
    assert await first._read_call(first._grown_sync) == set()  # only this process appended
    await second.commit(EpochCommit("b", 0, b0, log_appends=_appends("out", 0, 3, 1)))
    assert await _queued_behind_a_busy_database(first, [
        EpochCommit("a", 0, a0, log_appends=_appends("out", 0, 4, 1)),
        EpochCommit("a", 1, a1, log_appends=_appends("out", 0, 5, 1))]) == [None, None]
    assert await first._read_call(first._grown_sync) == {("out", 0)}
    for engine in (first, second):
        await engine.close()
