"""The controller on the virtual clock: exact grant times, one timer, cancel refunds, live reconfigure."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from egress.clock import VirtualClock
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import QuotaAmountError, RequestWithdrawnError, ThrottlerError, UnknownThrottlerError
from egress.throttler.horizon import SLACK, HorizonFile
from egress.throttler.models import ThrottlerSpec


def specs(**throttlers: dict[str, Any]) -> dict[str, ThrottlerSpec]:
    return {name: ThrottlerSpec.model_validate(fields) for name, fields in throttlers.items()}


async def timed(clock: VirtualClock, controller: ThrottlerController, log: list[tuple[str, float]], name: str,
                amount: float, **kwargs: Any) -> None:
    await controller.request_quota("q", amount, **kwargs)
    log.append((name, clock.monotonic()))


async def test_grants_follow_the_bucket_exactly_and_lag_priority() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 10, "period": "1s"}), clock)
    log: list[tuple[str, float]] = []
    async with clock.autojumping():
        await controller.request_quota("q", 10)  # the burst: at once
        assert clock.monotonic() == 0.0
        await asyncio.gather(timed(clock, controller, log, "late", 5, timestamp=300.0),
                             timed(clock, controller, log, "lagging", 5, timestamp=100.0),
                             timed(clock, controller, log, "middle", 5, timestamp=200.0))
    assert log == [("lagging", 0.5), ("middle", 1.0), ("late", 1.5)]
    await controller.aclose()


async def test_errors_have_upstream_texts() -> None:
    controller = ThrottlerController(specs(q={"limit": 1}), VirtualClock())
    with pytest.raises(UnknownThrottlerError, match='Unknown throttler "nope"'):
        await controller.request_quota("nope", 1)
    with pytest.raises(QuotaAmountError, match="Quota amount must be non-negative, got -1"):
        await controller.request_quota("q", -1)
    await controller.aclose()
    with pytest.raises(ThrottlerError, match="closed"):
        await controller.request_quota("q", 1)


async def test_one_timer_for_ten_thousand_waiters() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 1000, "period": "1s"}, r={"limit": 500, "period": "1s"}), clock)
    await controller.request_quota("q", 1000)
    await controller.request_quota("r", 500)
    tasks = [asyncio.create_task(controller.request_quota("q" if i % 2 else "r", 1, timestamp=float(i)))
             for i in range(10_000)]
    await asyncio.sleep(0)
    assert controller.queue("q").queue_size + controller.queue("r").queue_size == 10_000
    assert controller.timer_count == 1
    await asyncio.sleep(0)
    assert sum(not f.done() for _, _, f in clock._sleepers) == 1  # one sleeper on the clock, not one per waiter
    await clock.advance(5.0)
    assert controller.queue("q").queue_size == 0
    assert controller.queue("r").queue_size == 2500  # 5,000 at 500/s: exactly 10 s
    assert sum(t.done() for t in tasks) == 5000 + 2500
    await clock.advance(5.0)
    assert all(t.done() for t in tasks)
    assert controller.timer_count == 0
    await controller.aclose()


async def test_cancelled_request_stops_blocking_and_is_refunded() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 10, "period": "1s"}), clock)
    log: list[tuple[str, float]] = []
    async with clock.autojumping():
        await controller.request_quota("q", 10)
        big = asyncio.create_task(controller.request_quota("q", 10, timestamp=1.0))
        small = asyncio.create_task(timed(clock, controller, log, "small", 2, timestamp=2.0))
        await clock.sleep(0.5)
        big.cancel()
        await small
    assert log == [("small", 0.5)]  # the 5 units refilled for big were not lost
    assert controller.queue("q").bucket.tokens(0.5) == pytest.approx(3.0)
    await controller.aclose()


async def test_reconfigure_applies_live() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 1, "period": "1s"}), clock)
    log: list[tuple[str, float]] = []
    async with clock.autojumping():
        await controller.request_quota("q", 1)
        waiting = asyncio.create_task(timed(clock, controller, log, "w", 100))
        await clock.sleep(1.0)
        controller.reconfigure(specs(q={"limit": 100, "period": "1s"}))  # 1 token now, refill 100/s
        await waiting
    assert log == [("w", pytest.approx(1.99))]
    await controller.aclose()


async def test_removed_throttler_fails_its_waiters_and_readding_starts_empty_after_its_last_lease() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 1, "period": "1s"}), clock)
    await controller.request_quota("q", 1)
    waiting = asyncio.create_task(controller.request_quota("q", 1))
    await asyncio.sleep(0)
    controller.reconfigure({})
    with pytest.raises(UnknownThrottlerError, match='Unknown throttler "q"'):
        await waiting
    # Declared again at once: what it released just before may still be in use for one lease
    # (min(request_period 5 s, period / 2) = 0.5 s), so it starts empty then, not full now.
    controller.reconfigure(specs(q={"limit": 1, "period": "1s"}))
    async with clock.autojumping():
        await controller.request_quota("q", 1)
    assert clock.monotonic() == 1.5
    controller.reconfigure(specs(fresh={"limit": 1, "period": "1s"}))
    await controller.request_quota("fresh", 1)  # a name never seen before starts full
    assert clock.monotonic() == 1.5
    await controller.aclose()


async def test_classes_share_through_the_controller() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 90, "period": "1s", "max_grant_amount": 1, "classes": {
        "vip": {"weight": 5}, "regular": {"weight": 3}, "bulk": {"weight": 1}}}), clock)
    await controller.request_quota("q", 90)
    granted = {"vip": 0, "regular": 0, "bulk": 0}

    async def worker(class_id: str) -> None:
        while True:
            await controller.request_quota("q", 1, quota_class_id=class_id)
            granted[class_id] += 1

    workers = [asyncio.create_task(worker(c)) for c in granted for _ in range(3)]
    await clock.advance(10.0)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    assert sum(granted.values()) == 900
    assert granted == {"vip": pytest.approx(500, abs=2), "regular": pytest.approx(300, abs=2),
                       "bulk": pytest.approx(100, abs=2)}
    await controller.aclose()


async def test_a_grant_says_until_when_its_units_may_be_used() -> None:
    clock = VirtualClock()
    controller = ThrottlerController(specs(q={"limit": 10, "period": "1s", "request_period": "2s"}), clock,
                                     allowance=0.05)
    assert await controller.request_quota("q", 2) == Grant(2.0, 0.05)  # for waiting calls: the allowance
    # a prefetch asks to hold its units: at most prefetch_lease = min(request_period, period / 2)
    assert await controller.request_quota("q", 2, hold=10.0) == Grant(2.0, 0.5 + 0.05)
    assert controller.queue("q").release_bucket.leased == 4.0
    assert await controller.request_quota("q", 0) == Grant(0.0, 0.0)
    await controller.aclose()


async def test_a_restarted_controller_starts_empty_at_the_horizon_its_predecessor_wrote(tmp_path: Path) -> None:
    clock = VirtualClock(start=1000.0)
    throttlers = specs(q={"limit": 10, "period": "1s", "request_period": "200ms"})
    state = tmp_path / "throttler.json"
    first = ThrottlerController(throttlers, clock, state_file=state)
    assert first.empty_since is None  # no file yet: a first start, full
    assert await first.request_quota("q", 10, hold=1.0) == Grant(10.0, 1000.2)
    written = orjson.loads(state.read_bytes())["horizon"]
    assert written == 1000.2 + SLACK  # ahead of the lease, before the caller had the units
    await first.aclose()
    clock = VirtualClock(start=1000.5)  # restarted half a second later
    second = ThrottlerController(throttlers, clock, state_file=state)
    assert second.empty_since == pytest.approx(1001.2)
    async with clock.autojumping():
        await second.request_quota("q", 5)
    assert clock.monotonic() == pytest.approx(1001.7)  # empty at the horizon, then 0.5 s of refill
    await second.aclose()


async def test_without_a_usable_horizon_a_restart_waits_one_lease(tmp_path: Path) -> None:
    throttlers = specs(q={"limit": 10, "period": "1s", "request_period": "200ms"})
    state = tmp_path / "throttler.json"
    state.write_text("not json")
    clock = VirtualClock()
    controller = ThrottlerController(throttlers, clock, state_file=state, allowance=0.05)
    assert controller.empty_since == pytest.approx(0.25)  # prefetch_lease 0.2 + allowance
    await controller.aclose()
    service_like = ThrottlerController(throttlers, clock, assume_restart=True)
    assert service_like.empty_since == pytest.approx(0.2)
    async with clock.autojumping():
        await service_like.request_quota("q", 1)
    assert clock.monotonic() == pytest.approx(0.3)
    await service_like.aclose()


def test_the_horizon_is_written_ahead_at_most_once_per_slack(tmp_path: Path) -> None:
    clock = VirtualClock(start=50.0)
    horizon = HorizonFile(tmp_path / "h.json", clock)
    assert horizon.load() is None
    horizon.cover(51.0)
    assert horizon.load() == 51.0 + SLACK
    horizon.path.write_text('{"horizon": 0}')  # a grant still inside the slack writes nothing
    horizon.cover(51.0 + SLACK / 2)
    assert horizon.load() == 0.0
    horizon.cover(51.0 + 2 * SLACK)
    assert horizon.load() == 51.0 + 3 * SLACK
    horizon.path.write_text("[]")
    with pytest.raises(ValueError, match=r'h\.json: expected \{"horizon": <unix seconds>\}'):
        horizon.load()


async def turns(count: int = 3) -> None:
    """Let the event loop run ``count`` turns (no time passes on the virtual clock)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_request_asked_again_with_its_request_id_replaces_the_copy_still_waiting() -> None:
    clock = VirtualClock()
    controller = ThrottlerController({"q": ThrottlerSpec.model_validate({"limit": 1, "period": "1s"})}, clock)
    await controller.request_quota("q", 1)  # the full bucket
    first = asyncio.ensure_future(controller.request_quota("q", 100, request_id="c/1"))
    await turns()
    again = asyncio.ensure_future(controller.request_quota("q", 100, request_id="c/1"))
    await turns()
    assert first.done()  # withdrawn: its client asked again
    with pytest.raises(RequestWithdrawnError):
        await first
    assert controller.queue("q").queue_size == 1
    other = asyncio.ensure_future(controller.request_quota("q", 1, request_id="c/2"))
    await turns()
    assert controller.queue("q").queue_size == 2  # another request of the client is its own
    for task in (again, other):
        task.cancel()
    await asyncio.gather(again, other, return_exceptions=True)
    await controller.aclose()


async def test_a_withdrawal_refunds_the_waiting_request_and_one_that_overtook_it_refuses_it_on_arrival() -> None:
    clock = VirtualClock()
    controller = ThrottlerController({"q": ThrottlerSpec.model_validate({"limit": 1, "period": "1s"})}, clock)
    await controller.request_quota("q", 1)
    waiting = asyncio.ensure_future(controller.request_quota("q", 100, request_id="c/1"))
    await turns()
    assert controller.withdraw("c/1", remember=60.0)
    await turns()
    assert waiting.done()
    with pytest.raises(RequestWithdrawnError):
        await waiting
    assert controller.queue("q").queue_size == 0
    assert not controller.withdraw("c/2", remember=60.0)  # not arrived yet
    overtaken = asyncio.ensure_future(controller.request_quota("q", 1000, request_id="c/2"))
    await turns()
    assert overtaken.done()
    with pytest.raises(RequestWithdrawnError):
        await overtaken
    assert controller.queue("q").queue_size == 0
    await controller.aclose()


async def test_a_restarted_controller_lets_a_more_lagging_request_overtake_one_that_arrived_first() -> None:
    """A restarted controller starts both stages empty: had it granted the first request's 30 units
    at once from a full grant bucket (they then wait 6 s for release), the lagging request, arriving
    later, could not overtake them."""
    clock = VirtualClock()
    spec = ThrottlerSpec.model_validate({"limit": 5, "period": "6s", "max_grant_amount": 1})
    controller = ThrottlerController({"q": spec}, clock, assume_restart=True)
    done: dict[str, float] = {}
    async with clock.autojumping():
        first = asyncio.ensure_future(controller.request_quota("q", 30, timestamp=100.0))
        first.add_done_callback(lambda _: done.setdefault("first", clock.monotonic()))
        await clock.sleep(spec.prefetch_lease + 1.0)  # closed for one lease, then 1 s of the limit
        joined = clock.monotonic()
        lagging = asyncio.ensure_future(controller.request_quota("q", 10, timestamp=0.0))
        lagging.add_done_callback(lambda _: done.setdefault("lagging", clock.monotonic()))
        await asyncio.gather(first, lagging)
    assert done["lagging"] < done["first"]
    assert done["lagging"] - joined <= 10 / 5 + 1 / 5 + 1e-6  # its own units, after the chunk in progress
    await controller.aclose()
