"""Quota classes' shares, measured over a record of grants: every window's share, the longest gap.

The promise of weighted classes under saturation is a share by weight over every window and no
long stretch without a grant for any backlogged class. A record is ``(position, class id, units)``
in order of position, on any timeline: seconds on one clock, or the units granted before each grant
(:func:`units_timeline`, the grants' own timeline: a pause of the machine stretches every class
alike, so a test on a loaded machine measures the scheduling, not the machine's speed). Tests,
the e2e test and the benchmark measure the same way. Pure: no clock, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

Record = Sequence[tuple[float, str, float]]
"""``(position, class id, units)`` per grant, in order of position."""


def units_timeline(grants: Iterable[tuple[str, float]]) -> list[tuple[float, str, float]]:
    """A record from ``(class id, units)`` in the order granted: each position is the units granted
    before it."""
    record: list[tuple[float, str, float]] = []
    position = 0.0
    for class_id, units in grants:
        record.append((position, class_id, units))
        position += units
    return record


def share_range(record: Record, class_id: str, window: float) -> tuple[float, float]:
    """``(lowest, highest)`` share of ``class_id`` in the units granted in ``[p, p + window)``, over
    every window that starts at a grant and ends inside the record (O(n)).

    Raises ``ValueError`` when the record spans less than one ``window``.
    """
    if not record or record[-1][0] - record[0][0] < window:
        raise ValueError(f"the record spans less than one window of {window:g}")
    lowest, highest = 1.0, 0.0
    end, total, own = 0, 0.0, 0.0
    for position, start_class, units in record:
        if position + window > record[-1][0]:
            break
        while end < len(record) and record[end][0] < position + window:
            total += record[end][2]
            own += record[end][2] if record[end][1] == class_id else 0.0
            end += 1
        share = own / total if total > 0 else 0.0
        lowest, highest = min(lowest, share), max(highest, share)
        total -= units
        own -= units if start_class == class_id else 0.0
    return lowest, highest


def longest_gap(record: Record, class_id: str) -> float:
    """The longest stretch of the record's positions with no grant of ``class_id``, its start and
    end included (the whole span when the class got nothing)."""
    if not record:
        return 0.0
    positions = [record[0][0], *(p for p, c, _ in record if c == class_id), record[-1][0]]
    return max(b - a for a, b in itertools.pairwise(positions))
