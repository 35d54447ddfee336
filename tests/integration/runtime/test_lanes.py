"""Lanes (``egress.runtime.lanes``), run whole on SQLite: each reader of a source writes its own
lane of the stream, the computation reads them all and sees the stream; a state directory a
one-reader source wrote before lanes existed resumes with its log read as lane 0."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from egress.engines import EpochCommit
from egress.engines.sqlite import SqliteEngine
from egress.keys import encode_key, partition_of, source_message_id, source_scope
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.pipelines import RecordsStreams

pytestmark = pytest.mark.integration

OPTIONS = RunOptions(until_drained=True)
PARTITIONS = 2


def write_spec(path: Path, pipeline: str, parameters: dict[str, Any]) -> Path:
    """A ``jsonl`` source with ``parameters`` into ``events`` (``file``, ``n``; keyed by ``file``), read
    by :class:`RecordsStreams`."""
    path.write_text(yaml.safe_dump({
        "pipeline": pipeline,
        "partition_count": PARTITIONS,
        "streams": {"events": {"schema": [{"name": "file", "type": "string"}, {"name": "n", "type": "int64"}],
                               "group_by": ["file"]}},
        "sources": {"input": {"source_class_name": "jsonl", "output_stream_id": "events", "parameters": parameters}},
        "computations": {"record": {"processing_function": "tests.pipelines:RecordsStreams",
                                    "input_stream_ids": ["events"]}},
    }))
    return path


def rows(file: str, count: int) -> list[dict[str, Any]]:
    return [{"file": file, "n": n} for n in range(count)]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))


async def log_counts(state: Path, pipeline: str, names: list[str]) -> dict[str, int]:
    """The messages of each log stream in ``names`` (all partitions), read from the state directory."""
    engine = SqliteEngine(state, pipeline)
    await engine.open()
    try:
        return {name: sum([await engine.end_offset(name, p) for p in range(PARTITIONS)]) for name in names}
    finally:
        await engine.close()


async def test_a_job_reads_every_readers_lane_in_each_keys_order_and_sees_the_stream(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    files = [f"f{index}" for index in range(6)]
    for file in files:
        write_jsonl(logs / f"{file}.jsonl", rows(file, 30))
    spec = write_spec(tmp_path / "spec.yaml", "lanes", {"path": "logs/*.jsonl", "follow": True, "readers": 3})
    RecordsStreams.seen.clear()
    result = await asyncio.wait_for(Pipeline(load_plan(spec), tmp_path / "state", options=OPTIONS).run(), 60)
    assert result.ok, result
    assert result.drained, result

    seen = RecordsStreams.seen
    assert {stream for stream, _, _ in seen} == {"events"}  # never a lane's name
    assert sorted((row["file"], row["n"]) for _, _, row in seen) == sorted((f, n) for f in files for n in range(30))
    for file in files:  # a key's events come through one reader, so through one lane, in order
        assert [row["n"] for _, key, row in seen if key == (file,)] == list(range(30)), file
    # Each reader wrote its own lane only: reader 0 dealt two files to each of the three.
    counts = await log_counts(tmp_path / "state", "lanes", ["events", "events#1", "events#2", "events#3"])
    assert counts == {"events": 60, "events#1": 60, "events#2": 60, "events#3": 0}


async def test_a_one_reader_state_directory_from_before_lanes_resumes_reading_its_stream(tmp_path: Path) -> None:
    """What a one-reader source committed to the stream's log before (4 of 10 records, not yet read by
    the computation) is read as lane 0, and the source resumes after it."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data, rows("a", 10))
    spec = write_spec(tmp_path / "spec.yaml", "lanes_before", {"path": "data.jsonl"})
    state = tmp_path / "state"
    engine = SqliteEngine(state, "lanes_before")
    await engine.open()
    generation = await engine.acquire("source:input", 0)
    scope = source_scope("lanes_before", "input", "data.jsonl")
    key = encode_key(["a"])
    await engine.commit(EpochCommit("source:input", 0, generation, {("", 0): 4}, log_appends=[
        ("events", partition_of(key, PARTITIONS), source_message_id(scope, 0, n), key, None, row)
        for n, row in enumerate(rows("a", 4))]))
    await engine.close()
    RecordsStreams.seen.clear()
    result = await asyncio.wait_for(Pipeline(load_plan(spec), state, options=OPTIONS).run(), 60)
    assert result.ok, result
    assert result.drained, result

    assert [(stream, row["n"]) for stream, _, row in RecordsStreams.seen] == [("events", n) for n in range(10)]
    assert await log_counts(state, "lanes_before", ["events"]) == {"events": 10}
