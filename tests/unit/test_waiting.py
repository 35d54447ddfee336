"""The tests' wait (tests/waiting.py): it returns the condition's first truthy value and fails
naming what it awaited and what it last saw."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import eventually, eventually_sync


async def test_eventually_returns_the_first_truthy_value_of_a_plain_or_an_async_condition() -> None:
    counts = itertools.count()
    assert await eventually(lambda: next(counts) >= 3 and "three", what="three polls") == "three"

    async def ready() -> int:
        return next(counts)

    assert await eventually(ready, what="a non-zero count") > 0


async def test_eventually_fails_naming_what_it_awaited_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last seen: \[\]"):
        await eventually(list, what="the answer", timeout=0.05)


async def test_eventually_treats_an_ignored_exception_as_not_yet_and_stops_at_a_reason() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("not listening")

    with pytest.raises(AssertionError, match="last seen: ConnectionRefusedError"):
        await eventually(refused, what="a listener", timeout=0.05, ignoring=(OSError,))
    with pytest.raises(AssertionError, match="gave up waiting for a listener: it exited"):
        await eventually(refused, what="a listener", ignoring=(OSError,), unless=lambda: "it exited")


def test_eventually_sync_polls_in_blocking_code() -> None:
    counts = itertools.count()
    assert eventually_sync(lambda: next(counts) == 2, what="two polls")
    with pytest.raises(AssertionError, match="waiting for nothing; last seen: 0"):
        eventually_sync(lambda: 0, what="nothing", timeout=0.05)


async def test_without_what_a_failure_names_the_condition_by_its_source() -> None:
    pending: list[int] = []
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: len\(pending\) > 2"):
        await eventually(lambda: len(pending) > 2, timeout=0.05)


def test_a_failure_ends_with_the_details_asked_for_then() -> None:
    with pytest.raises(AssertionError, match=r"last seen: False\nthe log's tail"):
        eventually_sync(lambda: False, what="a line", timeout=0.05, details=lambda: "the log's tail")
