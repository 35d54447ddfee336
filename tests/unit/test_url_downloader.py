"""Upstream's unit tests of the URL downloader example (MessageSchedulesHostCheckTimer,
TimerOnEmptyHostClearsStateAndEmitsNothing) and its other rules, on a virtual clock."""

from __future__ import annotations

from collections import deque

import pytest
from examples.url_downloader.functions import (
    FetchResult,
    LimitedHostState,
    LimitedUrlDownloadFunction,
    host_hash,
    next_host_check,
)

from egress.errors import SpecErrors
from egress.testing import ProcessFunctionHarness

HOST = "example.com"
KEY = (HOST,)


def harness(now: float = 42, **dynamic: object) -> ProcessFunctionHarness:
    return ProcessFunctionHarness(LimitedUrlDownloadFunction, now=now, dynamic_parameters=dict(dynamic),
                                  output_stream_ids=["processed_urls"])


def url(n: int) -> dict[str, str]:
    return {"host": HOST, "url": f"http://{HOST}/page{n}"}


async def test_message_schedules_host_check_timer() -> None:
    h = harness(now=42)
    assert await h.process_message(url(1), key=KEY) == []
    expected = 42 - 42 % 5 + host_hash(HOST) % 5 + 5
    assert h.timers() == [(KEY, float(expected))]
    assert 42 < expected <= 50
    assert h.state("host_state", KEY) == LimitedHostState(host=HOST, urls=deque([f"http://{HOST}/page1"]))
    await h.close()


async def test_timer_on_empty_host_clears_state_and_emits_nothing() -> None:
    h = harness(now=42)
    h.set_state("host_state", KEY, LimitedHostState(host=HOST))
    assert await h.process_timer(KEY, 45) == []
    assert h.state("host_state", KEY) is None
    assert h.timers() == []
    await h.close()


def test_the_next_check_has_a_per_host_phase_and_is_always_later() -> None:
    for ts in (0.0, 4.999, 5.0, 42.0, 1_700_000_000.5):
        for host in ("a", "b", "example.com"):
            check = next_host_check(host, ts, 5)
            assert ts < check <= ts + 10
            assert (check - host_hash(host) % 5) % 5 == 0


async def test_urls_are_downloaded_politely_and_emitted_on_the_host_timer() -> None:
    h = harness(now=42)
    for n in range(3):
        await h.process_message(url(n), key=KEY)
    # The worker downloads one URL, then pauses 0.5-1.5 s: three URLs take at most 3 s.
    outputs = []
    for _ in range(3):
        outputs += await h.advance(5)
    assert [o.row["url"] for o in outputs] == [f"http://{HOST}/page{n}" for n in range(3)]
    assert outputs[0].row["data"] == "length: 24, digits: 1"
    assert h.state("host_state", KEY) is None  # all emitted: state cleared, host unregistered
    assert h.timers() == []
    await h.close()


async def test_persist_limit_drops_the_oldest_urls() -> None:
    h = harness(now=42, persist_limit=2)
    for n in range(4):
        await h.process_message(url(n), key=KEY)
    assert list(h.state("host_state", KEY).urls) == [f"http://{HOST}/page2", f"http://{HOST}/page3"]
    await h.close()


async def test_a_timer_after_a_restart_revives_the_host_from_state() -> None:
    h = harness(now=100)  # a fresh process: no downloader worker, only committed state and a timer
    h.set_state("host_state", KEY, LimitedHostState(host=HOST, urls=deque([f"http://{HOST}/a", f"http://{HOST}/b"])))
    assert await h.process_timer(KEY, 100) == []  # revived: the worker starts from the state
    assert len(h.timers()) == 1
    outputs = await h.advance(10)
    assert sorted(o.row["url"] for o in outputs) == [f"http://{HOST}/a", f"http://{HOST}/b"]
    assert h.state("host_state", KEY) is None
    await h.close()


def test_check_host_period_must_be_more_than_a_second() -> None:
    with pytest.raises(SpecErrors, match="check_host_period must be more than 1 s"):
        harness(check_host_period="1s")
    assert harness(check_host_period="1500ms").invoker.context.dynamic_parameters.check_host_period == 1.5


class SlowDownload(LimitedUrlDownloadFunction):
    """Downloads that take 0.7 s (virtual), so host checks fire while a download is running."""

    async def simulate(self, url: str) -> FetchResult:
        await self.clock.sleep(0.7)
        return await super().simulate(url)


async def test_a_download_finishing_while_the_host_timer_extracts_is_not_lost() -> None:
    h = ProcessFunctionHarness(SlowDownload, now=0, dynamic_parameters={"check_host_period": "1500ms"},
                               output_stream_ids=["processed_urls"])
    for n in range(6):
        await h.process_message(url(n), key=KEY)
    outputs = []
    for _ in range(20):
        outputs += await h.advance(1)
    assert sorted(o.row["url"] for o in outputs) == sorted(f"http://{HOST}/page{n}" for n in range(6))
    assert h.state("host_state", KEY) is None
    await h.close()
