"""Conformance, cluster membership: ``register`` (join and heartbeat), ``deregister`` and
``members()``; member TTLs are the engine's lease time (virtual for SQLite, the server's for NATS)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from egress.engines import Engine, MemberInfo, MemberNotices
from tests.engines.conftest import Workers
from tests.waiting import eventually


def member(worker_id: str, digest: str = "d1") -> MemberInfo:
    return MemberInfo(worker_id, digest, {"host": "h", "pid": 7, "status_url": f"http://{worker_id}/status",
                                          "started_at": 1.5})


async def ids(engine: Engine) -> list[str]:
    return [m.worker_id for m in await engine.members()]


async def test_members_lists_the_registered_members_sorted_by_worker_id(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    await b.register(member("w2"), workers.ttl)
    await a.register(member("w1"), workers.ttl)
    assert await a.members() == await b.members() == [member("w1"), member("w2")]


async def test_registering_again_replaces_the_member_and_keeps_it_listed_past_its_first_ttl(
        workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    await a.register(member("w1"), workers.ttl)
    await b.register(member("control"), workers.ttl)  # registered at the same time, never again

    async def control_lapsed() -> bool:
        return "control" not in await ids(a)

    async def heartbeat() -> None:
        await a.register(member("w1", "d2"), workers.ttl)

    await workers.until(control_lapsed, meanwhile=heartbeat)
    assert await b.members() == [member("w1", "d2")]


async def test_deregister_removes_the_member_at_once(workers: Workers) -> None:
    a = await workers.open()
    await a.register(member("w1"), workers.ttl)
    await a.register(member("w2"), workers.ttl)
    await a.deregister("w1")
    await a.deregister("never-registered")
    assert await ids(a) == ["w2"]


async def test_a_member_that_stops_registering_lapses_after_its_ttl(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    await a.register(member("w1"), workers.ttl)
    assert await ids(b) == ["w1"]

    async def lapsed() -> bool:
        return await ids(b) == []

    await workers.until(lapsed)


async def test_member_notices_tell_another_instance_of_a_registration_and_a_departure(workers: Workers) -> None:
    a, b = await workers.open(), await workers.open()
    if not isinstance(a, MemberNotices):
        pytest.skip(f"{type(a).__name__} has no member notices (its workers list the members between heartbeats)")
    told: list[str | None] = []
    a.on_members(told.append)
    await eventually(_registered_and_told(b, told), what="a notice of w2's registration")
    await b.deregister("w2")
    await eventually(lambda: None in told, what="a notice of w2's departure")


def _registered_and_told(engine: Engine, told: list[str | None]) -> Callable[[], Awaitable[bool]]:
    """Register ``w2`` on ``engine`` (again, each try: a subscription made meanwhile may miss the
    first) until a notice of it arrived."""
    async def check() -> bool:
        await engine.register(member("w2"), 30)
        return "w2" in told

    return check
