"""Conformance, ``Log``: messages appended by commits read back in dense offset order."""

from __future__ import annotations

from egress.engines import Engine, EpochCommit, LogAppend, LogMessage
from tests.engines.conftest import OpenEngine


def appends(stream: str, partition: int, count: int, start: int = 0) -> list[LogAppend]:
    return [(stream, partition, f"{stream}/{partition}/{i}".encode(), f'["k{i}"]'.encode(), None, {"i": i})
            for i in range(start, start + count)]


async def test_appended_messages_read_back_in_offset_order_with_dense_offsets(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    row = {"text": "é ✓", "int": 2**53, "float": 0.25, "flag": True, "none": None, "list": [1, "two", [3]],
           "object": {"nested": {"deep": False}}}
    await engine.commit(EpochCommit("c", 0, generation, log_appends=[
        ("out", 0, b"a0", b'["a"]', 1.5, row),
        ("out", 1, b"b0", b'["b"]', None, {"n": 0}),
        ("out", 0, b"a1", b'["a"]', None, {"n": 1}),
        ("other", 0, b"o0", b"[]", 3.0, {}),
    ]))
    await engine.commit(EpochCommit("c", 0, generation, log_appends=[("out", 0, b"a2", b'["a"]', 2.5, {"n": 2})]))
    assert await engine.read("out", 0, 0, 100) == [
        LogMessage("out", 0, 0, b"a0", b'["a"]', 1.5, row),
        LogMessage("out", 0, 1, b"a1", b'["a"]', None, {"n": 1}),
        LogMessage("out", 0, 2, b"a2", b'["a"]', 2.5, {"n": 2}),
    ]
    assert await engine.read("out", 1, 0, 100) == [LogMessage("out", 1, 0, b"b0", b'["b"]', None, {"n": 0})]
    assert await engine.read("other", 0, 0, 100) == [LogMessage("other", 0, 0, b"o0", b"[]", 3.0, {})]


async def test_appends_of_several_consumers_continue_one_dense_offset_sequence(engine: Engine) -> None:
    first, second = await engine.acquire("source:a", 0), await engine.acquire("source:b", 0)
    await engine.commit(EpochCommit("source:a", 0, first, log_appends=appends("events", 0, 2)))
    await engine.commit(EpochCommit("source:b", 0, second, log_appends=appends("events", 0, 3, start=2)))
    await engine.commit(EpochCommit("source:a", 0, first, log_appends=appends("events", 0, 1, start=5)))
    messages = await engine.read("events", 0, 0, 100)
    assert [(m.offset, m.row["i"]) for m in messages] == [(i, i) for i in range(6)]


async def test_a_read_starts_at_the_position_and_returns_at_most_the_limit(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, log_appends=appends("out", 0, 10)))
    assert [m.offset for m in await engine.read("out", 0, 3, 4)] == [3, 4, 5, 6]
    assert [m.offset for m in await engine.read("out", 0, 8, 5)] == [8, 9]
    assert [m.offset for m in await engine.read("out", 0, 0, 1)] == [0]
    assert await engine.read("out", 0, 10, 5) == []
    assert await engine.read("out", 1, 0, 5) == []
    assert await engine.read("never_written", 0, 0, 5) == []


async def test_reads_continuing_inside_a_batch_give_each_message_once_with_rows_of_their_own(engine: Engine) -> None:
    """Epoch-sized reads of a larger committed batch, by two readers at their own positions, each
    changing the rows it got: every message comes once per reader, in order, as committed."""
    generation = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, generation, log_appends=appends("events", 0, 10)))
    await engine.commit(EpochCommit("source:s", 0, generation, log_appends=appends("events", 0, 5, start=10)))
    got: dict[str, list[int]] = {"a": [], "b": []}
    positions = {"a": 0, "b": 0}
    for reader, limit in [("a", 3), ("b", 4), ("a", 3), ("a", 5), ("b", 4), ("b", 2), ("a", 10), ("b", 10)]:
        batch = await engine.read("events", 0, positions[reader], limit)
        assert len(batch) == min(limit, 15 - positions[reader])
        for message in batch:
            got[reader].append(message.row["i"])
            assert message.offset == message.row["i"]
            message.row["i"] = "changed"
        positions[reader] += len(batch)
    assert got == {"a": list(range(15)), "b": list(range(15))}
    assert [m.row["i"] for m in await engine.read("events", 0, 2, 4)] == [2, 3, 4, 5]
    assert [m.row["i"] for m in await engine.read("events", 0, 6, 100)] == list(range(6, 15))


async def test_end_offset_is_the_offset_the_next_appended_message_gets(engine: Engine) -> None:
    assert await engine.end_offset("out", 0) == 0
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, log_appends=appends("out", 0, 3) + appends("out", 1, 1)))
    assert await engine.end_offset("out", 0) == 3
    assert await engine.end_offset("out", 1) == 1
    assert await engine.end_offset("out", 2) == 0
    await engine.commit(EpochCommit("c", 0, generation, log_appends=appends("out", 0, 2, start=3)))
    assert await engine.end_offset("out", 0) == 5
    assert [m.offset for m in await engine.read("out", 0, 3, 10)] == [3, 4]


async def test_offsets_continue_after_reopening(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, log_appends=appends("out", 0, 2)))
    await engine.close()
    engine = await reopen()
    generation = await engine.acquire("c", 0)
    assert await engine.end_offset("out", 0) == 2
    await engine.commit(EpochCommit("c", 0, generation, log_appends=appends("out", 0, 1, start=2)))
    assert [(m.offset, m.row["i"]) for m in await engine.read("out", 0, 0, 10)] == [(0, 0), (1, 1), (2, 2)]
