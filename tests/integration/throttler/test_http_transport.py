"""The throttler service over real HTTP on loopback: client/server tests of the contract."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from egress.clock import RealClock
from egress.throttler.controller import Grant
from egress.throttler.errors import ControllerUnavailableError, QuotaAmountError, UnknownThrottlerError
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.http_transport import HttpTransport
from egress.throttler.service import REPLY_ALLOWANCE, ThrottlerService, load_throttlers
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def write_dynamic(path: Path, throttlers: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"throttlers": throttlers}))
    return path


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ThrottlerService]:
    dynamic = write_dynamic(tmp_path / "dynamic.yaml", {
        "q": {"limit": 10, "period": "1s", "classes": {"vip": {"weight": 5}}},
        "slow": {"limit": 1, "period": "1s"}})
    running = ThrottlerService(dynamic, RealClock(), reload_period=0.05)
    await running.start()
    yield running
    await running.stop()


async def test_unknown_throttler(service: ThrottlerService) -> None:
    transport = HttpTransport(service.url)
    with pytest.raises(UnknownThrottlerError, match=r'^Unknown throttler "nope"$'):
        await transport.request_quota("nope", 1, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    await transport.aclose()


async def test_negative_amount_is_rejected(service: ThrottlerService) -> None:
    transport = HttpTransport(service.url)
    with pytest.raises(QuotaAmountError, match=r"^Quota amount must be non-negative, got -5$"):
        await transport.request_quota("q", -5, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    await transport.aclose()


async def test_configured_quota_class_crosses_rpc(service: ThrottlerService) -> None:
    transport = HttpTransport(service.url)
    factory = ThrottlerFactory(transport, RealClock(), load_throttlers(service.path), class_ids={"q": "vip"})
    await factory.get_throttler_or_throw("q").throttle(3)
    assert service.controller.queue("q").class_counters()["vip"][0] == 3.0
    async with aiohttp.ClientSession() as session, session.get(service.url + "/metrics") as response:
        text = await response.text()
    assert 'egress_throttler_class_granted_total{quota_class="vip",throttler_id="q"} 3.0' in text
    assert 'egress_throttler_queue_size{throttler_id="q"} 0.0' in text
    await factory.aclose()
    await transport.aclose()


async def test_canceled_request_stops_blocking_other_requests(service: ThrottlerService) -> None:
    transport = HttpTransport(service.url)
    await transport.request_quota("slow", 1, timestamp=0, quota_class_id=None, client_id="a", rpc_timeout=5)
    # A huge request first in line (most lagging), then a small one; the huge one gives up (closes its
    # connection) after 0.3 s: the service cancels and refunds it and the small one goes through.
    huge = asyncio.create_task(transport.request_quota("slow", 1000, timestamp=0, quota_class_id=None,
                                                       client_id="a", rpc_timeout=0.3))
    await eventually(lambda: service.controller.queue("slow").queue_size == 1)  # the huge one is first in line
    started = time.monotonic()
    other = HttpTransport(service.url)
    await other.request_quota("slow", 1, timestamp=1, quota_class_id=None, client_id="b", rpc_timeout=10)
    waited = time.monotonic() - started
    with pytest.raises(ControllerUnavailableError, match="timed out"):
        await huge
    assert waited < 3.0  # not 1000 s
    await eventually(lambda: service.controller.queue("slow").queue_size == 0, what="the huge request refunded")
    await transport.aclose()
    await other.aclose()


async def test_dynamic_spec_file_is_applied_live(service: ThrottlerService) -> None:
    write_dynamic(service.path, {"q": {"limit": 10}, "fresh": {"limit": 5}})
    await eventually(lambda: "fresh" in service.controller.throttler_ids, what="the dynamic spec applied")
    assert service.controller.throttler_ids == ["fresh", "q"]
    service.path.write_text("throttlers: {bad: {limit: -1}}")
    assert not service.reload()  # read and refused (what the watcher does every reload_period)
    assert service.controller.throttler_ids == ["fresh", "q"]  # the last good configuration stays


async def test_service_down_is_unavailable_then_client_resumes(tmp_path: Path) -> None:
    dynamic = write_dynamic(tmp_path / "dynamic.yaml", {"q": {
        "limit": 100, "period": "1s", "request_period": "100ms",
        "retrying_channel": {"retry_backoff_time": "50ms", "max_backoff_time": "100ms"}}})
    first = ThrottlerService(dynamic, RealClock())
    await first.start()
    port = first.port
    transport = HttpTransport(first.url)
    factory = ThrottlerFactory(transport, RealClock(), load_throttlers(dynamic))
    handle = factory.get_throttler_or_throw("q")
    await handle.throttle(1)
    await first.stop()
    client = factory.client("q")
    assert client is not None
    assert client.on_hand == 0  # nothing prefetched: the next call needs a controller
    asked = client.rpc_count
    waiting = asyncio.create_task(handle.throttle(1))
    await eventually(lambda: client.controller_away and client.rpc_count >= asked + 2)  # tried, failed, tried again
    assert not waiting.done()  # waits, does not fail
    second = ThrottlerService(dynamic, RealClock(), port=port)
    await second.start()
    await asyncio.wait_for(waiting, 10)
    await factory.aclose()
    await transport.aclose()
    await second.stop()


async def test_a_lease_crosses_the_rpc_and_ends_no_later_than_the_controller_counted(
        service: ThrottlerService) -> None:
    ends: list[float] = []
    request_quota = service.controller.request_quota

    async def recording(*args: Any, **kwargs: Any) -> Grant:
        grant = await request_quota(*args, **kwargs)
        ends.append(grant.until)
        return grant

    service.controller.request_quota = recording  # type: ignore[method-assign]
    transport = HttpTransport(service.url)
    grant = await transport.request_quota("q", 2, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5,
                                          hold=0.3)
    assert grant.amount == 2.0
    # Both ends share this process's monotonic clock: the client's deadline never passes the lease
    # the controller counted, and falls short of it by no more than the round trip.
    assert ends[0] - 0.5 <= grant.until <= ends[0]
    assert ends[0] - time.monotonic() <= 0.3 + REPLY_ALLOWANCE
    await transport.aclose()


async def test_without_a_state_file_the_service_starts_empty_after_one_lease(tmp_path: Path) -> None:
    dynamic = write_dynamic(tmp_path / "dynamic.yaml", {"q": {"limit": 10, "period": "1s", "request_period": "200ms"}})
    service = ThrottlerService(dynamic, RealClock())
    await service.start()
    transport = HttpTransport(service.url)
    started = time.monotonic()
    await transport.request_quota("q", 2, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    waited = time.monotonic() - started
    assert 0.2 + REPLY_ALLOWANCE + 0.2 - 0.05 <= waited <= 1.5  # one lease, then 2 units of refill
    await transport.aclose()
    await service.stop()
    state = tmp_path / "state.json"
    fresh = ThrottlerService(dynamic, RealClock(), state_file=state)  # a first start with a state file: full
    await fresh.start()
    transport = HttpTransport(fresh.url)
    started = time.monotonic()
    await transport.request_quota("q", 10, timestamp=0, quota_class_id=None, client_id="c", rpc_timeout=5)
    assert time.monotonic() - started < 1.0  # an empty start waits a lease (0.2 s), then 10 units of refill (1 s)
    assert state.exists()
    await transport.aclose()
    await fresh.stop()
