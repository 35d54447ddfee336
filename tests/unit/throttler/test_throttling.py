"""The runtime's integration object: validation before start, input batches, live DynamicSpec, sensors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from egress.clock import VirtualClock
from egress.errors import SpecErrors
from egress.spec.models import DynamicSpec
from egress.throttler import ThrottlerNotConfiguredError, Throttling


def dynamic(**fields: Any) -> DynamicSpec:
    return DynamicSpec.model_validate(fields)


SPEC = dynamic(throttlers={"rows": {"limit": 10, "period": "1s", "classes": {"vip": {"weight": 5}}},
                           "bytes": {"limit": 1000, "period": "1s"}},
               computations={"c": {"input_rows_throttler_id": "rows", "input_rows_throttler_class_id": "vip",
                                   "input_bytes_throttler_id": "bytes"}})


async def test_invalid_dynamic_spec_is_rejected_before_start() -> None:
    with pytest.raises(SpecErrors, match="must name different throttlers"):
        Throttling(dynamic(throttlers={"t": {}}, computations={"c": {"input_rows_throttler_id": "t",
                                                                     "input_bytes_throttler_id": "t"}}),
                   VirtualClock(), file="dyn.yaml")


async def test_input_batches_wait_for_rows_and_bytes_in_the_computations_class() -> None:
    clock = VirtualClock()
    registry = CollectorRegistry()
    throttling = Throttling(SPEC, clock, registry=registry)
    factory = throttling.factory("c", client_id="c/0")
    batch = throttling.input_throttle("c", factory)
    assert batch.throttler_ids() == ("rows", "bytes")
    async with clock.autojumping():
        assert await batch.wait(10, 500) == 0.0
        waited = await batch.wait(5, 100)
    assert waited == pytest.approx(0.5)
    assert throttling.controller is not None
    assert throttling.controller.queue("rows").class_counters()["vip"][0] == 15.0
    assert registry.get_sample_value("egress_throttler_client_consumed_total",
                                     {"computation_id": "c", "throttler_id": "rows"}) == 15.0
    assert registry.get_sample_value("egress_throttler_class_granted_total",
                                     {"throttler_id": "rows", "quota_class": "vip"}) == 15.0
    await throttling.aclose()


async def test_reconfigure_reaches_controller_and_handles() -> None:
    clock = VirtualClock()
    throttling = Throttling(SPEC, clock)
    factory = throttling.factory("c")
    handle = factory.get_throttler_or_throw("bytes")
    throttling.reconfigure(dynamic(throttlers={"rows": {"limit": 10}}))
    assert throttling.input_throttle("c", factory).active is False
    with pytest.raises(ThrottlerNotConfiguredError, match='Throttler "bytes" is not configured for this client'):
        await handle.throttle(1)
    throttling.reconfigure(SPEC)
    async with clock.autojumping():  # declared again: it starts empty once its last lease has ended
        await handle.throttle(1)
    await throttling.close_factory(factory)
    with pytest.raises(ThrottlerNotConfiguredError):
        await handle.throttle(1)
    await throttling.aclose()


async def test_an_input_wait_given_up_on_stop_returns_none_and_gives_the_rows_units_back() -> None:
    clock = VirtualClock()
    registry = CollectorRegistry()
    throttling = Throttling(SPEC, clock, registry=registry)
    factory = throttling.factory("c", client_id="c/0")
    batch = throttling.input_throttle("c", factory)
    stop = asyncio.Event()
    async with clock.autojumping():
        assert await batch.wait_unless(stop, 10, 1000) == 0.0  # both buckets full: at once, and now empty
    waiting = asyncio.ensure_future(batch.wait_unless(stop, 5, 1000))
    await clock.advance(0.6)  # the rows are granted at 0.5 s; the bytes need 1 s
    assert not waiting.done()
    stop.set()
    assert await waiting is None
    # Given back (release): the batch used none of them (they are kept only while their lease lasts).
    assert registry.get_sample_value("egress_throttler_client_released_total",
                                     {"computation_id": "c", "throttler_id": "rows"}) == 5.0
    assert await batch.wait_unless(stop, 1, 1) is None  # asked after the stop: no wait at all
    await throttling.aclose()


async def test_the_seed_sensors_of_server_and_client_are_on_the_registry() -> None:
    """Seed 001's sensors: server value.rate (a counter), queue_size, wait_time.max; client
    consumed.rate, released.rate, wait_time.max, request_count.rate (counters and a gauge)."""
    clock = VirtualClock()
    registry = CollectorRegistry()
    throttling = Throttling(dynamic(throttlers={"rows": {"limit": 10, "period": "1s"}}), clock, registry=registry)
    handle = throttling.factory("c", client_id="c/0").get_throttler_or_throw("rows")
    client = {"computation_id": "c", "throttler_id": "rows"}
    server = {"throttler_id": "rows"}
    async with clock.autojumping():
        await handle.throttle(10)  # the full bucket
    waiting = asyncio.ensure_future(handle.throttle(5))
    await clock.advance(0.2)
    assert registry.get_sample_value("egress_throttler_queue_size", server) == 1.0
    assert registry.get_sample_value("egress_throttler_wait_time_seconds", server) == pytest.approx(0.2)
    await clock.advance(0.4)
    await waiting
    assert registry.get_sample_value("egress_throttler_queue_size", server) == 0.0
    assert registry.get_sample_value("egress_throttler_value_total", server) == pytest.approx(15.0)
    assert registry.get_sample_value("egress_throttler_client_consumed_total", client) == 15.0
    assert registry.get_sample_value("egress_throttler_client_wait_time_seconds", client) == pytest.approx(0.5)
    assert registry.get_sample_value("egress_throttler_client_request_count_total", client) == 2.0
    handle.release(2)
    assert registry.get_sample_value("egress_throttler_client_released_total", client) == 2.0
    await throttling.aclose()
