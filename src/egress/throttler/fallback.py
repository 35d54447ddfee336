"""Quota a client spends on its own while no controller can be reached (pure: takes ``now``).

Two uses, both beyond upstream (which blocks): ``safe_rate`` (Doorman's safe capacity), one budget
per client, and ``fallback_rate``, one budget per process and throttler shared by every client of
it, at ``fallback_rate / live workers`` units/s, so the workers of a cluster together stay within
``fallback_rate``. A budget starts empty when its first client finds the controller away, refills
at its rate up to ``rate × request_period`` units, and may go below zero (a call larger than what
is left is served, later calls wait the longer).
"""

from __future__ import annotations

from collections.abc import Callable


class AwayBudget:
    """Tokens for calls served without the controller. ``rate()`` is units/s (``-1``: unthrottled,
    ``0``: none: calls wait); ``request_period()`` seconds sets the capacity ``rate × request_period``."""

    def __init__(self, rate: Callable[[], float], request_period: Callable[[], float]) -> None:
        self._rate = rate
        self._request_period = request_period
        self.tokens = 0.0
        self.updated = 0.0
        self.clients_away = 0

    @property
    def rate(self) -> float:
        return self._rate()

    @property
    def capacity(self) -> float:
        return max(0.0, self.rate) * self._request_period()

    def leave(self, now: float) -> None:
        """A client found the controller away; the first one starts the budget empty."""
        if self.clients_away == 0:
            self.tokens, self.updated = 0.0, now
        self.clients_away += 1

    def come_back(self) -> None:
        """A client reached a controller again."""
        self.clients_away = max(0, self.clients_away - 1)

    def refill(self, now: float) -> None:
        rate = self.rate
        if rate > 0:
            self.tokens = min(self.capacity, self.tokens + rate * (now - self.updated))
        self.updated = now

    def take(self, amount: float, now: float) -> float:
        """Take ``amount`` when the budget covers it (or what one period allows of it); returns 0
        when taken, else the seconds until it will be (``inf`` at rate 0)."""
        self.refill(now)
        rate = self.rate
        if rate < 0:
            return 0.0
        if rate == 0:
            return float("inf")
        need = min(amount, self.capacity)
        if self.tokens >= need - 1e-9:
            self.tokens -= amount  # may go below zero: later calls wait longer
            return 0.0
        return (need - self.tokens) / rate
