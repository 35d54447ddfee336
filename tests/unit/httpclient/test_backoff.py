"""The upstream TAsyncHttpSink backoff formula (CalculatesJitteredDelay), in integer microseconds."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.httpclient import BackoffPolicy, backoff_microseconds, backoff_seconds

DEFAULTS = BackoffPolicy()


@pytest.mark.parametrize(("sample", "expected"), [(-1.0, 800_000), (0.0, 1_000_000), (1.0, 1_200_000)])
def test_first_retry_with_defaults_is_one_second_jittered_by_twenty_percent(sample: float, expected: int) -> None:
    assert backoff_microseconds(DEFAULTS, 0, sample) == expected


def test_delays_double_then_stop_at_the_maximum() -> None:
    assert [backoff_microseconds(DEFAULTS, i, 0.0) for i in range(7)] == [
        1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000, 30_000_000, 30_000_000]


def test_index_99_stays_within_24_and_30_seconds() -> None:
    rng = random.Random(7)
    delays = [backoff_seconds(DEFAULTS, 99, rng) for _ in range(1000)]
    assert min(delays) >= 24.0
    assert max(delays) <= 30.0


def test_jitter_never_goes_below_the_minimum() -> None:
    policy = BackoffPolicy(initial_delay=0.1, minimum_delay=0.1, maximum_delay=1.0, jitter_ratio=1.0)
    assert backoff_microseconds(policy, 0, -1.0) == 100_000


def test_negative_retry_index_is_an_error() -> None:
    with pytest.raises(ValueError, match="retry_index"):
        backoff_microseconds(DEFAULTS, -1, 0.0)


@given(index=st.integers(0, 200), sample=st.floats(-1.0, 1.0))
def test_every_delay_is_clamped_between_minimum_and_maximum(index: int, sample: float) -> None:
    delay = backoff_microseconds(DEFAULTS, index, sample)
    assert 100_000 <= delay <= 30_000_000
