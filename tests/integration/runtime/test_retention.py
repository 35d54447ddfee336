"""The embedded log does not grow without bound (``egress.runtime.retention``): what every reader
has committed past is trimmed, but for ``log_retention`` messages kept for replay, and a long
run's state directory stays flat."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.engines import EpochCommit, SqliteEngine
from egress.runtime import Pipeline, RunOptions, load_plan

pytestmark = pytest.mark.integration

CHUNK = 20_000
CHUNKS = 5  # 100,000 source rows in CI
LONG_CHUNKS = 50  # EGRESS_LONG=1: 1,000,000 source rows (minutes; figures in docs/reliability.md)
LONG = os.environ.get("EGRESS_LONG") == "1"
FLAT_RATIO = 1.25  # the directory after CHUNKS chunks against after the first
FLAT_SLACK = 2 * 1024 * 1024  # bytes: a WAL that had not yet reached its checkpoint size after the first


class Forward(ProcessFunction):
    """Emits the row's ``payload`` to ``mid`` (read by :class:`Drop` through the log)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("mid", {"payload": message.row["payload"]})


class Drop(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        pass


def two_step_spec(tmp_path: Path) -> Path:
    """A source ``events`` (JSONL at tmp_path/events.jsonl) → ``forward`` → stream ``mid`` → ``drop``."""
    columns = [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}]
    spec = {"pipeline": "retention", "partition_count": 2,
            "streams": {"events": {"schema": columns, "group_by": ["id"]},
                        "mid": {"schema": [{"name": "payload", "type": "string"}]}},
            "sources": {"input": {"source_class_name": "jsonl", "output_stream_id": "events",
                                  "parameters": {"path": str(tmp_path / "events.jsonl")}}},
            "computations": {
                "forward": {"processing_function": f"{__name__}:Forward", "input_stream_ids": ["events"],
                            "output_stream_ids": ["mid"]},
                "drop": {"processing_function": f"{__name__}:Drop", "input_stream_ids": ["mid"]}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def append_events(path: Path, first: int, count: int) -> None:
    with path.open("a") as file:
        file.writelines(f'{{"id": {i}, "payload": "{i:048d}"}}\n' for i in range(first, first + count))


def directory_size(directory: Path) -> int:
    return sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())


def log_rows(directory: Path) -> dict[str, int]:
    import contextlib
    import sqlite3

    # closing: a connection left open would keep the write-ahead log beside the database after a run
    with contextlib.closing(sqlite3.connect(directory / "egress.sqlite3")) as db:
        return {str(s): int(n) for s, n in db.execute("SELECT stream, SUM(count) FROM log_batches GROUP BY stream")}


async def drain(spec: Path, state: Path, **options: object) -> None:
    result = await Pipeline(load_plan(spec), state, options=RunOptions(until_drained=True, **options)).run()  # type: ignore[arg-type]
    assert result.drained, result


async def test_a_drained_run_leaves_only_the_last_batch_of_each_log_partition(tmp_path: Path) -> None:
    spec = two_step_spec(tmp_path)
    append_events(tmp_path / "events.jsonl", 0, 5000)
    await drain(spec, tmp_path / "state", epoch_max_messages=500, source_chunk=500)
    rows = log_rows(tmp_path / "state")
    assert rows["events"] <= 2 * 500, rows  # one batch per partition at most
    assert rows["mid"] <= 2 * 500, rows


async def test_log_retention_keeps_that_many_consumed_messages_per_partition_for_replay(tmp_path: Path) -> None:
    spec = two_step_spec(tmp_path)
    append_events(tmp_path / "events.jsonl", 0, 5000)
    await drain(spec, tmp_path / "state", epoch_max_messages=100, source_chunk=100, log_retention=1000)
    rows = log_rows(tmp_path / "state")
    assert 2 * 1000 <= rows["events"] <= 2 * (1000 + 100), rows


async def test_a_stream_is_trimmed_only_past_its_slowest_reader(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path / "state", "trim")
    await engine.open()
    try:
        generation = {c: await engine.acquire(c, 0) for c in ("a", "b", "source:s")}
        for first in range(0, 30, 10):  # three batches of ten
            await engine.commit(EpochCommit("source:s", 0, generation["source:s"], {("", 0): first + 10}, log_appends=[
                ("s", 0, b"%d" % i, b"", None, {"n": i}) for i in range(first, first + 10)]))
        assert await engine.trim_log({"s": ["a", "b"]}) == 0  # neither has read anything
        await engine.commit(EpochCommit("a", 0, generation["a"], {("s", 0): 30}))
        assert await engine.trim_log({"s": ["a", "b"]}) == 0  # b has no position yet
        await engine.commit(EpochCommit("b", 0, generation["b"], {("s", 0): 15}))
        assert await engine.trim_log({"s": ["a", "b"]}) == 1  # the batch b is past; b reads on from 15
        assert [m.offset for m in await engine.read("s", 0, 15, 100)] == list(range(15, 30))
        await engine.commit(EpochCommit("b", 0, generation["b"], {("s", 0): 30}))
        assert await engine.trim_log({"s": ["a", "b"]}, keep=15) == 0  # 15 kept: [10, 20) holds the 16th last
        assert await engine.trim_log({"s": ["a", "b"]}, keep=10) == 1  # [10, 20): the last ten are in [20, 30)
        assert await engine.trim_log({"s": ["a", "b"]}) == 0  # the last batch stays: its end is the log's end
        assert await engine.end_offset("s", 0) == 30
    finally:
        await engine.close()


async def drain_chunks(tmp_path: Path, chunks: int) -> list[int]:
    """``chunks`` runs on one state directory, each draining CHUNK (20,000) more source rows through
    two computations (two log messages a row); returns the directory's size after each run."""
    spec, state, events = two_step_spec(tmp_path), tmp_path / "state", tmp_path / "events.jsonl"
    sizes = []
    started = time.monotonic()
    for chunk in range(chunks):
        append_events(events, chunk * CHUNK, CHUNK)
        await drain(spec, state, synchronous="OFF")
        sizes.append(directory_size(state))
    elapsed = time.monotonic() - started
    print(f"{chunks * CHUNK:,} source rows in {elapsed:.1f} s (load {os.getloadavg()[0]:.1f}); "
          f"directory sizes {[f'{s / 1e6:.1f} MB' for s in sizes]}; events file {events.stat().st_size / 1e6:.0f} MB")
    return sizes


async def test_the_state_directory_stays_flat_over_100_000_source_rows(tmp_path: Path) -> None:
    """CHUNKS (5) runs, 100,000 source rows (200,000 log messages): the directory after the last is
    within FLAT_RATIO (+ FLAT_SLACK) of its size after the first."""
    sizes = await drain_chunks(tmp_path, CHUNKS)
    assert sizes[-1] <= sizes[0] * FLAT_RATIO + FLAT_SLACK, sizes


@pytest.mark.skipif(not LONG, reason="takes minutes: set EGRESS_LONG=1 to drain 1,000,000 source rows")
@pytest.mark.timeout(3600)
async def test_the_state_directory_stays_flat_over_1_000_000_source_rows(tmp_path: Path) -> None:
    """LONG_CHUNKS (50) runs, 1,000,000 source rows (2,000,000 log messages): no size after the
    first run exceeds it by more than FLAT_RATIO (+ FLAT_SLACK)."""
    sizes = await drain_chunks(tmp_path, LONG_CHUNKS)
    assert max(sizes) <= sizes[0] * FLAT_RATIO + FLAT_SLACK, sizes
