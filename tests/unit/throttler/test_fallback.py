"""``fallback_rate``: while no controller answers, the clients of one process share
``fallback_rate / live workers`` units/s (virtual clock, exact)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.errors import SpecErrors
from egress.spec.models import DynamicSpec
from egress.throttler import ThrottlerController, Throttling
from egress.throttler.errors import ControllerUnavailableError
from egress.throttler.fallback import AwayBudget
from egress.throttler.models import validate_throttlers
from egress.throttler.transport import InProcessTransport

RETRY = {"retry_backoff_time": "100ms", "enable_exponential_retry_backoffs": False, "retry_attempts": 1000}


class Away:
    """A transport whose controller is closed (unreachable) while ``down``."""

    def __init__(self, clock: VirtualClock, throttlers: dict[str, Any]) -> None:
        self.controller = ThrottlerController(validate_throttlers(throttlers), clock)
        self.inner = InProcessTransport(self.controller)
        self.down = True

    async def request_quota(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise ControllerUnavailableError("no controller")
        return await self.inner.request_quota(*args, **kwargs)

    def withdraw(self, request_id: str) -> None:
        self.inner.withdraw(request_id)

    async def aclose(self) -> None:
        await self.controller.aclose()


def away(throttlers: dict[str, Any]) -> tuple[VirtualClock, Away, Throttling]:
    """A virtual clock, a transport whose controller is away, and a Throttling using it."""
    clock = VirtualClock()
    transport = Away(clock, throttlers)
    return clock, transport, Throttling(DynamicSpec(throttlers=throttlers), clock, transport=transport)


async def test_the_clients_of_a_process_share_fallback_rate_divided_by_the_live_workers() -> None:
    throttlers = {"q": {"limit": 30, "period": "1s", "request_period": "500ms", "fallback_rate": 6,
                        "retrying_channel": RETRY}}
    clock, _, throttling = away(throttlers)
    throttling.live_workers = 3  # this process may use 6 / 3 = 2 units/s, whatever its number of clients
    served: list[float] = []

    async def caller(name: str) -> None:
        handle = throttling.factory(name).get_throttler_or_throw("q")
        while clock.monotonic() < 10:
            await handle.throttle(1)
            served.append(clock.monotonic())

    async with clock.autojumping():
        await asyncio.gather(*(caller(f"c{i}") for i in range(3)))
    in_ten_seconds = [t for t in served if t <= 10]
    # Empty at the start of the outage, then 2 units/s: the 20 of 10 s (the last one at 10.0).
    assert len(in_ten_seconds) == 20
    assert in_ten_seconds[0] == pytest.approx(0.5)
    await throttling.aclose()


async def test_the_shared_budget_is_used_only_while_the_controller_is_away() -> None:
    throttlers = {"q": {"limit": 100, "period": "1s", "request_period": "1s", "fallback_rate": 2,
                        "retrying_channel": RETRY}}
    clock, transport, throttling = away(throttlers)
    handle = throttling.factory("c").get_throttler_or_throw("q")
    async with clock.autojumping():
        await handle.throttle(1)
    assert clock.monotonic() == pytest.approx(0.5)  # 2 units/s from empty
    budget = throttling.fallback("q")
    assert budget is not None
    transport.down = False
    async with clock.autojumping():
        await handle.throttle(50)  # the controller (full, 100/s) serves it: not the budget
    assert clock.monotonic() < 1.5
    assert budget.clients_away == 0
    await throttling.aclose()


def test_an_away_budget_starts_empty_refills_to_one_request_period_and_may_go_below_zero() -> None:
    budget = AwayBudget(lambda: 4.0, lambda: 0.5)
    budget.leave(10.0)
    assert budget.take(1, 10.0) == pytest.approx(0.25)
    assert budget.take(1, 20.0) == 0.0  # refilled to 2 (4/s × 0.5 s), not 40
    assert budget.tokens == pytest.approx(1.0)
    assert budget.take(5, 20.0) == pytest.approx(0.25)  # needs 2 (one period's worth), has 1
    assert budget.take(5, 20.25) == 0.0
    assert budget.tokens == pytest.approx(-3.0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"limit": 5, "fallback_rate": 6}, "fallback_rate 6 exceeds the throttler's rate 5"),
    ({"limit": 5, "fallback_rate": 1, "safe_rate": 1}, "fallback_rate and safe_rate cannot both be set"),
    ({"limit": 5, "fallback_rate": 0}, "fallback_rate must be more than 0, got 0"),
])
def test_fallback_rate_is_validated(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecErrors, match=message):
        Throttling(DynamicSpec(throttlers={"q": fields}), VirtualClock(), file="dynamic.yaml")


async def test_the_budget_pauses_while_a_retry_waits_at_a_controller_that_is_back() -> None:
    throttlers = {"q": {"limit": 2, "period": "1s", "request_period": "1s", "fallback_rate": 2,
                        "retrying_channel": RETRY}}
    clock, transport, throttling = away(throttlers)
    handle = throttling.factory("c").get_throttler_or_throw("q")
    async with clock.autojumping():
        await handle.throttle(1)  # from the budget: the controller is away
        transport.down = False
        ahead = asyncio.create_task(transport.controller.request_quota("q", 20))  # 10 s of the bucket
        served = []
        for _ in range(3):
            await handle.throttle(1)
            served.append(clock.monotonic())
        await ahead
    # Not at the budget's 2/s from 0.5 s on: the retry waits at the controller behind the 20 units.
    assert served[0] >= 9.0
    await throttling.aclose()
