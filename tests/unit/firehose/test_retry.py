"""Firehose's backoff and retry_duration rules, as pure functions of time."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.firehose.retry import INITIAL_BACKOFF_SECONDS, JITTER_RATIO, MAX_BACKOFF_SECONDS, RetryBudget
from egress.httpclient.backoff import DoublingBackoff, draw

FIREHOSE = DoublingBackoff(INITIAL_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, JITTER_RATIO)
backoff_seconds = FIREHOSE.seconds


def test_backoff_doubles_from_one_second_and_caps_at_two_minutes() -> None:
    assert [backoff_seconds(n, 0.0) for n in range(9)] == [1, 2, 4, 8, 16, 32, 64, 120, 120]
    assert backoff_seconds(1000, 0.0) == 120


@given(st.integers(0, 200), st.floats(-1.0, 1.0))
def test_jitter_is_plus_or_minus_fifteen_percent(n: int, sample: float) -> None:
    base = min(120.0, 2.0 ** min(n, 10))
    assert 0.85 * base - 1e-9 <= backoff_seconds(n, sample) <= 1.15 * base + 1e-9


def test_extremes_of_the_jitter() -> None:
    assert backoff_seconds(0, -1.0) == pytest.approx(0.85)
    assert backoff_seconds(7, 1.0) == pytest.approx(138.0)


@pytest.mark.parametrize(("n", "sample"), [(-1, 0.0), (0, 1.5), (0, -1.01)])
def test_bad_arguments(n: int, sample: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        backoff_seconds(n, sample)


def test_draw_backoff_is_repeatable_with_a_seed() -> None:
    assert [draw(FIREHOSE, n, random.Random(7)) for n in range(5)] == [draw(FIREHOSE, n, random.Random(7))
                                                                        for n in range(5)]


def test_budget_counts_from_the_first_failure_and_excludes_response_waits() -> None:
    budget = RetryBudget(retry_duration=10.0)
    budget.attempt_finished(0.0, 50.0, failed=True)  # a 50 s wait for the first response: not counted
    assert budget.elapsed(50.0) == 0.0
    assert budget.may_retry_after(50.0, 10.0)
    assert not budget.may_retry_after(50.0, 10.01)
    budget.attempt_finished(54.0, 150.0, failed=True)  # slept 4 s, then waited 96 s for a response
    assert budget.elapsed(150.0) == pytest.approx(4.0)
    assert budget.may_retry_after(150.0, 6.0)
    assert not budget.may_retry_after(150.0, 6.5)
    assert budget.attempts == 2


def test_zero_retry_duration_means_one_attempt() -> None:
    budget = RetryBudget(retry_duration=0.0)
    budget.attempt_finished(0.0, 1.0, failed=True)
    assert not budget.may_retry_after(1.0, 0.0)


def test_successful_attempt_does_not_start_the_budget() -> None:
    budget = RetryBudget(retry_duration=5.0)
    budget.attempt_finished(0.0, 3.0, failed=False)
    assert budget.elapsed(100.0) == 0.0
