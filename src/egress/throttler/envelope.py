"""The token bucket's envelope, measured: how far a record of releases goes beyond it.

The promise of a throttler with rate ``limit`` units/s and burst ``limit·period`` units is that for
every window ``[t1, t2]`` the units released in it are at most ``∫limit dt + limit·period`` (with a
constant limit: ``limit·T + limit·period`` for a window of length ``T``). :func:`worst_excess` finds
the largest excess over every window of a record in one pass, so tests, the e2e test and the
benchmark check the promise the same way. Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence


class RateSteps:
    """A limit that changes in steps: ``steps`` = ``[(from time, units/s), ...]`` sorted by time, the
    first one in force from the start of the record. :meth:`cumulative` is ``∫limit dt`` from 0."""

    def __init__(self, steps: Sequence[tuple[float, float]]) -> None:
        if not steps:
            raise ValueError("RateSteps needs at least one (time, rate) step")
        ordered = sorted(steps)
        self._times = [time for time, _ in ordered]
        self._rates = [rate for _, rate in ordered]
        self._before = [0.0]  # ∫ from the first step up to each step
        for i in range(1, len(ordered)):
            self._before.append(self._before[-1] + self._rates[i - 1] * (self._times[i] - self._times[i - 1]))

    def cumulative(self, time: float) -> float:
        """``∫limit dt`` from the first step's time to ``time`` (units; earlier times count at the first rate)."""
        index = max(0, bisect.bisect_right(self._times, time) - 1)
        return self._before[index] + self._rates[index] * (time - self._times[index])


def worst_excess(releases: Iterable[tuple[float, float]], limit: float | RateSteps, burst: float) -> float:
    """The largest ``units released in [t1, t2] − ∫limit dt − burst`` over every window (units).

    ``releases`` are ``(time in seconds, units)`` in any order; ``limit`` is units/s or a
    :class:`RateSteps`; ``burst`` is ``limit·period`` (the largest one when the limit changes).
    The worst windows start and end at releases, so only those are searched: O(n log n).
    Returns ``-burst`` for an empty record; a value ``<= 0`` means the envelope held.
    """
    steps = limit if isinstance(limit, RateSteps) else RateSteps([(0.0, limit)])
    grouped: dict[float, float] = {}
    for time, units in releases:
        grouped[time] = grouped.get(time, 0.0) + units
    worst = -burst
    released_before = 0.0  # units released before the current time
    best_start = -math.inf  # max over window starts a <= b of (∫limit up to t_a − units before t_a)
    for time in sorted(grouped):
        rate_integral = steps.cumulative(time)
        best_start = max(best_start, rate_integral - released_before)
        released_before += grouped[time]
        worst = max(worst, released_before - rate_integral + best_start - burst)
    return worst
