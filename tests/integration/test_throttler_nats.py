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
from egress.throttler.nats_transport import REPLY_ALLOWANCE, NatsConnection, NatsQuotaServer, NatsTransport

pytestmark = pytest.mark.integration

THROTTLERS = {"q": {"limit": 10, "period": "1s", "classes": {"vip": {"weight": 5}}},
              "slow": {"limit": 1, "period": "1s"},
              "quick": {"limit": 100, "period": "1s", "request_period": "100ms",
                        "retrying_channel": {"retry_backoff_time": "50ms", "max_backoff_time": "100ms"}}}


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
    for _ in range(500):
        if controller.queue("slow").queue_size == 1:
            break
        await asyncio.sleep(0.01)
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
    for _ in range(500):  # a positive signal: the client retried at least twice
        if client.rpc_count >= 2:
            break
        await asyncio.sleep(0.01)
    assert client.rpc_count >= 2
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
