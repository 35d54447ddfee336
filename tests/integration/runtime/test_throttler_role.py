"""The cluster's throttler controller, elected through the NATS engine's lease and reached over NATS
request/reply: two workers (two engines on one bucket, as two processes would have) against a real
nats-server. The e2e test (tests/e2e/throttler/test_cluster.py) kills a real worker process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import nats
import pytest

from egress.clock import RealClock
from egress.engines.nats import NatsEngine
from egress.runtime.cluster.throttler_role import CONTROLLER_ROLE, ControllerElection, cluster_throttling
from egress.runtime.options import RunOptions
from egress.spec import DynamicSpec
from egress.throttler import Throttling
from tests.nats_server import NatsServer
from tests.waiting import eventually

pytestmark = pytest.mark.integration

TTL = 2.0
OPTIONS = RunOptions(lease_ttl=TTL, heartbeat_period=0.5)
QUICK = {"limit": 50, "period": "1s", "request_period": "100ms",
         "retrying_channel": {"retry_backoff_time": "50ms", "enable_exponential_retry_backoffs": False}}


@dataclass
class Member:
    engine: NatsEngine
    throttling: Throttling
    election: ControllerElection
    task: asyncio.Task[None]


Join = Callable[..., Awaitable[Member]]


@asynccontextmanager
async def joining(url: str, bucket: str) -> AsyncIterator[Join]:
    """Starts workers' throttler parts on ``url``: each its engine, its Throttling (clients over
    NATS) and its election; all stopped at the end, and the bucket deleted."""
    members: list[Member] = []

    async def start(worker_id: str, throttlers: dict[str, Any] | None = None) -> Member:
        engine = NatsEngine(url, "p", bucket=bucket, owner=worker_id, lease_ttl=TTL)
        await engine.open()
        throttling, election = cluster_throttling(
            engine, DynamicSpec(throttlers=throttlers or {"q": QUICK}), RealClock(), file=None, worker_id=worker_id,
            options=OPTIONS, registry=None)
        member = Member(engine, throttling, election, asyncio.create_task(election.run()))
        members.append(member)
        return member

    yield start
    for member in members:
        member.task.cancel()
        await asyncio.gather(member.task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await member.election.stop()
        await member.throttling.aclose()
        await member.engine.close()
    connection = await nats.connect(url)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await connection.jetstream().delete_stream(f"KV_{bucket}")
    await connection.close()


@pytest.fixture
async def join(nats_server: str, request: pytest.FixtureRequest) -> AsyncIterator[Join]:
    async with joining(nats_server, "egress_el_" + request.node.name[-40:]) as start:
        yield start


def die(member: Member) -> Awaitable[Any]:
    """The worker's process is gone: no renewal, no reply, nothing released (SIGKILL's effect)."""
    member.task.cancel()
    return asyncio.gather(member.task, member.election.connection.aclose(), member.engine.close(),
                          return_exceptions=True)


async def test_one_worker_is_elected_and_serves_the_clients_of_both(join: Join) -> None:
    first, second = await join("w1"), await join("w2")
    await eventually(lambda: first.election.serving or second.election.serving)
    await asyncio.sleep(0)
    assert [first.election.serving, second.election.serving].count(True) == 1
    for member in (first, second):
        factory = member.throttling.factory("c")
        await asyncio.wait_for(factory.get_throttler_or_throw("q").throttle(1), 10)
    controller = first if first.election.serving else second
    status = controller.election.status(await first.engine.leases())
    assert status["controller"] == controller.election.worker_id
    assert status["serving_here"] is True
    assert second.election.status(await second.engine.leases())["controller"] == controller.election.worker_id
    assert any(lease.consumer == CONTROLLER_ROLE and lease.owner == controller.election.worker_id
               for lease in await first.engine.leases())


async def test_the_controllers_death_hands_the_lease_to_another_within_one_ttl_and_calls_resume(join: Join) -> None:
    first = await join("w1")
    await eventually(lambda: first.election.serving)
    second = await join("w2")
    factory = second.throttling.factory("c")
    handle = factory.get_throttler_or_throw("q")
    await asyncio.wait_for(handle.throttle(1), 10)
    await die(first)
    killed = time.monotonic()
    waiting = asyncio.create_task(handle.throttle(100))  # more than it may have prefetched: needs a controller
    asked = time.monotonic()
    await eventually(lambda: second.election.serving)
    took = time.monotonic() - asked
    # The lease lapses within TTL of the last renewal (NATS rounds it up to whole seconds and
    # removes it within a second), then the next try (0.5 s) takes it.
    assert took <= TTL + 1.0 + 0.5 + 0.5
    controller = second.throttling.controller
    assert controller is not None
    assert controller.empty_since is not None  # not full: closed for one lease, then empty
    await asyncio.wait_for(waiting, 15)
    assert time.monotonic() - killed >= 1.0  # it did wait for the new controller: 100 units at 50/s from empty
    assert second.election.elected[-1][0] > 0


async def test_a_controller_that_cannot_renew_stops_serving_within_one_ttl_and_another_takes_over(
        join: Join) -> None:
    first = await join("w1")
    await eventually(lambda: first.election.serving)
    second = await join("w2")
    await first.engine.close()  # cut off from the engine: its renewals fail, its NATS clients still work
    cut = time.monotonic()
    await eventually(lambda: not first.election.serving)
    assert time.monotonic() - cut <= TTL + 0.6
    await eventually(lambda: second.election.serving)
    assert first.throttling.controller is None
    factory = first.throttling.factory("c")
    await asyncio.wait_for(factory.get_throttler_or_throw("q").throttle(1), 10)  # served by the new one


async def test_an_orderly_stop_releases_the_lease_and_another_takes_it_at_once(join: Join) -> None:
    first = await join("w1")
    await eventually(lambda: first.election.serving)
    second = await join("w2")
    first.task.cancel()
    await asyncio.gather(first.task, return_exceptions=True)
    await first.election.stop()
    stopped = time.monotonic()
    await eventually(lambda: second.election.serving)
    assert time.monotonic() - stopped < 1.5  # the retry period, not the TTL


async def test_dynamic_spec_throttlers_reach_the_controller_and_a_new_one_starts_from_them(join: Join) -> None:
    first = await join("w1")
    await eventually(lambda: first.election.serving)
    second = await join("w2")
    changed = DynamicSpec(throttlers={"q": {**QUICK, "limit": 7}, "fresh": QUICK})
    first.throttling.reconfigure(changed)
    second.throttling.reconfigure(changed)
    controller = first.throttling.controller
    assert controller is not None
    assert controller.throttler_ids == ["fresh", "q"]
    assert controller.spec("q").limit == 7
    factory = second.throttling.factory("c")
    await asyncio.wait_for(factory.get_throttler_or_throw("fresh").throttle(1), 10)
    await die(first)
    await eventually(lambda: second.election.serving)
    successor = second.throttling.controller
    assert successor is not None
    assert successor.throttler_ids == ["fresh", "q"]
    assert successor.spec("q").limit == 7


async def test_a_controller_whose_engine_hangs_through_an_outage_ends_its_term_and_starts_afresh_after(
        own_nats_server: NatsServer) -> None:
    async with joining(own_nats_server.url, "egress_el_outage") as start:
        member = await start("w1")
        await eventually(lambda: member.election.serving)
        before = member.throttling.controller
        own_nats_server.kill()  # the engine waits out the outage: renewals hang, they do not fail
        killed = time.monotonic()
        await eventually(lambda: member.throttling.controller is None)
        assert time.monotonic() - killed <= TTL + 0.6
        assert not member.election.serving
        own_nats_server.start()
        await eventually(lambda: member.election.serving, timeout=30)
        after = member.throttling.controller
        assert after is not None
        assert after is not before  # a new term: closed for one lease, then empty, not the old bucket
        assert after.empty_since is not None
