"""The sender's retry rules: Firehose's backoff parameters (the formula is
``egress.httpclient.backoff.DoublingBackoff``) and its ``retry_duration`` budget, pure and clock-driven.

Source: Firehose HTTP endpoint spec, "Handling error responses": the first retry waits 1 s, each
next one doubles, the wait is capped at 2 minutes and jittered by ±15 %:
``wait(n) = min(120, 1 × 2^n) × uniform(0.85, 1.15)`` for retry ``n`` = 0, 1, 2, ... (the spec's text
writes MAX where it means MIN). ``retry_duration`` (0..7200 s; 0 = no retries) counts from the first
failed attempt and excludes the time spent waiting for responses; an attempt already in flight when
it runs out is still awaited (docs/firehose.md, "Sender").
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 120.0
JITTER_RATIO = 0.15
MAX_RETRY_DURATION_SECONDS = 7200


@dataclass
class RetryBudget:
    """Bookkeeping of one batch's ``retry_duration`` (seconds); times are ``Clock.monotonic()`` values.

    Call :meth:`attempt_finished` after every attempt with when it started and ended and whether it
    failed, then :meth:`may_retry_after` with the next wait to learn whether another attempt may
    start. ``attempts`` counts attempts made.
    """

    retry_duration: float
    attempts: int = 0
    _first_failure_end: float | None = None
    _response_wait_after_first_failure: float = 0.0

    def attempt_finished(self, started: float, ended: float, *, failed: bool) -> None:
        self.attempts += 1
        if not failed:
            return
        if self._first_failure_end is None:
            self._first_failure_end = ended
        else:
            self._response_wait_after_first_failure += max(0.0, ended - started)

    def elapsed(self, now: float) -> float:
        """Seconds counted against ``retry_duration`` so far (0 before the first failure)."""
        if self._first_failure_end is None:
            return 0.0
        return max(0.0, now - self._first_failure_end - self._response_wait_after_first_failure)

    def may_retry_after(self, now: float, wait: float) -> bool:
        """Whether a retry that starts ``wait`` seconds from ``now`` starts within the budget.

        ``retry_duration`` 0 never allows a retry.
        """
        return self.retry_duration > 0 and self.elapsed(now) + wait <= self.retry_duration
