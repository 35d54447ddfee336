"""Prefetching client and factory over the in-process transport, on the virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.throttler.client import PrefetchingClient
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import (
    ControllerUnavailableError,
    QuotaAmountError,
    QuotaRequestFailedError,
    ThrottlerNotConfiguredError,
    UnknownThrottlerError,
)
from egress.throttler.factory import ThrottlerFactory, ThrottlerHandle
from egress.throttler.models import ThrottlerSpec
from egress.throttler.transport import InProcessTransport


def specs(**throttlers: dict[str, Any]) -> dict[str, ThrottlerSpec]:
    return {name: ThrottlerSpec.model_validate(fields) for name, fields in throttlers.items()}


class SwitchableTransport(InProcessTransport):
    """The in-process transport with a power switch: while ``down`` every call is refused at once."""

    def __init__(self, controller: ThrottlerController) -> None:
        super().__init__(controller)
        self.down = False
        self.calls: list[tuple[str, float, str | None]] = []
        self.holds: list[float] = []

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        self.calls.append((throttler_id, amount, quota_class_id))
        self.holds.append(hold)
        if self.down:
            raise ControllerUnavailableError("connection refused")
        return await super().request_quota(throttler_id, amount, timestamp=timestamp, quota_class_id=quota_class_id,
                                           client_id=client_id, rpc_timeout=rpc_timeout, hold=hold,
                                           request_id=request_id)


class DetachedTransport(InProcessTransport):
    """Reaches the controller as NATS does: a call the client gives up on (``give_up_after``
    seconds, as when a new controller announces itself, or a cancelled caller) is not cancelled at
    the controller, which keeps the request until told otherwise (:meth:`withdraw`)."""

    def __init__(self, controller: ThrottlerController, clock: VirtualClock, give_up_after: float) -> None:
        super().__init__(controller)
        self.clock = clock
        self.give_up_after = give_up_after

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        asking = asyncio.ensure_future(self.controller.request_quota(
            throttler_id, amount, timestamp=timestamp, quota_class_id=quota_class_id, client_id=client_id,
            hold=hold, request_id=request_id))
        asking.add_done_callback(lambda done: done.cancelled() or done.exception())  # nobody reads a lost answer
        giving_up = asyncio.ensure_future(self.clock.sleep(self.give_up_after))
        try:
            await asyncio.wait({asking, giving_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            giving_up.cancel()
        if not asking.done():
            raise ControllerUnavailableError("gave up on the RPC; the controller still holds the request")
        return asking.result()

    def withdraw(self, request_id: str) -> None:
        self.controller.withdraw(request_id, remember=60.0)


def setup(throttlers: dict[str, ThrottlerSpec], **factory_args: Any
          ) -> tuple[VirtualClock, ThrottlerController, SwitchableTransport, ThrottlerFactory]:
    clock = VirtualClock()
    controller = ThrottlerController(throttlers, clock)
    transport = SwitchableTransport(controller)
    return clock, controller, transport, ThrottlerFactory(transport, clock, throttlers, **factory_args)


async def test_prefetch_follows_the_contract() -> None:
    throttlers = specs(q={"limit": 100, "period": "1s", "request_period": "500ms"})
    clock, controller, transport, factory = setup(throttlers)
    handle = factory.get_throttler_or_throw("q")
    client = factory.client("q")
    assert client is not None
    assert client.spec.max_prefetch == 50
    assert client.window == 5.0
    await handle.throttle(1)  # nothing on hand: one RPC for max(prefetch = 1, deficit = 1)
    assert transport.calls == [("q", 1.0, None)]
    async with clock.autojumping():
        for _ in range(100):  # 10 units/s for 10 s
            await handle.throttle(1)
            await clock.sleep(0.1)
    # 10/s × request_period 0.5 s = 5, inside [1, 50]; the window (t - 5 s, t] holds 51 calls at 10/s → 6
    assert client.prefetch() == 5
    rpcs_in_the_last_5s = len(transport.calls)
    assert 10 <= rpcs_in_the_last_5s <= 40  # far fewer RPCs than calls: about 1 per request_period once warm
    assert [amount for _, amount, _ in transport.calls[-5:]] == [6.0] * 5
    await factory.aclose()
    await controller.aclose()


async def test_served_locally_when_nothing_queued_and_it_fits() -> None:
    _clock, controller, transport, factory = setup(specs(q={"limit": 10, "period": "1s", "request_period": "1s"}))
    handle = factory.get_throttler_or_throw("q")
    await handle.throttle(3)
    client = factory.client("q")
    assert client is not None
    client.release(4)  # only the 3 units taken can come back, while their quota's lease lasts
    assert client.on_hand == 3.0
    await handle.throttle(3)
    assert handle.try_acquire(1) is False
    assert len(transport.calls) == 1
    with pytest.raises(QuotaAmountError, match="Quota amount must be non-negative, got -1"):
        await handle.throttle(-1)
    await factory.aclose()
    await controller.aclose()


async def test_get_client_returns_same_handle_across_calls() -> None:
    _, controller, _, factory = setup(specs(q={"limit": 10}))
    assert factory.get_throttler_or_throw("q") is factory.get_throttler_or_throw("q")
    assert factory.try_get_throttler("q") is factory.get_throttler_or_throw("q")
    assert factory.try_get_throttler("other") is None
    with pytest.raises(ThrottlerNotConfiguredError, match='Throttler "other" is not configured for this client'):
        factory.get_throttler_or_throw("other")
    await controller.aclose()


async def test_handle_survives_reconfigure() -> None:
    clock, controller, _transport, factory = setup(specs(q={"limit": 10, "period": "1s"}))
    handle = factory.get_throttler_or_throw("q")
    await handle.throttle(1)
    new = specs(q={"limit": 1000, "period": "1s"})
    controller.reconfigure(new)
    factory.reconfigure(new)
    assert factory.get_throttler_or_throw("q") is handle
    async with clock.autojumping():
        await handle.throttle(500)
    assert clock.monotonic() <= 0.5
    await factory.aclose()
    await controller.aclose()


async def test_handle_throws_after_name_removed_and_resumes_after_readded() -> None:
    clock, controller, _transport, factory = setup(specs(q={"limit": 1, "period": "1s"}))
    handle = factory.get_throttler_or_throw("q")
    await handle.throttle(1)
    waiting = asyncio.create_task(handle.throttle(1))
    await asyncio.sleep(0)
    factory.reconfigure({})
    with pytest.raises(ThrottlerNotConfiguredError, match='Throttler "q" is not configured for this client'):
        await waiting
    with pytest.raises(ThrottlerNotConfiguredError, match='Throttler "q" is not configured for this client'):
        await handle.throttle(1)
    assert factory.try_get_throttler("q") is None
    factory.reconfigure(specs(q={"limit": 1, "period": "1s"}))
    async with clock.autojumping():
        await handle.throttle(1)  # the same handle works again
    assert factory.try_get_throttler("q") is handle
    await factory.aclose()
    await controller.aclose()


async def test_configured_quota_class_crosses_rpc() -> None:
    throttlers = specs(q={"limit": 100, "classes": {"vip": {"weight": 5}}})
    _, controller, transport, factory = setup(throttlers, class_ids={"q": "vip"})
    await factory.get_throttler_or_throw("q").throttle(7)
    assert transport.calls == [("q", 7.0, "vip")]
    assert controller.queue("q").class_counters()["vip"][0] == 7.0
    await factory.aclose()
    await controller.aclose()


async def test_failed_rpc_fails_every_queued_local_call() -> None:
    clock = VirtualClock()
    controller = ThrottlerController({}, clock)  # the controller does not know "q"
    factory = ThrottlerFactory(InProcessTransport(controller), clock, specs(q={"limit": 10}))
    handle = factory.get_throttler_or_throw("q")
    calls = [asyncio.create_task(handle.throttle(1)) for _ in range(5)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, UnknownThrottlerError) and str(r) == 'Unknown throttler "q"' for r in results)
    await factory.aclose()
    await controller.aclose()


async def test_waits_while_controller_is_away_and_resumes_by_itself() -> None:
    throttlers = specs(q={"limit": 10, "period": "1s", "retrying_channel": {"retry_backoff_time": "1s"}})
    clock, controller, transport, factory = setup(throttlers)
    handle = factory.get_throttler_or_throw("q")
    transport.down = True
    async with clock.autojumping():
        call = asyncio.create_task(handle.throttle(1))
        await clock.sleep(20.0)
        assert not call.done()
        transport.down = False
        await call
    assert 20.0 <= clock.monotonic() <= 20.0 + 16.0  # the backoff doubling 1, 2, 4, 8, 16 s
    await factory.aclose()
    await controller.aclose()


async def test_a_retried_rpc_asks_for_what_fits_the_burst_as_it_is_now() -> None:
    # An RPC folded under a burst of 10 (4 + 4 units) and retried after the burst shrank to 5 would
    # reach the controller beyond its burst, count as one call beyond it and be released whole.
    throttlers = specs(q={"limit": 10, "period": "1s", "retrying_channel": {"retry_backoff_time": "1s"}})
    clock, controller, transport, factory = setup(throttlers)
    handle = factory.get_throttler_or_throw("q")
    transport.down = True
    async with clock.autojumping():
        calls = [asyncio.create_task(handle.throttle(4)) for _ in range(3)]
        await clock.sleep(0.5)
        assert [amount for _, amount, _ in transport.calls] == [8.0]
        throttlers = specs(q={"limit": 5, "period": "1s", "retrying_channel": {"retry_backoff_time": "1s"}})
        controller.reconfigure(throttlers)
        factory.reconfigure(throttlers)
        transport.down = False
        await asyncio.gather(*calls)
    assert [amount for _, amount, _ in transport.calls[1:]] == [4.0, 4.0, 4.0]
    await factory.aclose()
    await controller.aclose()


async def test_raises_past_the_retry_budget() -> None:
    throttlers = specs(q={"limit": 10, "retrying_channel": {"retry_attempts": 4, "retry_backoff_time": "1s"}})
    clock, controller, transport, factory = setup(throttlers)
    handle = factory.get_throttler_or_throw("q")
    transport.down = True
    async with clock.autojumping():
        calls = [asyncio.create_task(handle.throttle(1)) for _ in range(3)]
        results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, QuotaRequestFailedError) for r in results)
    assert 'RequestQuota for throttler "q" failed after 4 attempt(s) in 7 s: connection refused' in str(results[0])
    assert clock.monotonic() == 7.0  # 1 + 2 + 4
    await factory.aclose()
    await controller.aclose()


async def test_retry_timeout_bounds_the_budget() -> None:
    throttlers = specs(q={"limit": 10, "retrying_channel": {"retry_timeout": "10s", "retry_backoff_time": "1s",
                                                            "enable_exponential_retry_backoffs": False}})
    clock, controller, transport, factory = setup(throttlers)
    transport.down = True
    async with clock.autojumping():
        with pytest.raises(QuotaRequestFailedError, match="failed after 11 attempt"):
            await factory.get_throttler_or_throw("q").throttle(1)
    assert clock.monotonic() == 10.0
    await factory.aclose()
    await controller.aclose()


async def test_safe_rate_serves_only_while_the_controller_is_away() -> None:
    throttlers = specs(q={"limit": 100, "period": "1s", "request_period": "1s", "safe_rate": 2,
                          "retrying_channel": {"retry_backoff_time": "1s", "enable_exponential_retry_backoffs": False}})
    clock, controller, transport, factory = setup(throttlers)
    handle = factory.get_throttler_or_throw("q")
    transport.down = True
    served: list[float] = []
    async with clock.autojumping():
        for _ in range(6):
            await handle.throttle(1)
            served.append(clock.monotonic())
    assert served == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])  # 2 units/s, nothing banked before
    transport.down = False
    async with clock.autojumping():
        await handle.throttle(1)
    await factory.aclose()
    await controller.aclose()


async def test_controller_timeout_refunds_and_retries() -> None:
    throttlers = specs(q={"limit": 1, "period": "1s", "rpc_timeout": "2s",
                          "retrying_channel": {"retry_attempts": 2, "retry_backoff_time": "1s"}})
    clock, controller, _transport, factory = setup(throttlers)
    await controller.request_quota("q", 1)
    async with clock.autojumping():
        with pytest.raises(QuotaRequestFailedError, match="timed out after 2 s"):
            await factory.get_throttler_or_throw("q").throttle(100)
    assert controller.queue("q").queue_size == 0  # both timed-out requests were withdrawn
    await factory.aclose()
    await controller.aclose()


async def test_waiting_calls_are_served_within_the_burst_not_lumped_into_one_release() -> None:
    # Hypothesis's smallest case: two calls of one unit at once on a burst of one unit. They used to
    # share one RPC of 2 units, granted in two chunks and handed out together at 0.1 s.
    clock, controller, transport, factory = setup(specs(q={"limit": 10, "period": "100ms"}))
    handle = factory.get_throttler_or_throw("q")
    served: list[float] = []

    async def call() -> None:
        await handle.throttle(1)
        served.append(clock.monotonic())

    async with clock.autojumping():
        await asyncio.gather(*(call() for _ in range(30)))
    assert served == pytest.approx([i * 0.1 for i in range(30)])
    assert max(amount for _, amount, _ in transport.calls) <= 1.0  # no RPC beyond the burst
    await factory.aclose()
    await controller.aclose()


def fast_prefetch() -> tuple[VirtualClock, ThrottlerController, SwitchableTransport, ThrottlerFactory,
                             PrefetchingClient, ThrottlerHandle]:
    """Limit 100/s, period 1 s, request_period 200 ms (prefetch_lease 200 ms): its client and handle."""
    clock, controller, transport, factory = setup(specs(q={"limit": 100, "period": "1s", "request_period": "200ms"}))
    client = factory.client("q")
    assert client is not None
    return clock, controller, transport, factory, client, factory.get_throttler_or_throw("q")


async def test_prefetched_quota_is_held_for_one_lease_then_dropped() -> None:
    clock, controller, transport, factory, client, handle = fast_prefetch()
    async with clock.autojumping():
        for _ in range(50):  # 20 units/s over the 2 s window: the prefetch grows to ceil(20 × 0.2) = 4
            await handle.throttle(1)
            await clock.sleep(0.05)
        while client.on_hand > 0:
            await handle.throttle(1)
        await handle.throttle(1)
    fetched = transport.calls[-1][1]
    assert fetched >= 4.0  # 1 for the call, the rest held:
    assert transport.holds[-1] == 0.2
    assert client.on_hand == fetched - 1
    lease_end = clock.monotonic() + 0.2
    async with clock.autojumping():
        await clock.sleep_until(lease_end)
    assert client.on_hand == fetched - 1  # usable up to the end of the lease
    async with clock.autojumping():
        await clock.sleep(0.001)
    assert client.on_hand == 0.0  # then dropped: the controller counted them as used by then
    release_bucket = controller.queue("q").release_bucket
    release_bucket.tokens(clock.monotonic())
    assert release_bucket.leased == 0.0  # and the bucket no longer holds room for them
    await factory.aclose()
    await controller.aclose()


async def test_an_rpc_for_waiting_calls_only_asks_no_lease() -> None:
    clock, controller, transport, factory = setup(specs(q={"limit": 10, "period": "1s"}))
    handle = factory.get_throttler_or_throw("q")
    async with clock.autojumping():
        await asyncio.gather(*(handle.throttle(1) for _ in range(3)))
    assert transport.holds == [0.0]
    assert transport.calls == [("q", 3.0, None)]
    await factory.aclose()
    await controller.aclose()


async def test_released_units_return_only_while_the_quota_they_came_from_lasts() -> None:
    clock, controller, _transport, factory, client, handle = fast_prefetch()
    await handle.throttle(2)  # for a waiting call: usable at once only
    async with clock.autojumping():
        await clock.sleep(0.1)
    handle.release(2)
    assert client.on_hand == 0.0  # their quota's lease has ended: they cannot come back
    await factory.aclose()
    await controller.aclose()


async def test_retries_of_rpcs_the_client_gave_up_on_still_receive_the_limit() -> None:
    """Every RPC is given up after 0.3 s while the controller keeps the request (as over NATS when
    a new controller announces itself): the retry replaces the copy still waiting, so the units
    reach the caller at the limit; a second copy ahead of the retry would take them to nobody."""
    throttlers = specs(q={"limit": 10, "period": "1s", "request_period": "1s",
                          "retrying_channel": {"retry_backoff_time": "100ms", "retry_attempts": 10_000,
                                               "enable_exponential_retry_backoffs": False}})
    clock = VirtualClock()
    controller = ThrottlerController(throttlers, clock)
    factory = ThrottlerFactory(DetachedTransport(controller, clock, give_up_after=0.3), clock, throttlers)
    handle = factory.get_throttler_or_throw("q")
    received = 0.0

    async def call() -> None:
        nonlocal received
        while True:
            await handle.throttle(5)  # 0.5 s of the limit each: longer than an RPC lasts
            received += 5

    async with clock.autojumping():
        caller = asyncio.ensure_future(call())
        await clock.sleep(20.0)
        assert controller.queue("q").queue_size <= 1  # one waiter per request, never a second copy
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
    # limit·T plus the full bucket at the start, less the call and the retry in flight at the end
    assert 10 * 20 + 10 - 5 - 10 <= received <= 10 * 20 + 10, received
    await factory.aclose()
    await controller.aclose()


async def test_a_call_cancelled_while_its_rpc_waits_withdraws_the_request_at_the_controller() -> None:
    throttlers = specs(q={"limit": 1, "period": "1s"})
    clock = VirtualClock()
    controller = ThrottlerController(throttlers, clock)
    factory = ThrottlerFactory(DetachedTransport(controller, clock, give_up_after=1e9), clock, throttlers)
    handle = factory.get_throttler_or_throw("q")
    await handle.throttle(1)  # the full bucket
    waiting = asyncio.ensure_future(handle.throttle(1000))
    for _ in range(20):
        await asyncio.sleep(0)
    assert controller.queue("q").queue_size == 1
    waiting.cancel()  # the job stops (its partition moved, Ctrl-C): nobody will use those units
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(20):
        await asyncio.sleep(0)
    assert controller.queue("q").queue_size == 0  # refunded at once, not held until its rpc_timeout
    await factory.aclose()
    await controller.aclose()
