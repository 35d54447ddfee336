"""The prefetching throttler client of one named throttler, inside one job.

Source: upstream ``TPrefetchingThrottler`` as Flow configures it (see the contract):
``TargetRps = 1/request_period``; ``MaxPrefetch = max(ceil(rate·request_period), 1)`` (1e9 unlimited);
``MinPrefetch = 1``; the incoming rate is measured over ``window = max(10·request_period, 1 s)``.
A call is served locally when nothing is queued and the amount fits what is on hand; otherwise it
queues FIFO and one RPC fetches ``max(deficit, min(prefetch, limit·period))`` units, where the
deficit is the queued calls from the head on that fit the burst ``limit·period`` together (at least
the head call). A failed RPC fails every queued call.

Leases (beyond upstream): quota on hand is usable only until the deadline its grant came with. An
RPC that fetches more than the queued calls need asks the controller to ``hold`` it for the spec's
``prefetch_lease``; the controller counts it against the bucket until then, and the client drops
what is left at the deadline. So prefetching hides the RPC's latency without banking quota across
time: whatever the number of callers, clients and processes, units reach callers inside the
envelope ``∫limit dt + limit·period`` (see ``docs/throttler.md``). The prefetch covers the incoming
rate over ``prefetch_lease`` (= ``request_period`` unless that is more than half the period).

While the controller is unreachable the client retries with backoff (``retrying_channel``) and
calls wait; past the retry budget they raise :class:`QuotaRequestFailedError`. Beyond upstream,
``safe_rate`` (Doorman's safe capacity) serves waiting calls locally at that rate (``-1``: at once)
only while the controller is away; the operator keeps ``safe_rate × clients <= limit``. With
``fallback`` (``fallback_rate``: one :class:`~egress.throttler.fallback.AwayBudget` shared by the
process's clients of the throttler) that budget serves them instead.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egress.clock import Clock
from egress.throttler.controller import Grant
from egress.throttler.errors import (
    ControllerUnavailableError,
    QuotaAmountError,
    QuotaRequestFailedError,
    ThrottleInterruptedError,
    ThrottlerError,
)
from egress.throttler.fallback import AwayBudget
from egress.throttler.models import ThrottlerSpec
from egress.throttler.sensors import ClientSensors
from egress.throttler.transport import QuotaTransport

TimestampProvider = Callable[[], float]
"""Returns the job's lag timestamp (seconds): the event time of its oldest unprocessed input."""


AMOUNT_SLACK = 1e-9
"""Units below which a remainder of quota counts as nothing (float rounding)."""
TIME_SLACK = 1e-9
"""Seconds past its deadline that quota still counts as live (a deadline reached by float sums)."""


@dataclass(eq=False)
class _Waiting:
    amount: float
    future: asyncio.Future[None]
    since: float


@dataclass(eq=False)
class _Quota:
    """``amount`` units that may be used until ``deadline`` (``clock.monotonic()`` seconds)."""

    deadline: float
    amount: float


def _insert(quotas: list[_Quota], deadline: float, amount: float) -> None:
    """Add units to a list kept in deadline order (soonest first)."""
    if amount > AMOUNT_SLACK:
        bisect.insort(quotas, _Quota(deadline, amount), key=lambda quota: quota.deadline)


def _expire(quotas: list[_Quota], now: float) -> float:
    """Remove the units whose deadline has passed; returns how many."""
    gone = 0.0
    while quotas and quotas[0].deadline < now - TIME_SLACK:
        gone += quotas.pop(0).amount
    return gone


async def _first_or_stop(future: asyncio.Future[None], stop: asyncio.Event) -> bool:
    """Wait until ``future`` is done or ``stop`` is set; True when ``future`` is done (first, or
    at the same moment)."""
    if not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        either: set[asyncio.Future[Any]] = {future, stopped}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
    return future.done()


def _take(quotas: list[_Quota], amount: float) -> list[_Quota]:
    """Remove ``amount`` units, soonest deadline first; returns the parts taken (deadline order)."""
    parts: list[_Quota] = []
    while amount > AMOUNT_SLACK and quotas:
        first = quotas[0]
        part = min(first.amount, amount)
        parts.append(_Quota(first.deadline, part))
        first.amount -= part
        amount -= part
        if first.amount <= AMOUNT_SLACK:
            quotas.pop(0)
    return parts


class PrefetchingClient:
    """Quota of one throttler for one job: local prefetch in front of ``RequestQuota`` RPCs.

    ``class_id`` is the quota class sent with every RPC; ``timestamp_provider`` gives the lag
    timestamp sent when a call does not pass one. Units are the throttler's (messages or bytes).
    """

    def __init__(self, throttler_id: str, spec: ThrottlerSpec, transport: QuotaTransport, clock: Clock, *,
                 client_id: str = "", class_id: str | None = None, timestamp_provider: TimestampProvider | None = None,
                 sensors: ClientSensors | None = None, computation_id: str = "",
                 fallback: AwayBudget | None = None) -> None:
        self.throttler_id = throttler_id
        self.spec = spec
        self.class_id = class_id
        self._transport = transport
        self._clock = clock
        self._client_id = client_id
        self._timestamp_provider = timestamp_provider
        self._sensors = sensors
        self._computation_id = computation_id
        self._quota: list[_Quota] = []  # on hand, soonest deadline first
        self._taken: list[_Quota] = []  # handed to callers, with the deadline of the quota it came from
        self._taken_expired = 0.0  # units handed to callers whose quota's deadline has passed
        self._queue: deque[_Waiting] = deque()
        self._incoming: deque[tuple[float, float]] = deque()
        self._incoming_sum = 0.0
        self._fetcher: asyncio.Task[None] | None = None
        self._safe_task: asyncio.Task[None] | None = None
        self.fallback = fallback  # shared while the controller is away (fallback_rate)
        self._away_budget: AwayBudget | None = None
        self._attempting = False  # a RequestQuota in flight
        self._work = asyncio.Event()
        self.controller_away = False
        self.closed: ThrottlerError | None = None
        self.rpc_count = 0

    # -- configuration -------------------------------------------------------------------------

    def reconfigure(self, spec: ThrottlerSpec, class_id: str | None = None) -> None:
        """Take a new spec and class in place: quota on hand and queued calls stay."""
        self.spec, self.class_id = spec, class_id

    @property
    def window(self) -> float:
        """Seconds over which the incoming rate is measured: ``max(10·request_period, 1)``."""
        return max(10.0 * self.spec.request_period, 1.0)

    def prefetch(self) -> float:
        """Units one RPC asks for: incoming rate × prefetch_lease in [1, MaxPrefetch]."""
        now = self._clock.monotonic()
        self._trim_incoming(now)
        rate = self._incoming_sum / self.window
        return float(min(max(math.ceil(rate * self.spec.prefetch_lease - 1e-9), 1), self.spec.max_prefetch))

    def _trim_incoming(self, now: float) -> None:
        while self._incoming and self._incoming[0][0] <= now - self.window:
            self._incoming_sum -= self._incoming.popleft()[1]

    # -- quota on hand ---------------------------------------------------------------------------

    @property
    def on_hand(self) -> float:
        """Units on hand whose deadline has not passed."""
        return self._on_hand(self._clock.monotonic())

    def _on_hand(self, now: float) -> float:
        expired = _expire(self._quota, now)
        if expired > 0 and self._sensors is not None:
            self._sensors.expired.labels(self._computation_id, self.throttler_id).inc(expired)
        self._taken_expired += _expire(self._taken, now)
        return sum(quota.amount for quota in self._quota)

    def _hand_out(self, amount: float, waited: float) -> None:
        """Give ``amount`` units on hand (the caller checked they are there) to a caller."""
        for part in _take(self._quota, amount):
            _insert(self._taken, part.deadline, part.amount)
        self._consumed(amount, waited)

    def _give_back(self, amount: float, now: float) -> None:
        """Units handed out but not used return with the soonest deadline they may have come with;
        units that may come from quota whose deadline has passed are dropped."""
        self._on_hand(now)
        dropped = min(amount, self._taken_expired)
        self._taken_expired -= dropped
        for part in _take(self._taken, amount - dropped):
            _insert(self._quota, part.deadline, part.amount)

    # -- the throttler API ---------------------------------------------------------------------

    def try_acquire(self, amount: float) -> bool:
        """Take ``amount`` from what is on hand if nothing waits and it fits; never calls the controller."""
        self._check_open()
        if amount < 0:
            raise QuotaAmountError(f"Quota amount must be non-negative, got {amount:g}")
        now = self._clock.monotonic()
        if not self._queue and amount <= self._on_hand(now):
            self._hand_out(amount, 0.0)
            return True
        return False

    def release(self, amount: float) -> None:
        """Give back ``amount`` units taken but not used; they serve later local calls until the
        deadline of the quota they came from (taken as the soonest possible), or are dropped."""
        if amount > 0:
            self._give_back(amount, self._clock.monotonic())
            if self._sensors is not None:
                self._sensors.released.labels(self._computation_id, self.throttler_id).inc(amount)
            self._serve_queue()

    async def throttle(self, amount: float, *, timestamp: float | None = None,
                       stop: asyncio.Event | None = None) -> None:
        """Wait until ``amount`` units may be used.

        Raises :class:`QuotaAmountError` (negative amount), :class:`UnknownThrottlerError` (the
        controller has no such throttler), :class:`QuotaRequestFailedError` (retry budget spent),
        :class:`ThrottlerNotConfiguredError` (the name was removed while waiting) and
        :class:`ThrottleInterruptedError` when ``stop`` is set while the call waits (it then takes
        no units; a call that need not wait is served even while ``stop`` is set).
        """
        self._check_open()
        if not amount >= 0 or math.isinf(amount):
            raise QuotaAmountError(f"Quota amount must be non-negative, got {amount:g}")
        now = self._clock.monotonic()
        self._incoming.append((now, amount))
        self._incoming_sum += amount
        if not self._queue and amount <= self._on_hand(now):
            self._hand_out(amount, 0.0)
            return
        waiting = _Waiting(amount, asyncio.get_running_loop().create_future(), now)
        self._queue.append(waiting)
        self._work.set()
        if self._fetcher is None or self._fetcher.done() or self._fetcher.cancelling():
            self._fetcher = asyncio.get_running_loop().create_task(self._fetch(timestamp))
        try:
            if stop is not None and not await _first_or_stop(waiting.future, stop):
                with contextlib.suppress(ValueError):
                    self._queue.remove(waiting)
                raise ThrottleInterruptedError(
                    f'the wait for {amount:g} units of throttler "{self.throttler_id}" was given up: '
                    "the job is stopping; its epoch is not committed and is processed again by the next run")
            await waiting.future
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._queue.remove(waiting)
            if waiting.future.done() and not waiting.future.cancelled() and waiting.future.exception() is None:
                self._give_back(amount, self._clock.monotonic())  # served just as we were cancelled
            if not self._queue and self._fetcher is not None and not self._fetcher.done():
                self._fetcher.cancel()  # nobody waits for its RPC: the controller refunds it
            raise

    def _check_open(self) -> None:
        if self.closed is not None:
            raise self.closed

    def _consumed(self, amount: float, waited: float) -> None:
        if self._sensors is not None:
            self._sensors.observe(self._computation_id, self.throttler_id, amount, waited)

    def _serve_queue(self, now: float | None = None) -> None:
        now = self._clock.monotonic() if now is None else now
        while self._queue and self._queue[0].amount <= self._on_hand(now) + AMOUNT_SLACK:
            waiting = self._queue.popleft()
            if waiting.future.done():
                continue
            self._hand_out(waiting.amount, now - waiting.since)
            waiting.future.set_result(None)

    def fail_all(self, error: BaseException) -> None:
        """Fail every queued local call with ``error``."""
        while self._queue:
            waiting = self._queue.popleft()
            if not waiting.future.done():
                waiting.future.set_exception(error)

    async def _fetch(self, timestamp: float | None) -> None:
        while True:
            self._serve_queue()
            if not self._queue:
                return
            if timestamp is None and self._timestamp_provider is not None:
                stamp = self._timestamp_provider()
            else:
                stamp = timestamp if timestamp is not None else self._clock.now()
            try:
                grant = await self._request_with_retries(stamp)
            except Exception as error:  # ThrottlerError, or a fault that must not leave calls waiting forever
                self.fail_all(error)
                return
            # A reply later than its lease still serves the calls it was asked for, on arrival.
            now = self._clock.monotonic()
            _insert(self._quota, max(grant.until, now), grant.amount)
            self._serve_queue(now)

    def _deficit(self) -> float:
        """Units for the queued calls one RPC serves: the calls from the head on while together they
        fit the class's request quantum (:meth:`ThrottlerSpec.request_quantum`, at most the burst;
        at least the head), handed out together when the reply comes. What is on hand does not
        count: it does not fit the head and may expire before the reply."""
        quantum = self.spec.request_quantum(self.class_id)
        deficit = 0.0
        for waiting in self._queue:
            if deficit > 0 and deficit + waiting.amount > quantum:
                break
            deficit += waiting.amount
        return deficit

    def _ask(self) -> tuple[float, float]:
        """``(amount, hold)`` of the next RPC under the spec as it is now: the deficit, or the
        prefetch if that is more (never beyond the burst), held for ``prefetch_lease`` when it
        prefetches. Composed again for every attempt: an amount folded under a larger burst that
        reached a controller with a smaller one would count there as one call beyond the burst and
        be released whole, past the envelope."""
        deficit = self._deficit()
        amount = max(deficit, min(self.prefetch(), self.spec.request_quantum(self.class_id)))
        return amount, self.spec.prefetch_lease if amount > deficit + AMOUNT_SLACK else 0.0

    async def _request_with_retries(self, timestamp: float) -> Grant:
        """One ``RequestQuota``, its attempts under ``retrying_channel`` all carrying one request id
        (a copy still waiting at the controller is replaced, never doubled); cancelled, it is
        withdrawn at the controller."""
        channel = self.spec.retrying_channel
        started = self._clock.monotonic()
        backoff = channel.retry_backoff_time
        attempt = 0
        request_id = f"{self._client_id}/{uuid.uuid4().hex}"
        try:
            while True:
                attempt += 1
                amount, hold = self._ask()
                self.rpc_count += 1
                if self._sensors is not None:
                    self._sensors.request_count.labels(self._computation_id, self.throttler_id).inc()
                try:
                    self._attempting = True
                    try:
                        return await self._transport.request_quota(
                            self.throttler_id, amount, timestamp=timestamp, quota_class_id=self.class_id,
                            client_id=self._client_id, rpc_timeout=self.spec.rpc_timeout, hold=hold,
                            request_id=request_id)
                    finally:
                        self._attempting = False
                        self._work.set()
                except ControllerUnavailableError as error:
                    elapsed = self._clock.monotonic() - started
                    if attempt >= channel.retry_attempts or elapsed + backoff > channel.retry_timeout:
                        raise QuotaRequestFailedError(
                            f'RequestQuota for throttler "{self.throttler_id}" failed after {attempt} attempt(s) '
                            f"in {elapsed:.3g} s: {error}") from error
                    self._controller_away()
                    await self._clock.sleep(backoff)
                    if channel.enable_exponential_retry_backoffs:
                        backoff = min(backoff * 2, channel.max_backoff_time)
        except asyncio.CancelledError:
            self._transport.withdraw(request_id)
            raise
        finally:
            self._controller_back()

    # -- safe rate while the controller is away -------------------------------------------------

    def _controller_away(self) -> None:
        if self.controller_away:
            return
        self.controller_away = True
        budget = self.fallback
        safe = self.spec.safe_rate
        if budget is None and safe is not None and safe != 0:
            budget = AwayBudget(lambda: self.spec.safe_rate or 0.0, lambda: self.spec.request_period)
        self._away_budget = budget
        if budget is not None:
            budget.leave(self._clock.monotonic())
            self._safe_task = asyncio.get_running_loop().create_task(self._serve_safely(budget))

    def _controller_back(self) -> None:
        self.controller_away = False
        if self._away_budget is not None:
            self._away_budget.come_back()
            self._away_budget = None
        if self._safe_task is not None:
            self._safe_task.cancel()
            self._safe_task = None

    async def _serve_safely(self, budget: AwayBudget) -> None:
        """Serve queued calls from ``budget`` while the controller is away, pausing while a retry
        is in flight: one that does not fail at once may be waiting at a controller back again,
        whose grants must not come on top of the budget's."""
        while self.controller_away:
            if not self._queue or self._attempting:
                self._work.clear()
                await self._work.wait()
                continue
            head = self._queue[0]
            now = self._clock.monotonic()
            wait = budget.take(head.amount, now)
            if wait == 0:
                self._queue.popleft()
                if not head.future.done():
                    head.future.set_result(None)
                    self._consumed(head.amount, now - head.since)
                continue
            if math.isinf(wait):
                self._work.clear()
                await self._work.wait()  # rate 0 now: wait for a change (a call, or the controller back)
                continue
            await self._clock.sleep(wait)

    async def aclose(self, error: ThrottlerError) -> None:
        """Stop: fail queued calls (and every later call) with ``error``."""
        self.closed = error
        self.fail_all(error)
        for task in (self._fetcher, self._safe_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
