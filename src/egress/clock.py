"""Time for everything that waits: retries, timers, epochs, throttling.

Nothing in egress calls ``time.time()`` or ``asyncio.sleep()`` directly; it takes a :class:`Clock`.
:class:`RealClock` is the wall clock. :class:`VirtualClock` is a clock for tests whose time only
moves when the test advances it, or, with ``autojump=True``, jumps to the next deadline as soon as
every task on the event loop is blocked (the idea of trio's ``MockClock(autojump_threshold=0)``),
so a 30-second backoff runs in microseconds and its timestamps are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """The time source. All values are seconds as ``float``."""

    def now(self) -> float:
        """Wall-clock time, seconds since the Unix epoch (event timestamps, timer triggers)."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes back, seconds from an arbitrary origin (deadlines, elapsed)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (<= 0 yields once)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Wait until :meth:`monotonic` reaches ``deadline``."""
        ...

    async def wait_event(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass, whichever comes first; True when the
        time came first (see :func:`event_or_timeout`)."""
        ...


class RealClock:
    """The machine's clocks: ``time.time`` and ``time.monotonic``, waits on the asyncio loop."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def wait_event(self, event: asyncio.Event, seconds: float) -> bool:
        # In the caller's task, under one timer handle: the generic way (two tasks, a wait and a
        # gather) cost ~30 µs of CPU a call, paid once per epoch by every job.
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await event.wait()
        except TimeoutError:
            return True
        return False


class VirtualClock:
    """A clock whose time moves only when told to; ``now()`` and ``monotonic()`` are the same value.

    ``start`` is the initial time in seconds. ``advance(seconds)`` moves time forward and wakes,
    in deadline order, every sleeper whose deadline has come, letting each run before the next
    wakes. With ``autojump=True`` a background task jumps straight to the next deadline whenever
    the event loop has nothing else ready to run; use it as ``async with clock.autojumping(): ...``.
    Sleepers with equal deadlines wake in the order they started sleeping.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + max(0.0, seconds))

    async def wait_event(self, event: asyncio.Event, seconds: float) -> bool:
        return await _first_of_event_and_sleep(event, self.sleep(seconds))

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    def next_deadline(self) -> float | None:
        """The earliest deadline anyone waits for, or ``None`` when nobody sleeps."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0), waking due sleepers one deadline at a time.

        Raises ``ValueError`` for a negative ``seconds``.
        """
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds} s)")
        await self._run_until(self._now + seconds)

    async def _run_until(self, target: float) -> None:
        await _settle()
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > target:
                break
            self._now = max(self._now, deadline)
            while self._sleepers and self._sleepers[0][0] <= self._now:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            await _settle()
        self._now = max(self._now, target)

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def autojumping(self) -> _Autojump:
        """An async context manager during which idle time is skipped (see class docs)."""
        return _Autojump(self)

    async def _autojump_forever(self) -> None:
        while True:
            await _settle()
            deadline = self.next_deadline()
            if deadline is None:
                await asyncio.sleep(0.001)  # real time: nobody sleeps on us, let I/O happen
                continue
            await self._run_until(deadline)


class _Autojump:
    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> VirtualClock:
        self._task = asyncio.get_running_loop().create_task(self._clock._autojump_forever())
        return self._clock

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _settle(rounds: int = 50) -> None:
    """Let every task that is ready run until the loop has nothing left ready (bounded)."""
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        await asyncio.sleep(0)
        # ``_ready`` is the asyncio loop's run queue; an implementation detail of the stdlib
        # loop (uvloop has no such attribute, so there we fall back to a fixed number of rounds).
        ready = getattr(loop, "_ready", None)
        if ready is not None and len(ready) == 0:
            return


async def unless_set(step: Awaitable[None], *events: asyncio.Event | None) -> bool:
    """Await ``step`` unless one of ``events`` (``None`` ones left out) is set first, which cancels
    it; whether it ran to its end (what it raises is raised)."""
    task = asyncio.ensure_future(step)
    waiters = {asyncio.ensure_future(event.wait()) for event in events if event is not None}
    try:
        await asyncio.wait({task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (task, *waiters):
            waiting.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    try:
        await task
    except asyncio.CancelledError:
        if task.cancelled() and any(event is not None and event.is_set() for event in events):
            return False
        raise
    return True


async def event_or_timeout(event: asyncio.Event, clock: Clock, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass on ``clock``, whichever comes first; True
    when the clock came first. Always yields to the loop once at least, so a caller's loop over an
    event it does not clear cannot starve the other tasks."""
    if event.is_set():
        await asyncio.sleep(0)
        return False
    return await clock.wait_event(event, seconds)


async def _first_of_event_and_sleep(event: asyncio.Event, sleep: Awaitable[None]) -> bool:
    """``event`` set or ``sleep`` done, whichever first, each in a task of its own; True when the sleep was."""
    waker = asyncio.ensure_future(event.wait())
    sleeper = asyncio.ensure_future(sleep)
    try:
        done, _ = await asyncio.wait({waker, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waker, sleeper):
            task.cancel()
        await asyncio.gather(waker, sleeper, return_exceptions=True)
    return waker not in done
