"""RequestQuota over NATS request/reply against a real nats-server: the transport's contract."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from egress.clock import RealClock
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import ControllerUnavailableError, QuotaAmountError, UnknownThrottlerError
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.models import validate_throttlers
from egress.throttler.nats_transport import (
    REPLY_ALLOWANCE,
    NatsConnection,
    NatsQuotaServer,
    NatsTransport,
    announce_subject,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration

THROTTLERS = {"q": {"limit": 10, "period": "1s", "classes": {"vip": {"weight": 5}}},
              "slow": {"limit": 1, "period": "1s"},
              "quick": {"limit": 100, "period": "1s", "request_period": "100ms",
                        "retrying_channel": {"retry_backoff_time": "50ms", "max_backoff_time": "100ms"}},
              "retried": {"limit": 10, "period": "1s", "request_period": "250ms",
                          "retrying_channel": {"retry_backoff_time": "50ms",
                                               "enable_exponential_retry_backoffs": False}}}


def specs() -> Any:
    return validate_throttlers(THROTTLERS)


@pytest.fixture
async def connection(nats_server: str) -> AsyncIterator[NatsConnection]:
    opened = NatsConnection([nats_server])
    yield opened
    await opened.aclose()


@pytest.fixture
def subject() -> str:
    return f"egress.test_{uuid.uuid4().hex}.throttler.request_quota"


@pytest.fixture
async def server(connection: NatsConnection, subject: str) -> AsyncIterator[NatsQuotaServer]:
    controller = ThrottlerController(specs(), RealClock(), allowance=REPLY_ALLOWANCE)
    serving = NatsQuotaServer(controller, connection, subject)
    await serving.start()
    yield serving
    await serving.stop()


async def waiting_at(controller: ThrottlerController, transport: NatsTransport,
                     rpc_timeout: float) -> asyncio.Task[Grant]:
    """A request of 1000 units of "slow" (1/s), once it waits at ``controller``."""
    task = asyncio.create_task(transport.request_quota("slow", 1000, timestamp=0, quota_class_id=None,
                                                       client_id="a", rpc_timeout=rpc_timeout))
    await eventually(lambda: controller.queue("slow").queue_size == 1, what="the request waiting at the controller")
    return task


async def test_the_controllers_errors_cross_nats_with_upstream_texts(server: NatsQuotaServer,
                                                                     connection: NatsConnection) -> None:
    transport = NatsTransport(connection, server.subject)
    with pytest.raises(UnknownThrottlerError, match=r'^Unknown throttler "nope"$'):
        await transport.request_quota("nope", 1, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    with pytest.raises(QuotaAmountError, match=r"^Quota amount must be non-negative, got -5$"):
        await transport.request_quota("q", -5, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)


async def test_the_quota_class_crosses_nats(server: NatsQuotaServer, connection: NatsConnection) -> None:
    factory = ThrottlerFactory(NatsTransport(connection, server.subject), RealClock(), specs(), class_ids={"q": "vip"})
    await factory.get_throttler_or_throw("q").throttle(3)
    assert server.controller.queue("q").class_counters()["vip"][0] == 3.0
    await factory.aclose()


async def test_a_request_past_its_rpc_timeout_is_refunded_and_stops_blocking_others(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    transport = NatsTransport(connection, server.subject)
    await transport.request_quota("slow", 1, timestamp=0, quota_class_id=None, client_id="a", rpc_timeout=5)
    huge = await waiting_at(server.controller, transport, rpc_timeout=0.3)  # first in line
    started = time.monotonic()
    await transport.request_quota("slow", 1, timestamp=1, quota_class_id=None, client_id="b", rpc_timeout=10)
    assert time.monotonic() - started < 3.0  # not 1000 s: the server cancelled the huge one at its rpc_timeout
    with pytest.raises(ControllerUnavailableError, match="timed out"):
        await huge
    assert server.controller.queue("slow").queue_size == 0


async def test_a_lease_crosses_nats_and_ends_no_later_than_the_controller_counted(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    ends: list[float] = []
    request_quota = server.controller.request_quota

    async def recording(*args: Any, **kwargs: Any) -> Grant:
        grant = await request_quota(*args, **kwargs)
        ends.append(grant.until)
        return grant

    server.controller.request_quota = recording  # type: ignore[method-assign]
    grant = await NatsTransport(connection, server.subject).request_quota(
        "q", 2, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5, hold=0.3)
    assert grant.amount == 2.0
    assert ends[0] - 0.5 <= grant.until <= ends[0]  # one monotonic clock: never later, short by the round trip
    assert ends[0] - time.monotonic() <= 0.3 + REPLY_ALLOWANCE


async def test_without_a_controller_calls_wait_and_resume_when_one_serves(
        connection: NatsConnection, subject: str) -> None:
    transport = NatsTransport(connection, subject)
    with pytest.raises(ControllerUnavailableError, match="no responders"):
        await transport.request_quota("quick", 1, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    factory = ThrottlerFactory(transport, RealClock(), specs())
    waiting = asyncio.create_task(factory.get_throttler_or_throw("quick").throttle(1))
    client = factory.client("quick")
    assert client is not None
    await eventually(lambda: client.rpc_count >= 2, what="the client retried at least twice")
    assert not waiting.done()
    serving = NatsQuotaServer(ThrottlerController(specs(), RealClock()), connection, subject)
    await serving.start()
    await asyncio.wait_for(waiting, 10)
    await factory.aclose()
    await serving.stop()


async def test_a_stopping_server_answers_its_waiting_requests_unavailable_at_once(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    transport = NatsTransport(connection, server.subject)
    waiting = await waiting_at(server.controller, transport, rpc_timeout=30)
    started = time.monotonic()
    await server.stop()
    with pytest.raises(ControllerUnavailableError, match="closed"):
        await waiting
    assert time.monotonic() - started < 5  # not the 30 s rpc_timeout: the client may retry with the next one


async def test_an_unreachable_nats_is_unavailable(subject: str) -> None:
    unreachable = NatsConnection(["nats://127.0.0.1:1"], connect_timeout=1)
    transport = NatsTransport(unreachable, subject)
    with pytest.raises(ControllerUnavailableError, match="cannot connect"):
        await transport.request_quota("q", 1, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    await unreachable.aclose()


async def test_a_request_held_by_a_dead_controller_is_retried_once_another_begins_serving(
        nats_server: str, connection: NatsConnection, subject: str) -> None:
    dying_connection = NatsConnection([nats_server])
    dying = NatsQuotaServer(ThrottlerController(specs(), RealClock()), dying_connection, subject)
    await dying.start()
    transport = NatsTransport(connection, subject)
    await transport.request_quota("slow", 1, timestamp=0, quota_class_id=None, client_id="a", rpc_timeout=5)
    held = await waiting_at(dying.controller, transport, rpc_timeout=30)
    await dying_connection.aclose()  # gone without a reply, as a SIGKILLed worker
    started = time.monotonic()
    successor = NatsQuotaServer(ThrottlerController(specs(), RealClock()), connection, subject)
    await successor.start()
    with pytest.raises(ControllerUnavailableError, match="a new throttler controller serves"):
        await held
    assert time.monotonic() - started < 5  # not the 30 s rpc_timeout
    await successor.stop()
    await dying.controller.aclose()
    await transport.aclose()


async def queue_size_becomes(controller: ThrottlerController, throttler_id: str, size: int, within: float) -> None:
    """The controller's ``queue_size`` of ``throttler_id`` reaches ``size`` within ``within`` s (or the test fails)."""
    await eventually(lambda: controller.queue(throttler_id).queue_size == size, timeout=within,
                     what=f"{throttler_id}'s queue size {size}")


async def test_a_request_its_client_gives_up_stops_waiting_at_the_controller_at_once(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    transport = NatsTransport(connection, server.subject)
    factory = ThrottlerFactory(transport, RealClock(), specs())
    handle = factory.get_throttler_or_throw("slow")
    await handle.throttle(1)  # the full bucket
    waiting = asyncio.create_task(handle.throttle(1000))
    await queue_size_becomes(server.controller, "slow", 1, within=5.0)
    waiting.cancel()  # the job stopped (its partition moved, Ctrl-C): nobody will use the units
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # not its 30 s rpc_timeout: the client withdrew it, and it is refunded
    await queue_size_becomes(server.controller, "slow", 0, within=3.0)
    await factory.aclose()
    await transport.aclose()


async def test_a_request_asked_again_replaces_the_copy_still_waiting_so_no_duplicate_waiter_holds_units(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    transport = NatsTransport(connection, server.subject)
    asks = [asyncio.create_task(transport.request_quota(
        "slow", 1000, timestamp=0, quota_class_id=None, client_id="a", rpc_timeout=30, request_id="r1"))]
    await queue_size_becomes(server.controller, "slow", 1, within=5.0)
    queue = server.controller.queue("slow")
    first_enqueued = {oldest for _, _, oldest in queue.pending().values()} - {None}
    client = await connection.get()
    await client.publish(announce_subject(server.subject), b"")  # as a new controller does: the client gives up
    with pytest.raises(ControllerUnavailableError, match="a new throttler controller serves"):
        await asks[0]
    asks.append(asyncio.create_task(transport.request_quota(  # the retry: the same request, asked again
        "slow", 1000, timestamp=0, quota_class_id=None, client_id="a", rpc_timeout=30, request_id="r1")))
    # The retry has arrived once the oldest waiting request is not the first copy any more (a
    # positive signal); the controller replaces a copy in one step, so the size is final then.
    await eventually(lambda: {oldest for _, _, oldest in queue.pending().values()} - {None} - first_enqueued,
                     what="the retry at the controller in place of the first copy", timeout=10.0)
    assert queue.queue_size == 1
    asks[1].cancel()
    await transport.aclose()


async def test_retries_at_a_controller_that_keeps_the_first_copies_still_reach_the_limit(
        server: NatsQuotaServer, connection: NatsConnection) -> None:
    """Three callers of "retried" (10/s, burst 10, retries after 50 ms) keep asking while every
    request in flight is given up every 0.5 s (an announcement, as from a new controller): the rate
    they receive stays the limit, less one call in flight per caller."""
    transport = NatsTransport(connection, server.subject)
    factory = ThrottlerFactory(transport, RealClock(), specs())
    handle = factory.get_throttler_or_throw("retried")
    client = await connection.get()
    received = 0.0

    async def call(amount: float) -> None:
        nonlocal received
        while True:
            await handle.throttle(amount)
            received += amount

    started = time.monotonic()
    callers = [asyncio.create_task(call(4)) for _ in range(3)]
    for _ in range(8):
        await asyncio.sleep(0.5)
        await client.publish(announce_subject(server.subject), b"")
    elapsed = time.monotonic() - started
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await factory.aclose()
    await transport.aclose()
    assert received >= 10 * elapsed - 3 * 4, f"{received:g} units in {elapsed:.2f} s at a limit of 10/s"
