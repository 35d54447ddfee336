"""A partition job on an engine that reads its outbox again (``OutboxReader``) takes the committed
outbox in pages on start, never the whole of it at once: a sink far behind (a webhook endpoint
paused for days) must not make a restart hold its backlog in memory."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import pytest

from egress.engines import Checkpoint, OutboxMessage, OutboxReader, SinkProgress
from egress.runtime import partition_job
from tests.unit.runtime.test_holds import MESSAGES, MemoryEngine, Setup

PAGE = 16


@dataclasses.dataclass
class PagedEngine(MemoryEngine):
    """:class:`MemoryEngine` with a committed outbox of :data:`MESSAGES` messages nobody persisted."""

    outbox: list[OutboxMessage] = dataclasses.field(default_factory=list)
    loaded_with_outbox: list[bool] = dataclasses.field(default_factory=list)
    ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str], *,  # type: ignore[override]
                              with_outbox: bool = True) -> Checkpoint:
        self.loaded_with_outbox.append(with_outbox)
        positions = {("events", 0): len(self.log)}  # the input was read: only the outbox is left
        return Checkpoint(positions, {sink: SinkProgress() for sink in sinks}, self.outbox if with_outbox else [],
                          len(self.outbox) + 1)

    async def read_outbox(self, consumer: str, partition: int, after_seq: int, last_seq: int) -> list[OutboxMessage]:
        self.ranges.append((after_seq, last_seq))
        return [m for m in self.outbox if after_seq < m.seq <= last_seq]


async def test_a_job_starting_on_an_outbox_reader_distributes_the_committed_outbox_in_bounded_pages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_job, "OUTBOX_PAGE", PAGE)
    setup = Setup(tmp_path)
    engine = PagedEngine(setup.engine.log, clock=setup.clock, outbox=[
        OutboxMessage(seq, "requests", f"m{seq}".encode(), b"k", None, {"payload": f"p{seq}"})
        for seq in range(1, MESSAGES + 1)])
    assert isinstance(engine, OutboxReader)
    setup.engine = engine
    job = setup.job()
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(0)
    assert engine.loaded_with_outbox == [False]
    pages = engine.ranges
    assert pages[0][0] == 0  # from the lowest persisted seq
    assert pages[-1][1] == MESSAGES  # to the last committed one
    assert all(0 < last - after <= PAGE for after, last in pages)
    assert all(b[0] == a[1] for a, b in itertools.pairwise(pages))  # contiguous, no seq read twice
    async with setup.clock.autojumping():
        while job.sinks["http"].progress().max_persisted_seq_no < MESSAGES:
            await setup.clock.sleep(0.1)
    assert len(setup.transport.times()) == MESSAGES  # every message of the outbox delivered once
    job.stop()
    async with setup.clock.autojumping():
        await run
