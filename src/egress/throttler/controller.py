"""The throttler controller: one quota queue per named throttler, one timer for all of them.

Source: upstream Flow distributed throttler service (``RequestQuota``). Every decision for a
throttler happens synchronously in :meth:`ThrottlerController.request_quota`, in a cancel, in a
reconfigure or when the single timer fires, so there is no check-then-act race: the event loop runs
one of them at a time. Whatever the number of waiting requests, one task sleeps on the clock, until
the earliest moment any throttler can grant its next chunk; a grant costs O(log n) heap work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from egress.clock import Clock
from egress.throttler.errors import ThrottlerError, UnknownThrottlerError
from egress.throttler.models import ThrottlerSpec
from egress.throttler.queue import QuotaQueue, QuotaRequest


@dataclass(eq=False)
class _Waiter:
    throttler_id: str
    future: asyncio.Future[None]


class ThrottlerController:
    """Grants quota of every named throttler declared in DynamicSpec ``throttlers``.

    ``throttlers`` maps throttler id → :class:`ThrottlerSpec`; ``clock`` gives all time (seconds).
    Use it inside a running event loop; :meth:`aclose` fails whatever still waits.
    """

    def __init__(self, throttlers: Mapping[str, ThrottlerSpec], clock: Clock) -> None:
        self.clock = clock
        self._queues: dict[str, QuotaQueue] = {}
        self._waiters: dict[QuotaRequest, _Waiter] = {}
        self._timer: asyncio.Task[None] | None = None
        self._timer_deadline: float | None = None
        self._closed = False
        self.wait_times: dict[str, float] = {}  # throttler id → longest wait (s) of a resolved request
        self.reconfigure(throttlers)

    @property
    def throttler_ids(self) -> list[str]:
        return sorted(self._queues)

    def queue(self, throttler_id: str) -> QuotaQueue:
        """The quota queue of one throttler; raises :class:`UnknownThrottlerError`."""
        found = self._queues.get(throttler_id)
        if found is None:
            raise UnknownThrottlerError(f'Unknown throttler "{throttler_id}"')
        return found

    def spec(self, throttler_id: str) -> ThrottlerSpec:
        return self.queue(throttler_id).spec

    def reconfigure(self, throttlers: Mapping[str, ThrottlerSpec]) -> None:
        """Apply DynamicSpec ``throttlers`` live: new names start full, changed ones keep their
        tokens and queues, removed ones fail their waiters with ``Unknown throttler "X"``."""
        now = self.clock.monotonic()
        for throttler_id in [t for t in self._queues if t not in throttlers]:
            del self._queues[throttler_id]
            error = UnknownThrottlerError(f'Unknown throttler "{throttler_id}"')
            for request, waiter in list(self._waiters.items()):
                if waiter.throttler_id == throttler_id:
                    del self._waiters[request]
                    if not waiter.future.done():
                        waiter.future.set_exception(error)
        for throttler_id, spec in throttlers.items():
            queue = self._queues.get(throttler_id)
            if queue is None:
                self._queues[throttler_id] = QuotaQueue(spec, now)
            elif queue.spec != spec:
                queue.reconfigure(spec, now)
        if self._has_loop():
            self._decide_all(now)

    async def request_quota(
        self, throttler_id: str, amount: float, *, timestamp: float = 0.0, quota_class_id: str | None = None,
        client_id: str = "",
    ) -> None:
        """Wait until ``amount`` units of ``throttler_id`` are granted (``RequestQuota``).

        ``timestamp`` is the caller's lag timestamp (seconds; smaller = served first within its
        class); ``quota_class_id`` its class (missing, empty or unknown → ``default``); ``client_id``
        is informational. Raises :class:`UnknownThrottlerError`, :class:`QuotaAmountError`, or
        :class:`ThrottlerError` when the controller closes. Cancelling the caller refunds the request.
        """
        if self._closed:
            raise ThrottlerError("the throttler controller is closed")
        queue = self.queue(throttler_id)
        now = self.clock.monotonic()
        request = queue.submit(amount, now, timestamp=timestamp, class_id=quota_class_id)
        if request.done:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request] = _Waiter(throttler_id, future)
        self._decide(throttler_id, queue, now)
        self._arm()
        try:
            await future
        except asyncio.CancelledError:
            self._waiters.pop(request, None)
            if self._queues.get(throttler_id) is queue and not request.done:
                now = self.clock.monotonic()
                queue.cancel(request, now)
                self._decide(throttler_id, queue, now)
                self._arm()
            raise

    def _has_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def _decide(self, throttler_id: str, queue: QuotaQueue, now: float) -> None:
        for request in queue.poll(now):
            waiter = self._waiters.pop(request, None)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_result(None)
            waited = now - request.enqueued_at
            if waited > self.wait_times.get(throttler_id, 0.0):
                self.wait_times[throttler_id] = waited

    def _decide_all(self, now: float) -> None:
        for throttler_id, queue in self._queues.items():
            self._decide(throttler_id, queue, now)
        self._arm()

    def _next_deadline(self) -> float | None:
        now = self.clock.monotonic()
        deadlines = [d for q in self._queues.values() if (d := q.next_ready(now)) is not None]
        return min(deadlines) if deadlines else None

    def _arm(self) -> None:
        """Keep exactly one timer, sleeping until the earliest next grant of any throttler."""
        deadline = None if self._closed else self._next_deadline()
        if deadline == self._timer_deadline and self._timer is not None and not self._timer.done():
            return
        if self._timer is not None and not self._timer.done() and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer, self._timer_deadline = None, deadline
        if deadline is not None:
            self._timer = asyncio.get_running_loop().create_task(self._sleep_then_decide(deadline))

    async def _sleep_then_decide(self, deadline: float) -> None:
        await self.clock.sleep_until(deadline)
        self._timer, self._timer_deadline = None, None
        self._decide_all(self.clock.monotonic())

    @property
    def timer_count(self) -> int:
        """Timers armed right now: 0 or 1, however many requests wait."""
        return int(self._timer is not None and not self._timer.done())

    async def aclose(self) -> None:
        """Stop the timer and fail every waiter with :class:`ThrottlerError`."""
        self._closed = True
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(ThrottlerError("the throttler controller is closed"))
        self._waiters.clear()
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        self._timer = None
