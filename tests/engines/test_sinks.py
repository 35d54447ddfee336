"""Conformance, the outbox and sink progress: the outbox waits for the slowest sink and is trimmed
once every sink persisted past a seq; a range of it is read again (``OutboxReader``); sink progress
and sink state round-trip."""

from __future__ import annotations

from egress.engines import Engine, EpochCommit, OutboxReader, SinkProgress
from tests.engines.conftest import OpenEngine
from tests.engines.engines import outbox_message

OUTBOX = [outbox_message(seq) for seq in (1, 2, 3)]


async def test_the_checkpoint_holds_the_outbox_the_slowest_sink_has_not_persisted(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, outbox=OUTBOX,
                                    sink_progress={"http": SinkProgress("", b"id1", 1)}))
    both = await engine.load_checkpoint("c", 0, ["http", "other"])
    assert both.outbox == OUTBOX
    assert both.next_seq == 4
    assert (await engine.load_checkpoint("c", 0, ["http"])).outbox == OUTBOX[1:]
    assert (await engine.load_checkpoint("c", 1, ["http"])).outbox == []  # another partition's outbox


async def test_a_checkpoint_loaded_without_its_outbox_keeps_the_rest_for_reading_it_in_pages(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, outbox=OUTBOX,
                                    sink_progress={"http": SinkProgress("", b"id1", 1)}))
    whole = await engine.load_checkpoint("c", 0, ["http"])
    light = await engine.load_checkpoint("c", 0, ["http"], with_outbox=False)
    assert light.outbox == []
    assert (light.input_positions, light.sink_progress, light.next_seq) == \
        (whole.input_positions, whole.sink_progress, whole.next_seq)
    assert isinstance(engine, OutboxReader)
    assert await engine.read_outbox("c", 0, 1, light.next_seq - 1) == whole.outbox


async def test_the_outbox_is_trimmed_once_every_sink_persisted_past_a_seq(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, outbox=OUTBOX))
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id2", 2),
                                                                  "other": SinkProgress("", b"id3", 3)},
                                    outbox_acknowledged_seq=2))
    # A sink with no progress would see seq 1 and 2 again had they been kept: they are gone.
    assert (await engine.load_checkpoint("c", 0, ["late"])).outbox == OUTBOX[2:]
    await engine.close()
    engine = await reopen()
    checkpoint = await engine.load_checkpoint("c", 0, ["http", "other"])
    assert checkpoint.outbox == OUTBOX[2:]
    assert checkpoint.next_seq == 4


async def test_next_seq_continues_after_the_whole_outbox_is_trimmed(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, outbox=OUTBOX))
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id3", 3)},
                                    outbox_acknowledged_seq=3))
    await engine.close()
    engine = await reopen()
    checkpoint = await engine.load_checkpoint("c", 0, ["http"])
    assert checkpoint.outbox == []
    assert checkpoint.next_seq == 4


async def test_sink_progress_and_sink_state_round_trip(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"firehose": SinkProgress("", None, 0, b"[3,7]"),
                                                                  "http": SinkProgress("producer-1", b"id1", 1)}))
    await engine.commit(EpochCommit("c", 0, generation,
                                    sink_progress={"firehose": SinkProgress("", b"id3", 3, b"[7]")}))
    other = await engine.acquire("c", 1)
    await engine.commit(EpochCommit("c", 1, other, sink_progress={"firehose": SinkProgress("", b"x", 9, b"[]")}))
    await engine.close()
    engine = await reopen()
    assert (await engine.load_checkpoint("c", 0, ["firehose", "http", "new"])).sink_progress == {
        "firehose": SinkProgress("", b"id3", 3, b"[7]"),  # replaced whole, its sink state with it
        "http": SinkProgress("producer-1", b"id1", 1, b""),
        "new": SinkProgress(),
    }
    assert (await engine.load_checkpoint("c", 1, ["firehose"])).sink_progress == {
        "firehose": SinkProgress("", b"x", 9, b"[]")}


async def test_a_range_of_the_committed_outbox_is_read_again_until_it_is_trimmed(
        engine: Engine, reopen: OpenEngine) -> None:
    assert isinstance(engine, OutboxReader)  # every engine lets a sink leave a backlog in the outbox
    generation = await engine.acquire("c", 0)
    later = [outbox_message(seq) for seq in (4, 5, 6)]
    await engine.commit(EpochCommit("c", 0, generation, outbox=OUTBOX))
    await engine.commit(EpochCommit("c", 0, generation, outbox=later))
    other = await engine.acquire("c", 1)
    await engine.commit(EpochCommit("c", 1, other, outbox=[outbox_message(1)]))
    assert await engine.read_outbox("c", 0, 0, 6) == OUTBOX + later
    assert await engine.read_outbox("c", 0, 2, 4) == [OUTBOX[2], later[0]]  # across two commits
    assert await engine.read_outbox("c", 0, 6, 9) == []
    await engine.commit(EpochCommit("c", 0, generation, sink_progress={"http": SinkProgress("", b"id3", 3)},
                                    outbox_acknowledged_seq=3))
    assert await engine.read_outbox("c", 0, 0, 6) == later  # the trimmed prefix is gone
    await engine.close()
    engine = await reopen()
    assert isinstance(engine, OutboxReader)
    assert await engine.read_outbox("c", 0, 4, 6) == later[1:]  # from storage alone, no commit yet
    assert await engine.read_outbox("c", 1, 0, 6) == [outbox_message(1)]
