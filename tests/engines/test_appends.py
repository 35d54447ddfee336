"""Conformance, ``on_appends``: a worker hears of the log appends another worker's engine
committed (SQLite: only engines shared by processes on one state directory)."""

from __future__ import annotations

import asyncio

from egress.engines import EpochCommit
from tests.engines.conftest import Workers


async def test_on_appends_tells_a_worker_which_slots_another_worker_appended_to(workers: Workers) -> None:
    listener, writer = await workers.open(), await workers.open()
    heard: list[set[tuple[str, int]] | None] = []
    woken = asyncio.Event()

    def on_appends(slots: set[tuple[str, int]] | None) -> None:
        heard.append(slots)
        woken.set()

    listener.on_appends(on_appends)
    own = await listener.acquire("own", 0)
    await listener.commit(EpochCommit("own", 0, own, log_appends=[("mine", 0, b"m", b"[]", None, {})]))
    other = await writer.acquire("other", 0)
    # the listener may start listening after the first commits, and polls on the engine's clock:
    # commit and let time pass until it hears one
    for n in range(40):
        await writer.commit(EpochCommit("other", 0, other, {("in", 0): n},
                                        log_appends=[("theirs", 3, b"t%d" % n, b"[]", None, {})]))
        try:
            await asyncio.wait_for(woken.wait(), 0.1)
            break
        except TimeoutError:
            await workers.tick()
    assert woken.is_set()
    assert set().union(*(slots or set() for slots in heard)) == {("theirs", 3)}
