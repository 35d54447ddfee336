"""Conformance, ``Ownership`` and the fence: generations only grow, and a stale generation commits nothing."""

from __future__ import annotations

from typing import Any

import pytest

from egress.engines import Engine, EpochCommit, FencedError, SinkProgress
from tests.engines.conftest import OpenEngine
from tests.engines.engines import outbox_message


async def everything(engine: Engine, consumer: str = "c", partition: int = 0) -> dict[str, Any]:
    """All an epoch of ``(consumer, partition)`` can change, as the engine reports it."""
    return {
        "checkpoint": await engine.load_checkpoint(consumer, partition, ["http"]),
        "keyed": await engine.load_keyed_state(consumer, partition, 1, ["profiles"]),
        "log": await engine.read("out", 0, 0, 100),
        "end_offset": await engine.end_offset("out", 0),
    }


def a_full_commit(generation: int, n: int) -> EpochCommit:
    return EpochCommit(
        "c", 0, generation, {("in", 0): n}, log_appends=[("out", 0, f"m{n}".encode(), b'["a"]', None, {"n": n})],
        outbox=[outbox_message(n)], sink_progress={"http": SinkProgress("", f"id{n}".encode(), n - 1)},
        state_writes={("counts", b'["a"]'): str(n).encode()},
        external_state_writes={("profiles", b'["a"]'): str(n).encode()},
        timers_set=[(b'["a"]', float(n), "processing")], watermark=float(n))


async def test_each_acquire_returns_a_greater_generation(engine: Engine) -> None:
    generations = [await engine.acquire("c", 0) for _ in range(4)]
    assert generations == sorted(set(generations))


async def test_acquiring_another_partition_or_consumer_does_not_fence_an_owner(engine: Engine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.acquire("c", 1)
    await engine.acquire("d", 0)
    await engine.commit(a_full_commit(generation, 1))
    assert (await engine.load_checkpoint("c", 0, [])).input_positions == {("in", 0): 1}


async def test_a_commit_with_a_stale_epoch_raises_fenced_error_and_changes_nothing(engine: Engine) -> None:
    old = await engine.acquire("c", 0)
    await engine.commit(a_full_commit(old, 1))
    before = await everything(engine)
    new = await engine.acquire("c", 0)
    with pytest.raises(FencedError):
        await engine.commit(a_full_commit(old, 2))
    assert await everything(engine) == before
    await engine.commit(a_full_commit(new, 2))
    assert (await engine.load_checkpoint("c", 0, [])).input_positions == {("in", 0): 2}


@pytest.mark.parametrize("issued", [0, 2], ids=["never-acquired", "not-yet-issued"])
async def test_a_commit_with_an_epoch_the_engine_did_not_issue_last_is_fenced(engine: Engine, issued: int) -> None:
    generation = 0
    for _ in range(issued):
        generation = await engine.acquire("c", 0)
    with pytest.raises(FencedError):
        await engine.commit(a_full_commit(generation + 1, 1))
    assert await everything(engine) == await everything(engine, "fresh")


async def test_epochs_keep_growing_after_reopening(engine: Engine, reopen: OpenEngine) -> None:
    generation = await engine.acquire("c", 0)
    await engine.close()
    engine = await reopen()
    new = await engine.acquire("c", 0)
    assert new > generation
    with pytest.raises(FencedError):
        await engine.commit(a_full_commit(generation, 1))
