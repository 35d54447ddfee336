"""Conformance, ``CheckpointStore.commit``: one commit lands whole and survives reopening; later
commits replace positions, state and watermark, delete state, and set and delete timers."""

from __future__ import annotations

from egress.engines import Checkpoint, Engine, EpochCommit, KeyedState, LogMessage, SinkProgress
from tests.engines.conftest import OpenEngine
from tests.engines.engines import outbox_message


async def test_a_commit_is_visible_as_a_whole_after_reopening(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit(
        "c", 0, generation, {("flights", 0): 3, ("responses", 0): 7},
        log_appends=[("out", 1, b"m1", b'["a"]', None, {"x": 1}), ("out", 1, b"m2", b'["a"]', 2.0, {"x": 2})],
        outbox=[outbox_message(1), outbox_message(2), outbox_message(3)],
        sink_progress={"http": SinkProgress("producer", b"id1", 1, b"[2,3]")},
        state_writes={("counts", b'["a"]'): b"1", ("seen", b'["b"]'): b"true"},
        external_state_writes={("profiles", b'["a"]'): b'{"name":"A"}'},
        timers_set=[(b'["a"]', 10.0, "processing"), (b'["b"]', 20.0, "event")],
        watermark=42.5))
    await engine.close()
    engine = await reopen()
    assert await engine.load_checkpoint("c", 0, ["http", "other"]) == Checkpoint(
        {("flights", 0): 3, ("responses", 0): 7},
        {"http": SinkProgress("producer", b"id1", 1, b"[2,3]"), "other": SinkProgress()},
        [outbox_message(1), outbox_message(2), outbox_message(3)],  # "other" has persisted nothing yet
        4)
    assert await engine.read("out", 1, 0, 10) == [LogMessage("out", 1, 0, b"m1", b'["a"]', None, {"x": 1}),
                                                  LogMessage("out", 1, 1, b"m2", b'["a"]', 2.0, {"x": 2})]
    assert await engine.end_offset("out", 1) == 2
    keyed = await engine.load_keyed_state("c", 0, 1, ["profiles"])
    assert keyed.internal == {"counts": {b'["a"]': b"1"}, "seen": {b'["b"]': b"true"}}
    assert keyed.external == {"profiles": {b'["a"]': b'{"name":"A"}'}}
    assert sorted(keyed.timers) == [(b'["a"]', 10.0, "processing"), (b'["b"]', 20.0, "event")]
    assert keyed.watermark == 42.5
    assert await engine.acquire("c", 0) > generation


async def test_later_commits_replace_positions_state_and_watermark(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, {("a", 0): 1, ("b", 0): 1},
                                    state_writes={("counts", b'["k"]'): b"1"}, watermark=5.0))
    await engine.commit(EpochCommit("c", 0, generation, {("a", 0): 3}, state_writes={("counts", b'["k"]'): b"2"}))
    assert (await engine.load_checkpoint("c", 0, [])).input_positions == {("a", 0): 3, ("b", 0): 1}
    keyed = await engine.load_keyed_state("c", 0, 1, [])
    assert keyed.internal == {"counts": {b'["k"]': b"2"}}
    assert keyed.watermark == 5.0  # a commit without a watermark leaves it
    await engine.commit(EpochCommit("c", 0, generation, watermark=7.0))
    assert (await engine.load_keyed_state("c", 0, 1, [])).watermark == 7.0


async def test_a_state_write_of_none_deletes_the_key(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit(
        "c", 0, generation, state_writes={("counts", b'["a"]'): b"1", ("counts", b'["b"]'): b"2"},
        external_state_writes={("profiles", b'["a"]'): b"A", ("profiles", b'["b"]'): b"B"}))
    await engine.commit(EpochCommit("c", 0, generation, state_writes={("counts", b'["a"]'): None},
                                    external_state_writes={("profiles", b'["b"]'): None}))
    keyed = await engine.load_keyed_state("c", 0, 1, ["profiles"])
    assert keyed.internal == {"counts": {b'["b"]': b"2"}}
    assert keyed.external == {"profiles": {b'["a"]': b"A"}}


async def test_timers_deleted_apply_before_timers_set(engine: Engine) -> None:
    a, b, c = (b'["a"]', 1.0, "processing"), (b'["b"]', 2.0, "event"), (b'["c"]', 3.0, "processing")
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, timers_set=[a, b]))
    await engine.commit(EpochCommit("c", 0, generation, timers_set=[c], timers_deleted=[a]))
    assert sorted((await engine.load_keyed_state("c", 0, 1, [])).timers) == [b, c]
    await engine.commit(EpochCommit("c", 0, generation, timers_set=[b], timers_deleted=[b]))  # re-armed in one epoch
    await engine.commit(EpochCommit("c", 0, generation, timers_set=[c]))  # set again: still one timer
    assert sorted((await engine.load_keyed_state("c", 0, 1, [])).timers) == [b, c]


async def test_a_timer_is_one_key_trigger_and_domain(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, timers_set=[(b'["a"]', 1.0, "processing"),
                                                               (b'["a"]', 1.0, "event"),
                                                               (b'["a"]', 2.0, "processing")]))
    await engine.commit(EpochCommit("c", 0, generation, timers_deleted=[(b'["a"]', 1.0, "event")]))
    assert sorted((await engine.load_keyed_state("c", 0, 1, [])).timers) == [(b'["a"]', 1.0, "processing"),
                                                                            (b'["a"]', 2.0, "processing")]


async def test_an_empty_commit_changes_nothing(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, {("a", 0): 1}, state_writes={("counts", b'["a"]'): b"1"},
                                    watermark=1.0))
    await engine.commit(EpochCommit("c", 0, generation))
    assert (await engine.load_checkpoint("c", 0, [])).input_positions == {("a", 0): 1}
    assert await engine.load_keyed_state("c", 0, 1, []) == KeyedState({"counts": {b'["a"]': b"1"}}, {}, [], 1.0)
