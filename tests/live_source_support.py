"""Checks shared by the tests of the live sources (``egress.connectors.base.LiveSource``)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from egress.clock import VirtualClock
from egress.connectors.base import LiveSource
from tests.waiting import eventually


class ClockedLiveSource(LiveSource, Protocol):
    def use_clock(self, clock: VirtualClock) -> None: ...


async def assert_an_idle_take_waits_on_the_clock(source: ClockedLiveSource) -> None:
    """``source`` (a live source with ``use_clock``, not started) given a ``VirtualClock``: started, a
    ``take(10, 30.0)`` with nothing to read returns ``[]`` once 30 virtual seconds pass, not 30 of
    the machine's; closed at the end."""
    clock = VirtualClock(1_000.0)
    source.use_clock(clock)
    await source.start(0, b"", until_caught_up=False)
    try:
        taking = asyncio.create_task(source.take(10, 30.0))
        async with asyncio.timeout(2):
            await eventually(lambda: clock.next_deadline() is not None, what="the take waiting on the clock")
            await clock.advance(30.0)
            assert await taking == []
    finally:
        await source.close()
