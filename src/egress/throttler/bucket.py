"""The token bucket of one named throttler: pure arithmetic over times passed in (no clock, no I/O).

Source: upstream Flow distributed throttler controller (one bucket per throttler): rate ``limit``
units/s, capacity and largest burst ``limit * period`` units, starts full, ``limit=None`` unlimited.
Tokens never go negative, so over any window ``[t1, t2]`` at most ``∫limit dt + capacity`` units leave.
"""

from __future__ import annotations

import math

EPSILON = 1e-9
"""Relative slack for float comparisons so that a wake-up computed from a deficit grants exactly."""


class TokenBucket:
    """Tokens (units) refilled at ``rate`` units/s up to ``rate * period``; ``rate=None`` is unlimited.

    All ``now`` arguments are seconds on one monotonic clock and must not go back.
    """

    def __init__(self, rate: float | None, period: float, now: float) -> None:
        self.rate = rate
        self.period = period
        self._tokens = self.capacity
        self._updated = now

    @property
    def unlimited(self) -> bool:
        return self.rate is None

    @property
    def capacity(self) -> float:
        """Largest burst in units (``inf`` when unlimited)."""
        return math.inf if self.rate is None else self.rate * self.period

    def tokens(self, now: float) -> float:
        """Units available at ``now`` (``inf`` when unlimited)."""
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        if self.rate is None:
            self._tokens = math.inf
        elif now > self._updated:
            self._tokens = min(self.capacity, self._tokens + self.rate * (now - self._updated))
        self._updated = max(self._updated, now)

    def can_take(self, amount: float, now: float) -> bool:
        """Whether ``amount`` units are available at ``now`` (within float slack)."""
        return self.tokens(now) >= amount - EPSILON * max(1.0, amount)

    def take(self, amount: float, now: float) -> None:
        """Consume ``amount`` units; raises ``ValueError`` when fewer are available."""
        if not self.can_take(amount, now):
            raise ValueError(f"bucket holds {self._tokens} units, cannot take {amount}")
        if self.rate is not None:
            self._tokens = max(0.0, self._tokens - amount)

    def refund(self, amount: float, now: float) -> None:
        """Give back ``amount`` units taken earlier (a cancelled request), never beyond capacity."""
        self._refill(now)
        if self.rate is not None:
            self._tokens = min(self.capacity, self._tokens + max(0.0, amount))

    def ready_at(self, amount: float, now: float) -> float:
        """The earliest time >= ``now`` at which ``amount`` units are available; ``inf`` if never.

        ``amount`` must not exceed :attr:`capacity` (callers chunk bigger requests).
        """
        tokens = self.tokens(now)
        if tokens >= amount - EPSILON * max(1.0, amount):
            return now
        if not self.rate:
            return math.inf
        return now + (amount - tokens) / self.rate

    def reconfigure(self, rate: float | None, period: float, now: float) -> None:
        """Apply a new rate and period at ``now``: refill at the old rate first, then clamp to the new
        capacity. Switching from unlimited starts full, like a new bucket."""
        self._refill(now)
        was_unlimited = self.rate is None
        self.rate, self.period = rate, period
        self._tokens = self.capacity if was_unlimited else min(self._tokens, self.capacity)
