"""The retry backoffs of the HTTP sinks: one protocol (:class:`Backoff`, the pause before retry ``n``
for a jitter ``sample`` in ``[-1, 1]``), one draw (:func:`draw`), two formulas, each exactly as its
source states it.

:class:`BackoffPolicy` is Flow's (the async and batching HTTP sinks): upstream ``TAsyncHttpSink``'s
retry formula (``yt/yt/flow/extensions/http``), restated in ``docs/http-sink.md``, in integer
microseconds::

    d = clamp(initial, minimum, maximum)
    repeat retry_index times: if d >= maximum / multiplier: d = maximum; stop; else d = d * multiplier
    return clamp(d * (1 + jitter_ratio * sample), minimum, maximum)      # sample uniform in [-1, 1)

:class:`DoublingBackoff` is Firehose's (the Firehose sink): the Firehose HTTP endpoint spec, "Handling
error responses", ``min(maximum, initial × 2^n) × (1 + jitter_ratio × sample)``: jitter after the cap,
so a pause may pass ``maximum`` (``docs/firehose.md``, "Sender").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

MICROSECONDS = 1_000_000


class Backoff(Protocol):
    def seconds(self, retry_index: int, sample: float) -> float:
        """The pause before retry ``retry_index`` (0 for the first retry) for the jitter draw ``sample``
        in ``[-1, 1]``, in seconds. Raises ``ValueError`` for a negative ``retry_index``."""
        ...


def draw(backoff: Backoff, retry_index: int, rng: random.Random | None = None) -> float:
    """``backoff.seconds(retry_index, sample)`` for a fresh uniform ``sample`` in ``[-1, 1)`` from ``rng``."""
    return backoff.seconds(retry_index, (rng or random).uniform(-1.0, 1.0))


@dataclass(frozen=True)
class BackoffPolicy:
    """Backoff parameters in seconds (``float``) and plain ratios; see the module docs."""

    initial_delay: float = 1.0
    minimum_delay: float = 0.1
    maximum_delay: float = 30.0
    multiplier: float = 2.0
    jitter_ratio: float = 0.2

    def seconds(self, retry_index: int, sample: float) -> float:
        return backoff_microseconds(self, retry_index, sample) / MICROSECONDS


@dataclass(frozen=True)
class DoublingBackoff:
    """Firehose's backoff (see the module docs): seconds ``initial`` doubled per retry, capped at
    ``maximum``, then jittered by ``jitter_ratio``."""

    initial: float
    maximum: float
    jitter_ratio: float

    def seconds(self, retry_index: int, sample: float) -> float:
        """Raises ``ValueError`` for a negative index or a sample outside ``[-1, 1]``."""
        if retry_index < 0:
            raise ValueError(f"retry_index must be >= 0, got {retry_index}")
        if not -1.0 <= sample <= 1.0:
            raise ValueError(f"sample must be in [-1, 1], got {sample}")
        base = self.maximum if retry_index >= 64 else min(self.maximum, self.initial * 2.0 ** retry_index)
        return base * (1.0 + self.jitter_ratio * sample)


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
    """:func:`backoff_microseconds` with a fresh uniform sample in ``[-1, 1)``, as seconds (:func:`draw`)."""
    return draw(policy, retry_index, rng)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
