"""The throttler controller: one quota queue per named throttler, one timer for all of them.

Source: upstream Flow distributed throttler service (``RequestQuota``). Every decision for a
throttler happens synchronously in :meth:`ThrottlerController.request_quota`, in a cancel, in a
reconfigure or when the single timer fires, so there is no check-then-act race: the event loop runs
one of them at a time. Whatever the number of waiting requests, one task sleeps on the clock, until
the earliest moment any throttler can grant its next chunk; a grant costs O(log n) heap work.

Every answer carries a lease end: the time until which the caller may use the units (its ``hold``,
at most the spec's ``prefetch_lease``, plus the transport's ``allowance`` for the reply's travel).
With a ``state_file`` the controller writes its restart horizon ahead of every grant
(:mod:`~egress.throttler.horizon`) and, restarted, starts its release buckets empty at the
predecessor's horizon; ``assume_restart`` without a usable file closes them for one lease instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from egress.clock import Clock
from egress.observe import tracing as _tracing
from egress.throttler.errors import ControllerClosedError, RequestWithdrawnError, UnknownThrottlerError
from egress.throttler.horizon import HorizonFile
from egress.throttler.models import ThrottlerSpec
from egress.throttler.queue import QuotaQueue, QuotaRequest

log = logging.getLogger("egress.throttler.controller")


class Grant(NamedTuple):
    """The answer to ``RequestQuota``: ``amount`` units granted (the amount asked, or less when the
    burst shrank below it meanwhile: ask again for the rest), usable until ``until`` (seconds on
    the receiver's ``clock.monotonic()``)."""

    amount: float
    until: float


@dataclass(eq=False)
class _Waiter:
    throttler_id: str
    future: asyncio.Future[None]


class ThrottlerController:
    """Grants quota of every named throttler declared in DynamicSpec ``throttlers``.

    ``throttlers`` maps throttler id → :class:`ThrottlerSpec`; ``clock`` gives all time (seconds).
    ``state_file``: where the restart horizon is kept (``None``: nowhere); ``assume_restart``: start
    as after a restart of unknown time when no state file tells (the standalone service);
    ``allowance``: seconds added to every lease for the reply's travel to the client.
    Use it inside a running event loop; :meth:`aclose` fails whatever still waits.
    """

    def __init__(self, throttlers: Mapping[str, ThrottlerSpec], clock: Clock, *,
                 state_file: str | Path | None = None, assume_restart: bool = False, allowance: float = 0.0) -> None:
        self.clock = clock
        self.allowance = allowance
        self._queues: dict[str, QuotaQueue] = {}
        self._waiters: dict[QuotaRequest, _Waiter] = {}
        self._asked: dict[str, QuotaRequest] = {}  # request id → the copy of it waiting
        self._withdrawn: dict[str, float] = {}  # request id given up before it arrived → until when
        self._timer: asyncio.Task[None] | None = None
        self._timer_deadline: float | None = None
        self._closed = False
        self.wait_times: dict[str, float] = {}  # throttler id → longest wait (s) of a resolved request
        self._horizon = HorizonFile(state_file, clock) if state_file is not None else None
        self._removed: dict[str, float] = {}  # removed name → when its last lease ends
        self.empty_since = self._start(throttlers, assume_restart)
        self.reconfigure(throttlers)

    def _start(self, throttlers: Mapping[str, ThrottlerSpec], assume_restart: bool) -> float | None:
        """When the release buckets start empty (monotonic seconds), ``None`` for full (a first start)."""
        unknown = assume_restart
        if self._horizon is not None:
            try:
                horizon = self._horizon.load()
            except ValueError as error:
                log.warning("%s; starting as after a restart at an unknown time", error)
                unknown = True
            else:
                if horizon is not None:
                    return horizon
                unknown = False  # no file yet: a first start
        if not unknown:
            return None
        longest = max((spec.prefetch_lease for spec in throttlers.values()), default=0.0)
        return self.clock.monotonic() + longest + self.allowance

    def lease(self, spec: ThrottlerSpec, hold: float) -> float:
        """Seconds after its release that a grant asked with ``hold`` may be used."""
        return min(max(0.0, hold), spec.prefetch_lease) + self.allowance

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
        tokens and queues, removed ones fail their waiters with ``Unknown throttler "X"``. A name
        declared again starts empty once what it released before its removal can no longer be used."""
        now = self.clock.monotonic()
        for throttler_id in [t for t in self._queues if t not in throttlers]:
            removed = self._queues.pop(throttler_id)
            self._removed[throttler_id] = now + self.lease(removed.spec, removed.spec.prefetch_lease)
            error = UnknownThrottlerError(f'Unknown throttler "{throttler_id}"')
            for request, waiter in list(self._waiters.items()):
                if waiter.throttler_id == throttler_id:
                    del self._waiters[request]
                    if not waiter.future.done():
                        waiter.future.set_exception(error)
        for throttler_id, spec in throttlers.items():
            queue = self._queues.get(throttler_id)
            if queue is None:
                since = [t for t in (self.empty_since, self._removed.pop(throttler_id, None)) if t is not None]
                self._queues[throttler_id] = QuotaQueue(spec, now, empty_since=max(since) if since else None)
            elif queue.spec != spec:
                queue.reconfigure(spec, now)
        if self._has_loop():
            self._decide_all(now)

    async def request_quota(
        self, throttler_id: str, amount: float, *, timestamp: float = 0.0, quota_class_id: str | None = None,
        client_id: str = "", hold: float = 0.0, request_id: str = "",
    ) -> Grant:
        """Wait until ``amount`` units of ``throttler_id`` are granted (``RequestQuota``); returns the
        :class:`Grant`: units granted and the lease end (``clock.monotonic()`` seconds) until which
        they may be used.

        ``timestamp`` is the caller's lag timestamp (seconds; smaller = served first within its
        class); ``quota_class_id`` its class (missing, empty or unknown → ``default``); ``client_id``
        is informational; ``hold`` the seconds the caller wants to keep unused units (prefetch; at
        most the spec's ``prefetch_lease``). ``request_id`` (optional, unique per request of a
        client, the same for every attempt of it): a copy of the same request still waiting here is
        withdrawn and refunded, and raises :class:`RequestWithdrawnError` to its (gone) caller, so a
        client that gave up on an RPC and asks again never has two copies holding units; an id
        :meth:`withdraw` named before it arrived raises that at once. Raises
        :class:`UnknownThrottlerError`, :class:`QuotaAmountError`, or :class:`ControllerClosedError`
        when the controller closes. Cancelling the caller refunds the request.
        """
        if self._closed:
            raise ControllerClosedError("the throttler controller is closed")
        queue = self.queue(throttler_id)
        now = self.clock.monotonic()
        if request_id and self._withdrawn.pop(request_id, None) is not None:
            raise RequestWithdrawnError(f"RequestQuota {request_id} was withdrawn by its client")
        if request_id:
            self.withdraw(request_id)
        request = queue.submit(amount, now, timestamp=timestamp, class_id=quota_class_id,
                               lease=self.lease(queue.spec, hold))
        if request.done:
            if _tracing.active is not None:
                self._trace_decision(_tracing.active, throttler_id, request, now)
            return Grant(request.released, request.lease_end)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request] = _Waiter(throttler_id, future)
        if request_id:
            self._asked[request_id] = request
        self._decide(throttler_id, queue, now)
        self._arm()
        try:
            await future
        except asyncio.CancelledError:
            self._forget(request, request_id)
            if self._queues.get(throttler_id) is queue and not request.done:
                now = self.clock.monotonic()
                queue.cancel(request, now)
                self._decide(throttler_id, queue, now)
                self._arm()
            raise
        finally:
            self._forget(request, request_id)
        return Grant(request.released, request.lease_end)

    def withdraw(self, request_id: str, *, remember: float = 0.0) -> bool:
        """Withdraw and refund the copy of ``request_id`` still waiting (its client gave up on it);
        returns whether one waited. None waiting and ``remember`` > 0: the id is refused for the
        next ``remember`` seconds (its give-up overtook it on the way)."""
        request = self._asked.pop(request_id, None)
        waiter = None if request is None else self._waiters.pop(request, None)
        if request is None or waiter is None:
            if remember > 0:
                now = self.clock.monotonic()
                self._withdrawn = {r: until for r, until in self._withdrawn.items() if until > now}
                self._withdrawn[request_id] = now + remember
            return False
        queue = self._queues.get(waiter.throttler_id)
        if queue is not None and not request.done:
            now = self.clock.monotonic()
            queue.cancel(request, now)
            self._decide(waiter.throttler_id, queue, now)
            self._arm()
        if not waiter.future.done():
            waiter.future.set_exception(RequestWithdrawnError(f"RequestQuota {request_id} was withdrawn by its client"))
        return True

    def _forget(self, request: QuotaRequest, request_id: str) -> None:
        self._waiters.pop(request, None)
        if request_id and self._asked.get(request_id) is request:
            del self._asked[request_id]

    def _has_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def _decide(self, throttler_id: str, queue: QuotaQueue, now: float) -> None:
        released = queue.poll(now)
        if released and self._horizon is not None:
            self._horizon.cover(max(request.lease_end for request in released))  # before anyone sees them
        for request in released:
            waiter = self._waiters.pop(request, None)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_result(None)
            waited = now - request.enqueued_at
            if waited > self.wait_times.get(throttler_id, 0.0):
                self.wait_times[throttler_id] = waited
            if _tracing.active is not None:
                self._trace_decision(_tracing.active, throttler_id, request, now)

    def _trace_decision(self, tracing: _tracing.Tracing, throttler_id: str, request: QuotaRequest, now: float) -> None:
        """A sampled decision as a span ``RequestQuota`` of the throttler's own service, from the request's
        arrival to its release (its queue wait), with what was asked and released."""
        if not tracing.sampling.root():
            return
        wall = self.clock.now() - self.clock.monotonic()
        tracing.span("RequestQuota", request.enqueued_at + wall, now + wall, service=_tracing.THROTTLER_SERVICE_NAME,
                     attributes={"egress.throttler_id": throttler_id, "egress.quota_class_id": request.class_id,
                                 "egress.amount": request.amount, "egress.released": request.released,
                                 "egress.queue_wait_seconds": now - request.enqueued_at,
                                 "egress.lease_seconds": request.lease})

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
        """Stop the timer and fail every waiter with :class:`ControllerClosedError`."""
        self._closed = True
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(ControllerClosedError("the throttler controller is closed"))
        self._waiters.clear()
        self._asked.clear()
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        self._timer = None
