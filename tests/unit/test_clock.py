"""The virtual clock: exact time, deadline order, autojump over idle time."""

import asyncio

import pytest

from egress.clock import RealClock, VirtualClock, event_or_timeout


async def test_advance_wakes_sleepers_in_deadline_order_at_their_exact_times() -> None:
    clock = VirtualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper("late", 5.0)), asyncio.create_task(sleeper("early", 2.0))]
    await clock.advance(1.0)
    assert woke == []
    await clock.advance(10.0)
    assert woke == [("early", 102.0), ("late", 105.0)]
    assert clock.now() == 111.0
    await asyncio.gather(*tasks)


async def test_a_sleeper_started_by_a_woken_task_within_the_window_also_wakes() -> None:
    clock = VirtualClock()
    times: list[float] = []

    async def chain() -> None:
        for _ in range(3):
            await clock.sleep(1.0)
            times.append(clock.now())

    task = asyncio.create_task(chain())
    await clock.advance(2.5)
    assert times == [1.0, 2.0]
    await clock.advance(1.0)
    assert times == [1.0, 2.0, 3.0]
    await task


async def test_autojump_skips_idle_time_exactly() -> None:
    clock = VirtualClock()
    async with clock.autojumping():
        await clock.sleep(30.0)
        assert clock.now() == 30.0
        await clock.sleep_until(45.5)
        assert clock.now() == 45.5


async def test_cannot_go_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        await VirtualClock().advance(-1)


async def test_real_clock_sleeps_on_the_loop() -> None:
    clock = RealClock()
    before = clock.monotonic()
    await clock.sleep(0.01)
    assert clock.monotonic() - before >= 0.009
    assert clock.now() > 1.7e9


@pytest.mark.parametrize("clock", [RealClock(), VirtualClock()], ids=["real", "virtual"])
async def test_event_or_timeout_returns_false_when_the_event_comes_first(clock: RealClock | VirtualClock) -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    if isinstance(clock, VirtualClock):
        async with clock.autojumping():
            assert await event_or_timeout(event, clock, 30.0) is False
        assert clock.now() == 0.0  # no time passed: the event came first
    else:
        assert await event_or_timeout(event, clock, 30.0) is False


async def test_event_or_timeout_returns_true_at_the_exact_time_on_the_virtual_clock() -> None:
    clock = VirtualClock(start=10.0)
    async with clock.autojumping():
        assert await event_or_timeout(asyncio.Event(), clock, 2.5) is True
    assert clock.now() == 12.5


async def test_event_or_timeout_on_the_real_clock_returns_true_once_the_time_has_passed() -> None:
    clock = RealClock()
    started = clock.monotonic()
    assert await event_or_timeout(asyncio.Event(), clock, 0.05) is True
    assert clock.monotonic() - started >= 0.05


@pytest.mark.parametrize("clock", [RealClock(), VirtualClock()], ids=["real", "virtual"])
async def test_event_or_timeout_on_a_set_event_still_lets_the_other_tasks_run(clock: RealClock | VirtualClock) -> None:
    event, ran = asyncio.Event(), asyncio.Event()
    event.set()
    asyncio.get_running_loop().call_soon(ran.set)
    assert await event_or_timeout(event, clock, 30.0) is False
    assert ran.is_set()


async def test_a_cancelled_wait_on_the_real_clock_raises_cancelled_not_a_timeout() -> None:
    waiting = asyncio.ensure_future(event_or_timeout(asyncio.Event(), RealClock(), 30.0))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
