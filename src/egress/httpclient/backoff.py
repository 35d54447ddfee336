"""The retry backoff of Flow's async HTTP sink, as a pure function in integer microseconds.

Source: upstream ``TAsyncHttpSink`` retry formula (``yt/yt/flow/extensions/http``), restated in
``docs/http-sink.md``::

    d = clamp(initial, minimum, maximum)
    repeat retry_index times: if d >= maximum / multiplier: d = maximum; stop; else d = d * multiplier
    return clamp(d * (1 + jitter_ratio * sample), minimum, maximum)      # sample uniform in [-1, 1)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MICROSECONDS = 1_000_000


@dataclass(frozen=True)
class BackoffPolicy:
    """Backoff parameters in seconds (``float``) and plain ratios; see the module docs."""

    initial_delay: float = 1.0
    minimum_delay: float = 0.1
    maximum_delay: float = 30.0
    multiplier: float = 2.0
    jitter_ratio: float = 0.2


def backoff_microseconds(policy: BackoffPolicy, retry_index: int, sample: float) -> int:
    """The pause before retry number ``retry_index`` (0 for the first retry), in microseconds.

    ``sample`` is the jitter draw in ``[-1, 1]``; each multiplication truncates to whole
    microseconds as upstream does. Raises ``ValueError`` for a negative ``retry_index``.
    """
    if retry_index < 0:
        raise ValueError(f"retry_index must be >= 0, got {retry_index}")
    minimum = int(policy.minimum_delay * MICROSECONDS)
    maximum = int(policy.maximum_delay * MICROSECONDS)
    delay = _clamp(int(policy.initial_delay * MICROSECONDS), minimum, maximum)
    for _ in range(retry_index):
        if delay >= maximum / policy.multiplier:
            delay = maximum
            break
        delay = int(delay * policy.multiplier)
    jittered = int(delay * (1.0 + policy.jitter_ratio * sample))
    return _clamp(jittered, minimum, maximum)


def backoff_seconds(policy: BackoffPolicy, retry_index: int, rng: random.Random | None = None) -> float:
    """:func:`backoff_microseconds` with a fresh uniform sample in ``[-1, 1)``, as seconds."""
    sample = (rng or random).uniform(-1.0, 1.0)
    return backoff_microseconds(policy, retry_index, sample) / MICROSECONDS


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
