"""A source reader's log appends: message ids, keys, partitions and rows of a file source, the chunks
it commits and their positions. The ids are fixed: they are the idempotency keys persisted in logs
and outboxes, so a changed id would deliver a record again after an upgrade."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from egress.connectors.sources import CsvSource, JsonlSource
from egress.connectors.sources.files import CsvSourceParameters, FileSourceParameters
from egress.engines import LogMessage, SqliteEngine
from egress.errors import SourceDataError
from egress.observe import Metrics
from egress.runtime.options import RunOptions
from egress.runtime.plan import SourcePlan
from egress.runtime.source_reader import POSITION, SourceReader
from egress.spec import StreamSpec
from tests.waiting import eventually

STREAM = StreamSpec.model_validate({"schema": [
    {"name": "id", "type": "int64", "required": True},
    {"name": "origin", "type": "string"},
    {"name": "distance", "type": "double"},
    {"name": "time_hour", "type": "string"},
], "group_by": ["id"]})

LINES = [
    {"id": 0, "origin": "EWR", "distance": 1400.0, "time_hour": "2013-01-01T10:00:00Z"},
    {"id": 1, "origin": "JFK", "distance": 1089, "time_hour": "2013-01-01T11:00:00Z"},  # an int for a double
    {"time_hour": "2013-01-01T12:00:00Z", "id": 2, "extra": [1, 2], "origin": None},  # another key order
    {"id": "three"},  # a bad record: skipped, it keeps its position
    {"id": 4},
    {"id": 5, "origin": "LGA", "distance": 17.0, "time_hour": "2013-01-01T13:00:00Z"},
    {"id": 6, "origin": "EWR", "distance": 200.5, "time_hour": None},
]

JSONL_ID = "c40143d09325089700000000"  # blake2b(scope)[:8] || source partition 0
CSV_ID = "87ae2efad729750600000000"


def _stream(group_by: list[str]) -> StreamSpec:
    return StreamSpec.model_validate({**STREAM.model_dump(by_alias=True), "group_by": group_by})


Commits = list[dict[tuple[str, int], int]]


async def _read(tmp_path: Path, source_class: Any, parameters: Any, chunk: int = 2, partition_count: int = 4,
                state: str = "state", stream: StreamSpec = STREAM) -> tuple[list[LogMessage], Commits]:
    """Run a reader over the file source to its end; the log's messages in id order and the positions it committed."""
    engine = SqliteEngine(tmp_path / state, "pinned")
    await engine.open()
    commits: Commits = []
    commit = engine.commit

    async def recording(epoch_commit: Any) -> None:
        commits.append(dict(epoch_commit.input_positions))
        await commit(epoch_commit)

    engine.commit = recording  # type: ignore[method-assign,assignment]
    try:
        plan = SourcePlan("flights", source_class, parameters, "rows", stream)
        reader = SourceReader(plan, engine, tmp_path, partition_count, Metrics(), RunOptions(source_chunk=chunk),
                              lambda partition: None, "pinned_pipeline")
        await reader.run()
        assert reader.finished
        messages = [m for p in range(partition_count) for m in await engine.read("rows", p, 0, 100)]
    finally:
        await engine.close()
    return sorted(messages, key=lambda m: m.message_id), commits


def _jsonl(tmp_path: Path) -> FileSourceParameters:
    (tmp_path / "flights.jsonl").write_bytes(b"\n".join(orjson.dumps(line) for line in LINES[:3]) + b"\n\n"
                                              + b"\n".join(orjson.dumps(line) for line in LINES[3:]) + b"\n")
    return FileSourceParameters(path="flights.jsonl", on_bad_record="skip", timestamp_column="time_hour")


async def test_a_jsonl_sources_ids_keys_partitions_and_rows_are_the_pinned_ones(tmp_path: Path) -> None:
    messages, _ = await _read(tmp_path, JsonlSource, _jsonl(tmp_path))
    assert [(m.message_id.hex(), m.partition, m.key, m.event_timestamp) for m in messages] == [
        (f"{JSONL_ID}{0:016x}", 0, b"[0]", 1357034400.0), (f"{JSONL_ID}{1:016x}", 1, b"[1]", 1357038000.0),
        (f"{JSONL_ID}{2:016x}", 0, b"[2]", 1357041600.0), (f"{JSONL_ID}{4:016x}", 3, b"[4]", None),
        (f"{JSONL_ID}{5:016x}", 2, b"[5]", 1357045200.0), (f"{JSONL_ID}{6:016x}", 2, b"[6]", None)]
    # Rows in schema order, whatever the line's key order; an int widened for a double, a missing key null.
    assert [list(m.row.items()) for m in messages[:3]] == [
        [("id", 0), ("origin", "EWR"), ("distance", 1400.0), ("time_hour", "2013-01-01T10:00:00Z")],
        [("id", 1), ("origin", "JFK"), ("distance", 1089.0), ("time_hour", "2013-01-01T11:00:00Z")],
        [("id", 2), ("origin", None), ("distance", None), ("time_hour", "2013-01-01T12:00:00Z")]]
    assert type(messages[1].row["distance"]) is float


async def test_each_chunk_commits_the_position_after_its_last_record(tmp_path: Path) -> None:
    """Chunks of 2 records: the skipped record 3 counts in the second chunk's position."""
    _, commits = await _read(tmp_path, JsonlSource, _jsonl(tmp_path))
    assert [c[POSITION] for c in commits] == [2, 5, 7]


async def test_a_csv_sources_ids_keys_partitions_and_rows_are_the_pinned_ones(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("id,origin,distance,time_hour\n0,EWR,1400,2013-01-01T10:00:00Z\n1,JFK,NA,\n"
                                    "x,LGA,,\n3,,17.5,\n")
    messages, commits = await _read(tmp_path, CsvSource, CsvSourceParameters(path="f.csv", on_bad_record="skip"))
    assert [(m.message_id.hex(), m.partition, m.key, list(m.row.values())) for m in messages] == [
        (f"{CSV_ID}{0:016x}", 0, b"[0]", [0, "EWR", 1400.0, "2013-01-01T10:00:00Z"]),
        (f"{CSV_ID}{1:016x}", 1, b"[1]", [1, "JFK", None, None]),
        (f"{CSV_ID}{3:016x}", 3, b"[3]", [3, None, 17.5, None])]
    assert [c[POSITION] for c in commits] == [2, 4]


@pytest.mark.parametrize(("group_by", "partition_count", "expected"), [
    (["id"], 1, [(0, b"[0]"), (0, b"[1]"), (0, b"[2]"), (0, b"[4]"), (0, b"[5]"), (0, b"[6]")]),
    (["id"], 3, [(0, b"[0]"), (0, b"[1]"), (0, b"[2]"), (2, b"[4]"), (0, b"[5]"), (1, b"[6]")]),
    (["id"], 8, [(4, b"[0]"), (1, b"[1]"), (0, b"[2]"), (3, b"[4]"), (6, b"[5]"), (6, b"[6]")]),
    (["origin"], 4, [(0, b'["EWR"]'), (2, b'["JFK"]'), (3, b"[null]"), (3, b"[null]"), (1, b'["LGA"]'),
                     (0, b'["EWR"]')]),
    (["origin", "id"], 4, [(3, b'["EWR",0]'), (1, b'["JFK",1]'), (3, b"[null,2]"), (0, b"[null,4]"),
                           (2, b'["LGA",5]'), (3, b'["EWR",6]')]),
    ([], 4, [(3, b"[]")] * 6),
])
async def test_keys_and_partitions_are_the_pinned_ones_for_each_key_shape_and_partition_count(
        tmp_path: Path, group_by: list[str], partition_count: int, expected: list[tuple[int, bytes]]) -> None:
    messages, _ = await _read(tmp_path, JsonlSource, _jsonl(tmp_path), partition_count=partition_count,
                              stream=_stream(group_by))
    assert [(m.partition, m.key) for m in messages] == expected


@pytest.mark.parametrize("source_class", [CsvSource, JsonlSource])
async def test_a_bad_record_under_fail_commits_the_records_before_it_in_its_chunk_then_raises(
        tmp_path: Path, source_class: Any) -> None:
    """Chunks of 2: record 3 is bad, so records 0 and 1 (the first chunk) and 2 (the second chunk,
    up to the bad record) are committed, and the committed position is the bad record's."""
    if source_class is CsvSource:
        (tmp_path / "f.csv").write_text("id,origin,distance,time_hour\n0,a,,\n1,b,,\n2,c,,\nx,d,,\n4,e,,\n")
        parameters: Any = CsvSourceParameters(path="f.csv")
    else:
        (tmp_path / "f.jsonl").write_text('{"id": 0}\n{"id": 1}\n{"id": 2}\n{oops\n{"id": 4}\n')
        parameters = FileSourceParameters(path="f.jsonl")
    with pytest.raises(SourceDataError, match=r"f\.csv:5: column id|f\.jsonl:4: not valid JSON"):
        await _read(tmp_path, source_class, parameters)
    engine = SqliteEngine(tmp_path / "state", "pinned")
    await engine.open()
    try:
        logged = sorted([m.row["id"] for p in range(4) for m in await engine.read("rows", p, 0, 100)])
        checkpoint = await engine.load_checkpoint("source:flights", 0, [])
    finally:
        await engine.close()
    assert logged == [0, 1, 2]
    assert checkpoint.input_positions[POSITION] == 3


class StartsForever:
    """A live source whose ``start`` never returns (a server that never answers): it sets the class's
    ``starting`` when its start begins, and notes its ``close``."""

    parameters_model = FileSourceParameters
    starting: ClassVar[asyncio.Event]
    closed: ClassVar[bool] = False
    position = 0
    source_state = b""

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> StartsForever:
        return cls()

    async def start(self, position: int, source_state: bytes, until_caught_up: bool) -> None:
        type(self).starting.set()
        await asyncio.Event().wait()

    async def take(self, limit: int, wait: float) -> list[Any] | None:
        raise AssertionError("never started")

    def committed(self) -> None: ...

    async def close(self) -> None:
        type(self).closed = True


async def test_a_stop_ends_a_reader_whose_live_source_is_still_starting_and_closes_the_source(
        tmp_path: Path) -> None:
    StartsForever.starting, StartsForever.closed = asyncio.Event(), False
    engine = SqliteEngine(tmp_path / "state", "pinned")
    await engine.open()
    try:
        plan = SourcePlan("forever", StartsForever, FileSourceParameters(path="unused"), "rows", STREAM)
        reader = SourceReader(plan, engine, tmp_path, 1, Metrics(), RunOptions(), lambda partition: None, "pinned")
        running = asyncio.create_task(reader.run())
        async with asyncio.timeout(30):  # a failure guard: the stop ends it at once
            await StartsForever.starting.wait()
            reader.stop()
            await running
    finally:
        await engine.close()
    assert not reader.finished
    assert StartsForever.closed


async def test_a_followed_files_reader_reads_its_next_batch_while_the_one_before_commits_and_commits_in_order(
        tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_bytes(b"".join(orjson.dumps({"id": i}) + b"\n" for i in range(6)))
    engine = SqliteEngine(tmp_path / "state", "pinned")
    await engine.open()
    sent: list[int] = []
    done: list[int] = []
    gate = asyncio.Event()  # the first commit's answer waits for it
    commit = engine.commit

    async def slow_first(epoch_commit: Any) -> None:
        sent.append(epoch_commit.input_positions[POSITION])
        if len(sent) == 1:
            await gate.wait()
        await commit(epoch_commit)
        done.append(epoch_commit.input_positions[POSITION])

    engine.commit = slow_first  # type: ignore[method-assign,assignment]
    try:
        plan = SourcePlan("logs", JsonlSource, FileSourceParameters(path="logs/*.jsonl", follow=True), "rows", STREAM)
        reader = SourceReader(plan, engine, tmp_path, 4, Metrics(),
                              RunOptions(source_chunk=2, until_drained=True, live_poll_period=0.01),
                              lambda partition: None, "pinned")
        running = asyncio.create_task(reader.run())
        await eventually(lambda: reader._source is not None and reader._source.position == 4,
                         what="the second batch taken while the first commits")
        assert sent == [2]  # the second batch's commit waits for the first's answer: commits stay in order
        gate.set()
        async with asyncio.timeout(30):  # a failure guard
            await running
        assert sent == done == [2, 4, 6]
        assert (await engine.load_checkpoint("source:logs", 0, [])).input_positions[POSITION] == 6
    finally:
        await engine.close()
