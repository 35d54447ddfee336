"""Conformance, the cluster's leases: ``try_acquire``, ``renew``, ``release`` and ``leases()``
(docs/cluster.md, "Leases and membership"). Lease time is the engine's: a virtual clock for
SQLite, the server's per-message TTL for NATS (1 s; these tests wait for it, so they are few)."""

from __future__ import annotations

import asyncio

import pytest

from egress.engines import Engine, EpochCommit, FencedError, LeaseInfo
from tests.engines.conftest import Workers


def commit(generation: int, n: int, consumer: str = "c") -> EpochCommit:
    """Commit ``n`` of ``consumer`` partition 0: its input position and one log append."""
    return EpochCommit(consumer, 0, generation, {("in", 0): n},
                       log_appends=[("out", 0, f"{consumer}{n}".encode(), b'["a"]', None, {"n": n})])


async def position(engine: Engine, consumer: str = "c") -> int:
    return (await engine.load_checkpoint(consumer, 0, [])).input_positions.get(("in", 0), 0)


async def take(engine: Engine, workers: Workers, owner: str, consumer: str = "c", partition: int = 0) -> int:
    """The generation of the lease ``owner`` takes (failing the test when it is refused)."""
    generation = await engine.try_acquire(consumer, partition, owner, workers.ttl)
    assert generation is not None, f"{owner} could not take {consumer} partition {partition}"
    return generation


async def listed(engine: Engine, consumer: str = "c") -> bool:
    return any(lease.consumer == consumer for lease in await engine.leases())


async def test_try_acquire_refuses_a_live_lease_of_another_owner(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    generation = await take(a, workers, "a")
    assert await b.try_acquire("c", 0, "b", workers.ttl) is None
    await a.commit(commit(generation, 1))
    assert await position(b) == 1


async def test_try_acquire_grants_a_lapsed_lease_with_a_greater_generation_and_the_old_generation_is_fenced(
        workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    old = await take(a, workers, "a")
    taken: list[int] = []

    async def b_takes_it() -> bool:
        new = await b.try_acquire("c", 0, "b", workers.ttl)
        taken.extend([] if new is None else [new])
        return new is not None

    await workers.until(b_takes_it)
    assert taken[0] > old
    with pytest.raises(FencedError):
        await a.commit(commit(old, 1))
    await b.commit(commit(taken[0], 1))
    assert await b.read("out", 0, 0, 10) == await a.read("out", 0, 0, 10)
    assert [m.message_id for m in await a.read("out", 0, 0, 10)] == [b"c1"]


async def test_a_lapsed_lease_nobody_took_fences_its_commits_and_cannot_be_renewed(workers: Workers) -> None:
    a = await workers.open()
    generation = await take(a, workers, "a")

    async def lapsed() -> bool:
        return not await listed(a)

    await workers.until(lapsed)
    with pytest.raises(FencedError):
        await a.commit(commit(generation, 1))
    assert await a.renew("c", 0, generation, workers.ttl) is False
    assert await position(a) == 0


async def test_try_acquire_of_the_owners_own_lease_gives_a_greater_generation(workers: Workers) -> None:
    a = await workers.open()
    first = await take(a, workers, "a")
    second = await take(a, workers, "a")
    assert second > first
    with pytest.raises(FencedError):
        await a.commit(commit(first, 1))
    await a.commit(commit(second, 1))


async def test_epochs_grow_across_acquire_and_try_acquire_and_try_acquire_takes_an_acquired_lease_over(
        workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    acquired = await a.acquire("c", 0)
    leased = await take(b, workers, "b")
    assert leased > acquired
    with pytest.raises(FencedError):
        await a.commit(commit(acquired, 1))
    again = await a.acquire("c", 0)
    assert again > leased
    with pytest.raises(FencedError):
        await b.commit(commit(leased, 1))
    await a.commit(commit(again, 1))


async def test_renew_keeps_a_lease_alive_past_its_first_ttl(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    renewed = await take(a, workers, "a")
    await take(a, workers, "a", "control")  # taken at the same time, never renewed

    async def control_lapsed() -> bool:
        return not await listed(a, "control")

    async def renew() -> None:
        assert await a.renew("c", 0, renewed, workers.ttl)

    await workers.until(control_lapsed, meanwhile=renew)
    assert await b.try_acquire("c", 0, "b", workers.ttl) is None
    await a.commit(commit(renewed, 1))
    assert await position(b) == 1


async def test_renew_of_a_lease_taken_over_or_released_returns_false(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    taken_over = await take(a, workers, "a")
    await b.acquire("c", 0)
    assert await a.renew("c", 0, taken_over, workers.ttl) is False
    released = await take(a, workers, "a", "d", 0)
    await a.release("d", 0, released)
    assert await a.renew("d", 0, released, workers.ttl) is False


async def test_commits_and_renewals_of_one_lease_run_concurrently_without_a_fenced_error(workers: Workers) -> None:
    a = await workers.open()
    generation = await take(a, workers, "a")

    async def commits() -> None:
        for n in range(1, 31):
            await a.commit(commit(generation, n))

    async def renewals() -> list[bool]:
        return [await a.renew("c", 0, generation, workers.ttl) for _ in range(30)]

    _, renewed = await asyncio.gather(commits(), renewals())
    assert renewed == [True] * 30
    assert await position(a) == 30
    assert [m.offset for m in await a.read("out", 0, 0, 100)] == list(range(30))


async def test_release_lets_another_owner_take_the_lease_at_once_and_fences_the_released_generation(
        workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    released = await take(a, workers, "a")
    await a.commit(commit(released, 1))
    await a.release("c", 0, released)
    assert not await listed(b)
    with pytest.raises(FencedError):
        await a.commit(commit(released, 2))
    taken = await take(b, workers, "b")
    assert taken > released
    await b.commit(commit(taken, 2))
    assert await position(a) == 2


async def test_release_of_a_generation_no_longer_held_leaves_the_lease_as_it_is(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    stale = await take(a, workers, "a")
    held = await take(a, workers, "a")
    await a.release("c", 0, stale)
    assert await b.try_acquire("c", 0, "b", workers.ttl) is None
    await a.commit(commit(held, 1))


async def test_leases_lists_every_live_lease_with_its_owner_generation_and_expiry(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    leased = await take(a, workers, "worker-a")
    acquired = await b.acquire("source:files", 0)
    released = await take(b, workers, "worker-b", "d", 2)
    assert await a.renew("c", 0, leased, workers.ttl)
    await b.release("d", 2, released)
    found = await b.leases()
    assert [(x.consumer, x.partition, x.owner, x.generation, x.expires_in is None) for x in found] == [
        ("c", 0, "worker-a", leased, False), ("source:files", 0, "", acquired, True)]
    expires_in = found[0].expires_in
    assert expires_in is not None
    assert 0 < expires_in <= workers.ttl
    assert all(isinstance(x, LeaseInfo) for x in found)
