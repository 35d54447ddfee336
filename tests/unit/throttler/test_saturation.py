"""Weighted classes at saturation and cancelled chunked requests, at the point of use (the callers of
``throttle()``), on the virtual clock: prefetching clients, the in-process transport, the controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.throttler.client import PrefetchingClient
from egress.throttler.controller import ThrottlerController
from egress.throttler.models import ThrottlerSpec
from egress.throttler.shares import longest_gap, share_range, units_timeline
from egress.throttler.transport import InProcessTransport

REQUEST_PERIOD = 0.1
SATURATED = {"limit": 100, "period": "1s", "request_period": "100ms", "max_grant_amount": 5,
             "classes": {"heavy": {"weight": 9.0}, "light": {"weight": 1.0}}}


def spec(**fields: Any) -> ThrottlerSpec:
    return ThrottlerSpec.model_validate(fields)


async def saturate(throttler: ThrottlerSpec, seconds: float, *, clients: int = 2,
                   callers: int = 16) -> list[tuple[float, str, float]]:
    """``clients`` prefetching clients per class, each with ``callers`` callers asking 1 unit in a
    loop, for ``seconds`` of virtual time: the record ``(time, class, 1)`` of every call that
    returned while every caller was still asking (the drain at the end is not saturation)."""
    clock = VirtualClock()
    controller = ThrottlerController({"q": throttler}, clock)
    transport = InProcessTransport(controller)
    record: list[tuple[float, str, float]] = []
    pool = [PrefetchingClient("q", throttler, transport, clock, client_id=f"{class_id}{i}", class_id=class_id)
            for class_id in throttler.classes for i in range(clients)]

    async def caller(client: PrefetchingClient) -> None:
        while clock.monotonic() < seconds:
            await client.throttle(1)
            if clock.monotonic() < seconds:
                record.append((clock.monotonic(), str(client.class_id), 1.0))

    async with clock.autojumping():
        await asyncio.gather(*(caller(client) for client in pool for _ in range(callers)))
    await controller.aclose()
    return record


async def test_saturated_classes_9_to_1_get_their_weight_in_every_5s_window_without_long_gaps() -> None:
    record = await saturate(spec(**SATURATED), 8.0)
    lowest, highest = share_range(record, "light", 5.0)
    assert 0.08 <= lowest <= highest <= 0.12, (lowest, highest)
    assert longest_gap(record, "light") <= 3 * REQUEST_PERIOD
    # the grants' own timeline says the same: 5 s at the limit are 500 units, 3 request periods 30
    timeline = units_timeline((class_id, units) for _, class_id, units in record)
    lowest, highest = share_range(timeline, "light", 500.0)
    assert 0.08 <= lowest <= highest <= 0.12, (lowest, highest)
    assert longest_gap(timeline, "light") <= 30.0


@pytest.mark.parametrize(("weights", "class_id", "expected"), [
    ({"heavy": 9.0, "light": 1.0}, "light", 1.0),  # 100/s × 1/11 × 0.1 s = 0.9 → 1 (one call at least)
    ({"heavy": 9.0, "light": 1.0}, "heavy", 9.0),  # 100/s × 9/11 × 0.1 s = 8.2 → 9
    ({"heavy": 9.0, "light": 1.0}, None, 1.0),  # served as default: weight 1.0
    ({}, None, 100.0),  # no classes: one queue, the burst (limit × period)
])
def test_one_rpc_asks_at_most_its_class_share_of_one_request_period(
    weights: dict[str, float], class_id: str | None, expected: float,
) -> None:
    throttler = spec(limit=100, period="1s", request_period="100ms",
                     classes={c: {"weight": w} for c, w in weights.items()})
    assert throttler.request_quantum(class_id) == expected


async def test_a_cancelled_chunked_request_gives_back_all_it_holds_so_the_next_request_of_3_does_not_wait() -> None:
    # heavy saturates the bucket, so it never fills up while the light request holds its chunks:
    # without the light request it would hold every unit the request took
    throttler = spec(limit=10, period="2s", request_period="100ms", max_grant_amount=5,
                     classes={"heavy": {"weight": 9.0}, "light": {"weight": 1.0}})
    clock = VirtualClock()
    controller = ThrottlerController({"q": throttler}, clock)
    transport = InProcessTransport(controller)
    heavy = PrefetchingClient("q", throttler, transport, clock, client_id="h", class_id="heavy")
    light = PrefetchingClient("q", throttler, transport, clock, client_id="l", class_id="light")
    queue = controller.queue("q")
    stopping = asyncio.Event()

    async def heavy_caller() -> None:
        while not stopping.is_set():
            await heavy.throttle(1)

    async with clock.autojumping():
        callers = [asyncio.create_task(heavy_caller()) for _ in range(16)]
        await clock.sleep(3.0)  # the burst is spent: heavy takes every token as it comes
        big = asyncio.create_task(light.throttle(40))
        while queue.class_counters()["light"][0] < 15:  # three chunks of 5 granted, 25 units to go
            await clock.sleep(0.01)
        await clock.sleep(0.5)  # heavy took every token since: the bucket holds less than 1
        assert queue.bucket.tokens(clock.monotonic()) < 1.0
        big.cancel()
        await asyncio.gather(big, return_exceptions=True)
        granted, refunded, _ = queue.class_counters()["light"]
        assert (granted, refunded) == (0.0, 15.0)
        asked = clock.monotonic()
        await light.throttle(3)
        assert clock.monotonic() == asked  # granted from what came back, at once
        stopping.set()
        await asyncio.gather(*callers)
    await controller.aclose()
