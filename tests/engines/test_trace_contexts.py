"""Conformance, ``TraceContexts``: the trace contexts messages carry (``EpochCommit.log_traces`` and
``outbox_traces``) read back by offset and seq, after a reopen too, and go with the outbox they
belong to when it is trimmed; a commit without contexts leaves the messages without any."""

from __future__ import annotations

from egress.engines import Engine, EpochCommit, LogAppend, SinkProgress, TraceContexts
from tests.engines.conftest import OpenEngine
from tests.engines.engines import outbox_message

FIRST = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nvendor=1"
SECOND = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def appends(stream: str, partition: int, count: int, start: int = 0) -> list[LogAppend]:
    return [(stream, partition, f"{stream}/{partition}/{i}".encode(), f'["k{i}"]'.encode(), None, {"i": i})
            for i in range(start, start + count)]


async def test_log_contexts_read_back_by_offset_across_commits_partitions_and_a_reopen(
        engine: Engine, reopen: OpenEngine) -> None:
    assert isinstance(engine, TraceContexts)
    generation = await engine.acquire("source:s", 0)
    mixed = [*appends("events", 0, 2), *appends("events", 1, 1), *appends("events", 0, 1, start=2)]
    # By index into log_appends: events/0 offsets 0 and 2, events/1 offset 0.
    await engine.commit(EpochCommit("source:s", 0, generation, log_appends=mixed,
                                    log_traces={0: FIRST, 2: SECOND, 3: SECOND}))
    await engine.commit(EpochCommit("source:s", 0, generation, log_appends=appends("events", 0, 2, start=3),
                                    log_traces={1: FIRST}))
    await engine.commit(EpochCommit("source:s", 0, generation, log_appends=appends("events", 0, 1, start=5)))
    assert await engine.read_log_traces("events", 0, 0, 10) == {0: FIRST, 2: SECOND, 4: FIRST}
    assert await engine.read_log_traces("events", 0, 1, 4) == {2: SECOND}  # first <= offset < end
    assert await engine.read_log_traces("events", 1, 0, 10) == {0: SECOND}
    assert await engine.read_log_traces("other", 0, 0, 10) == {}
    await engine.close()
    engine = await reopen()
    assert isinstance(engine, TraceContexts)
    assert await engine.read_log_traces("events", 0, 0, 10) == {0: FIRST, 2: SECOND, 4: FIRST}


async def test_outbox_contexts_survive_a_reopen_and_go_with_the_trimmed_outbox(
        engine: Engine, reopen: OpenEngine) -> None:
    assert isinstance(engine, TraceContexts)
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, outbox=[outbox_message(seq) for seq in (1, 2, 3)],
                                    outbox_traces={1: FIRST, 3: SECOND}))
    other = await engine.acquire("c", 1)
    await engine.commit(EpochCommit("c", 1, other, outbox=[outbox_message(1)], outbox_traces={1: SECOND}))
    assert await engine.read_outbox_traces("c", 0, 0) == {1: FIRST, 3: SECOND}
    assert await engine.read_outbox_traces("c", 0, 1) == {3: SECOND}  # seq > after_seq
    await engine.close()
    engine = await reopen()
    assert isinstance(engine, TraceContexts)
    assert await engine.read_outbox_traces("c", 0, 0) == {1: FIRST, 3: SECOND}
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id3", 3)},
                                    outbox_acknowledged_seq=3))
    assert await engine.read_outbox_traces("c", 0, 0) == {}  # trimmed with the outbox
    assert await engine.read_outbox_traces("c", 1, 0) == {1: SECOND}  # another partition's stay
