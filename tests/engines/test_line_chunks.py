"""Conformance, ``LineChunkLog`` (byte chunks, issue 25): a chunk of lines committed as one log row
reads back as rows with dense offsets and as a chunk from any offset in it; an outbox reference
reads back as the outbox rows it names; log retention keeps what a reference names; a fenced
commit of chunks changes nothing. An engine without the capability (NATS) is skipped: the runtime
asks for it and falls back to rows (``tests/integration/runtime/test_byte_chunks.py``)."""

from __future__ import annotations

import pytest

from egress.engines import (
    ChunkAt,
    Engine,
    EpochCommit,
    FencedError,
    LineChunkLog,
    LogChunk,
    LogMessage,
    LogRetention,
    OutboxChunk,
    OutboxMessage,
    OutboxReader,
    SinkProgress,
)
from egress.keys import derived_message_id, source_message_id_prefix
from egress.line_chunks import LineChunk
from tests.engines.conftest import OpenEngine

PREFIX = source_message_id_prefix("conformance/lines/file", 0)
SUFFIX = derived_message_id(b"", 0)


def chunk(texts: list[str], first: int) -> LineChunk:
    return LineChunk("".join(t + "\n" for t in texts).encode(), len(texts), PREFIX, first, "line")


def rows_of(stream: str, first_offset: int, c: LineChunk) -> list[LogMessage]:
    return [LogMessage(stream, 0, first_offset + i, c.message_id(i), b"[]", None, row)
            for i, row in enumerate(c.rows())]


@pytest.fixture
def chunked(engine: Engine) -> LineChunkLog:
    if not isinstance(engine, LineChunkLog):
        pytest.skip(f"{type(engine).__name__} stores no chunks (the runtime writes rows to it)")
    return engine


async def test_a_chunk_is_one_commit_of_dense_offsets_read_back_as_rows_or_as_a_chunk(
        engine: Engine, chunked: LineChunkLog, reopen: OpenEngine) -> None:
    generation = await engine.acquire("source:lines", 0)
    first, second = chunk(["é ✓", "{\"a\": 1}", " "], 0), chunk(["x", "y"], 3)
    await engine.commit(EpochCommit("source:lines", 0, generation, {("", 0): 0},
                                    log_appends=[("lines", 0, b"row0", b"[]", 2.5, {"line": "a row"})],
                                    log_chunks=[LogChunk("lines", 0, first)]))
    await engine.commit(EpochCommit("source:lines", 0, generation, log_chunks=[LogChunk("lines", 0, second)]))
    assert await engine.end_offset("lines", 0) == 6
    expected = [LogMessage("lines", 0, 0, b"row0", b"[]", 2.5, {"line": "a row"}),
                *rows_of("lines", 1, first), *rows_of("lines", 4, second)]
    reader = engine
    for _ in range(2):  # from this process's memory, then from storage alone
        assert await reader.read("lines", 0, 0, 100) == expected
        assert await reader.read("lines", 0, 2, 3) == expected[2:5]  # inside chunks, across them
        assert isinstance(reader, LineChunkLog)
        assert await reader.read_chunks("lines", 0, 0, 100) == [expected[0], ChunkAt(1, first), ChunkAt(4, second)]
        assert await reader.read_chunks("lines", 0, 2, 1) == [ChunkAt(2, first.tail(1))]  # whole from there on
        assert await reader.read_chunks("lines", 0, 6, 100) == []
        reader = await _reopened(reader, reopen)


async def _reopened(engine: Engine, reopen: OpenEngine) -> Engine:
    """The same storage opened again: nothing is served from the first engine's memory."""
    await engine.close()
    return await reopen()


async def test_an_outbox_reference_reads_back_as_the_outbox_rows_it_names(
        engine: Engine, chunked: LineChunkLog, reopen: OpenEngine) -> None:
    source = await engine.acquire("source:lines", 0)
    c = chunk(["a", "b", "c", "d"], 10)
    await engine.commit(EpochCommit("source:lines", 0, source, log_chunks=[LogChunk("lines", 0, c)]))
    job = await engine.acquire("deliver", 0)
    await engine.commit(EpochCommit("deliver", 0, job, {("lines", 0): 4}, outbox_chunks=[
        OutboxChunk(1, "requests", "lines", 0, 0, SUFFIX, c.derived(SUFFIX))]))
    outbox = [OutboxMessage(1 + i, "requests", c.message_id(i) + SUFFIX, b"[]", None, {"line": t})
              for i, t in enumerate("abcd")]
    engine = await _reopened(engine, reopen)
    checkpoint = await engine.load_checkpoint("deliver", 0, ["http"])
    assert (checkpoint.outbox, checkpoint.next_seq) == (outbox, 5)
    assert isinstance(engine, OutboxReader)
    assert await engine.read_outbox("deliver", 0, 1, 3) == outbox[1:3]
    job = await engine.acquire("deliver", 0)
    await engine.commit(EpochCommit("deliver", 0, job, sink_progress={"http": SinkProgress("", outbox[3][2], 4)},
                                    outbox_acknowledged_seq=4))
    assert (await engine.load_checkpoint("deliver", 0, ["http"])).outbox == []


async def test_retention_keeps_the_log_an_outbox_reference_names(engine: Engine, chunked: LineChunkLog) -> None:
    if not isinstance(engine, LogRetention):
        pytest.skip(f"{type(engine).__name__} trims its log by itself")
    source = await engine.acquire("source:lines", 0)
    chunks = [chunk([f"r{i}"] * 3, 3 * i) for i in range(3)]
    for c in chunks:
        await engine.commit(EpochCommit("source:lines", 0, source, log_chunks=[LogChunk("lines", 0, c)]))
    job = await engine.acquire("deliver", 0)
    await engine.commit(EpochCommit("deliver", 0, job, {("lines", 0): 9}, outbox_chunks=[
        OutboxChunk(1, "requests", "lines", 0, 3, SUFFIX, chunks[1].derived(SUFFIX))]))
    assert await engine.trim_log({"lines": ["deliver"]}) == 1  # the first chunk; the referenced one stays
    assert [m.row for m in (await engine.load_checkpoint("deliver", 0, ["http"])).outbox] == [{"line": "r1"}] * 3
    await engine.commit(EpochCommit("deliver", 0, job, sink_progress={"http": SinkProgress("", b"x", 3)},
                                    outbox_acknowledged_seq=3))
    assert await engine.trim_log({"lines": ["deliver"]}) == 1  # now it goes; the last batch never does
    assert await engine.read("lines", 0, 6, 100) == rows_of("lines", 6, chunks[2])


async def test_a_fenced_commit_of_chunks_and_references_changes_nothing(engine: Engine, chunked: LineChunkLog) -> None:
    stale = await engine.acquire("source:lines", 0)
    await engine.acquire("source:lines", 0)
    c = chunk(["a"], 0)
    with pytest.raises(FencedError):
        await engine.commit(EpochCommit("source:lines", 0, stale, {("", 0): 1}, log_chunks=[LogChunk("lines", 0, c)],
                                        outbox_chunks=[OutboxChunk(1, "requests", "lines", 0, 0, SUFFIX, c)]))
    assert await engine.end_offset("lines", 0) == 0
    assert (await engine.load_checkpoint("source:lines", 0, ["http"])).outbox == []
