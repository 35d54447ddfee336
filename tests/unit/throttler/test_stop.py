"""A handle's ``throttle`` gives up when its job stops (``ThrottlerFactory.stopping``), on the
virtual clock: a waiting call raises ``ThrottleInterruptedError`` and takes no units, a call that
need not wait is still served."""

from __future__ import annotations

import asyncio

import pytest

from egress.throttler.errors import ThrottleInterruptedError
from tests.unit.throttler.test_client import setup, specs


async def test_a_waiting_call_gives_up_when_the_job_stops_and_takes_no_units() -> None:
    clock, controller, _transport, factory = setup(specs(q={"limit": 1, "period": "10s"}))
    factory.stopping = stop = asyncio.Event()
    handle = factory.get_throttler_or_throw("q")
    async with clock.autojumping():
        await handle.throttle(10)  # the burst: one period's worth
    waiting = asyncio.create_task(handle.throttle(5))
    await asyncio.sleep(0)
    assert not waiting.done()
    stop.set()
    with pytest.raises(ThrottleInterruptedError, match='throttler "q" was given up: the job is stopping'):
        await waiting
    assert factory.interrupted
    client = factory.client("q")
    assert client is not None
    assert not client._queue, "the given-up call left the queue"
    await factory.aclose()
    await controller.aclose()


async def test_a_call_that_need_not_wait_is_served_while_the_job_stops() -> None:
    clock, controller, _transport, factory = setup(specs(q={"limit": 10, "period": "1s"}))
    factory.stopping = stop = asyncio.Event()
    handle = factory.get_throttler_or_throw("q")
    async with clock.autojumping():
        await handle.throttle(1)
    handle.release(1)  # back on hand
    client = factory.client("q")
    assert client is not None
    assert client.on_hand >= 1
    stop.set()
    await handle.throttle(1)
    assert not factory.interrupted
    await factory.aclose()
    await controller.aclose()
