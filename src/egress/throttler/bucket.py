"""The token bucket of one named throttler: pure arithmetic over times passed in (no clock, no I/O).

Source: upstream Flow distributed throttler controller (one bucket per throttler): rate ``limit``
units/s, capacity and largest burst ``limit * period`` units, starts full, ``limit=None`` unlimited.
Tokens never go negative, so over any window ``[t1, t2]`` at most ``∫limit dt + capacity`` units leave.

Leases (beyond upstream): units taken with :meth:`TokenBucket.lease` may still be *used* until the
lease ends (a client keeps prefetched quota for a while). Until then the bucket counts them as not
yet spent but already promised: they leave the bucket's room, ``tokens + leased <= capacity``, so
it refills as if they were used at the last moment of their lease. Whenever each leased unit is
really used inside its lease, the uses keep the envelope above (see ``docs/throttler.md``).
"""

from __future__ import annotations

import heapq
import itertools
import math

EPSILON = 1e-9
"""Relative slack for float comparisons so that a wake-up computed from a deficit grants exactly."""


def _fits(tokens: float, amount: float) -> bool:
    return tokens >= amount - EPSILON * max(1.0, amount)


class TokenBucket:
    """Tokens (units) refilled at ``rate`` units/s up to ``rate * period``; ``rate=None`` is unlimited.

    All ``now`` arguments are seconds on one monotonic clock and must not go back. ``empty_since``
    (seconds, may be later than ``now``) starts the bucket empty at that time instead of full at
    ``now``: a restarted controller that cannot know what its predecessor released.
    """

    def __init__(self, rate: float | None, period: float, now: float, *, empty_since: float | None = None) -> None:
        self.rate = rate
        self.period = period
        self._tokens = self.capacity
        self._updated = now
        self._leases: list[tuple[float, int, float]] = []  # heap of (end, order, units)
        self._order = itertools.count()
        self.leased = 0.0  # units under a lease, as of the last refill (``tokens(now)`` brings it up to date)
        if empty_since is not None and rate is not None:
            self._tokens, self._updated = 0.0, empty_since

    @property
    def unlimited(self) -> bool:
        return self.rate is None

    @property
    def capacity(self) -> float:
        """Largest burst in units (``inf`` when unlimited)."""
        return math.inf if self.rate is None else self.rate * self.period

    def tokens(self, now: float) -> float:
        """Units available at ``now`` (``inf`` when unlimited; below zero after an oversized lease)."""
        self._refill(now)
        return self._tokens

    def _advance(self, until: float) -> None:
        """Refill up to ``until`` with the room the current leases leave."""
        if self.rate is None:
            self._tokens = math.inf
        elif until > self._updated:
            room = self.capacity - self.leased
            if self._tokens < room:
                self._tokens = min(room, self._tokens + self.rate * (until - self._updated))
        self._updated = max(self._updated, until)

    def _refill(self, now: float) -> None:
        while self._leases and self._leases[0][0] <= now:
            end, _, units = heapq.heappop(self._leases)
            self._advance(end)
            self.leased = self.leased - units if self._leases else 0.0
        self._advance(now)

    def can_take(self, amount: float, now: float) -> bool:
        """Whether ``amount`` units are available at ``now`` (within float slack)."""
        return _fits(self.tokens(now), amount)

    def take(self, amount: float, now: float) -> None:
        """Consume ``amount`` units; raises ``ValueError`` when fewer are available."""
        if not self.can_take(amount, now):
            raise ValueError(f"bucket holds {self._tokens} units, cannot take {amount}")
        if self.rate is not None:
            self._tokens = max(0.0, self._tokens - amount)

    def lease(self, amount: float, now: float, until: float) -> None:
        """Consume ``amount`` units that may be used until ``until`` (seconds; ``<= now``: at once).

        Needs ``min(amount, capacity)`` units available (raises ``ValueError`` otherwise): an amount
        beyond the burst leaves the bucket that far below zero, to be refilled before anything else.
        """
        if not self.can_take(min(amount, self.capacity), now):
            raise ValueError(f"bucket holds {self._tokens} units, cannot lease {amount}")
        self._tokens -= amount
        if until > now and amount > 0:
            heapq.heappush(self._leases, (until, next(self._order), amount))
            self.leased += amount

    def refund(self, amount: float, now: float) -> None:
        """Give back ``amount`` units taken earlier (a cancelled request), never beyond capacity."""
        self._refill(now)
        if self.rate is not None:
            self._tokens = min(self.capacity - self.leased, self._tokens + max(0.0, amount))

    def ready_at(self, amount: float, now: float) -> float:
        """The earliest time >= ``now`` at which ``amount`` units are available; ``inf`` if never.

        ``amount`` must not exceed :attr:`capacity` (callers chunk bigger requests).
        """
        tokens = self.tokens(now)
        if _fits(tokens, amount):
            return now
        if not self.rate:
            return math.inf
        time, leased = max(now, self._updated), self.leased
        for end, _, units in sorted(self._leases):  # the room grows as leases end
            if _fits(self.capacity - leased, amount):
                break
            if end > time:
                room = self.capacity - leased
                if tokens < room:
                    tokens = min(room, tokens + self.rate * (end - time))
                time = end
            leased -= units
        if not _fits(self.capacity - leased, amount):
            return math.inf
        return time + max(0.0, amount - tokens) / self.rate

    def reconfigure(self, rate: float | None, period: float, now: float) -> None:
        """Apply a new rate and period at ``now``: refill at the old rate first, then clamp to the new
        capacity (less what is leased). Switching from unlimited starts full, like a new bucket."""
        self._refill(now)
        was_unlimited = self.rate is None
        self.rate, self.period = rate, period
        room = max(0.0, self.capacity - self.leased)
        self._tokens = room if was_unlimited else min(self._tokens, room)
