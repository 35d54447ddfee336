"""The circuit breaker of one webhook endpoint: pure, driven by the times it is given
(``clock.monotonic()`` seconds), so tests run it on a virtual clock.

States: ``closed`` (attempts go), ``open`` (none goes until ``open_for`` has passed), ``half_open``
(``half_open_probes`` attempts may go; a success closes, a failure opens again) and ``paused``
(not closed for ``disable_after``: nothing goes until :meth:`Breaker.resume`). Outcomes are kept per
second over the ``window``, so memory does not grow with the request rate.
"""

from __future__ import annotations

import collections
import math
from typing import Literal

from egress.connectors.sinks.webhook_parameters import BreakerSpec

State = Literal["closed", "open", "half_open", "paused"]
STATE_CODES: dict[str, int] = {"closed": 0, "half_open": 1, "open": 2, "paused": 3}


class Breaker:
    """One endpoint's breaker under ``spec`` (replace :attr:`spec` to apply a DynamicSpec change)."""

    def __init__(self, spec: BreakerSpec) -> None:
        self.spec = spec
        self._state: State = "closed"
        self._open_until = 0.0
        self._failing_since: float | None = None  # when it last left closed
        self._probes = 0  # attempts admitted while half-open, not ended yet
        self._seconds: collections.deque[list[int]] = collections.deque()  # [second, attempts, failures]
        self._attempts = 0  # the sums over ``_seconds``, kept as they change (a record is O(1))
        self._failures = 0
        self.opened = 0  # times it opened (a metric)

    def state(self, now: float) -> State:
        """The state at ``now`` (open turns half-open once ``open_for`` passed; not closed for
        ``disable_after`` turns paused)."""
        if self._state in ("open", "half_open"):
            limit = self.spec.disable_after
            if limit is not None and self._failing_since is not None and now - self._failing_since >= limit:
                self._state = "paused"
            elif self._state == "open" and now >= self._open_until:
                self._state = "half_open"
                self._probes = 0
        return self._state

    def admit(self, now: float) -> bool:
        """Whether an attempt may start now; a half-open admission takes a probe slot, given back by
        :meth:`record` or :meth:`release`."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "half_open" and self._probes < self.spec.half_open_probes:
            self._probes += 1
            return True
        return False

    def release(self) -> None:
        """An admitted attempt did not happen after all (its delivery ended first)."""
        if self._state == "half_open" and self._probes > 0:
            self._probes -= 1

    def wait_until(self, now: float) -> float:
        """Until when nothing may start: the end of the open time, or ``math.inf`` (paused, or the
        probes of half-open all out: an outcome changes that)."""
        state = self.state(now)
        if state == "open":
            limit = self.spec.disable_after
            if limit is not None and self._failing_since is not None:
                return min(self._open_until, self._failing_since + limit)  # wake to see it pause
            return self._open_until
        return now if state == "closed" else math.inf

    def record(self, now: float, *, failed: bool) -> None:
        """An attempt ended at ``now``; count it and change state."""
        state = self.state(now)
        if state == "paused":
            return
        if state == "half_open":
            self._probes = max(0, self._probes - 1)
            if failed:
                self._open(now)
            else:
                self._close()
            return
        if state == "open":  # an attempt admitted before it opened: counts for nothing now
            return
        second = int(now)
        seconds = self._seconds
        if seconds and seconds[-1][0] == second:
            last = seconds[-1]
            last[1] += 1
            last[2] += failed
        else:
            seconds.append([second, 1, int(failed)])
        self._attempts += 1
        self._failures += failed
        horizon = now - self.spec.window
        while seconds and seconds[0][0] + 1 <= horizon:
            _, attempts, failures = seconds.popleft()
            self._attempts -= attempts
            self._failures -= failures
        if failed and self._attempts >= self.spec.minimum_requests and \
                self._failures >= self.spec.failure_ratio * self._attempts:
            self._open(now)

    def resume(self) -> None:
        """Closed again, whatever the state (an operator's resume, or a DynamicSpec's)."""
        self._close()

    def _open(self, now: float) -> None:
        if self._failing_since is None:
            self._failing_since = now
        self._state = "open"
        self._open_until = now + self.spec.open_for
        self._probes = 0
        self.opened += 1

    def _close(self) -> None:
        self._state = "closed"
        self._failing_since = None
        self._probes = 0
        self._seconds.clear()
        self._attempts = self._failures = 0


__all__ = ["STATE_CODES", "Breaker", "State"]
