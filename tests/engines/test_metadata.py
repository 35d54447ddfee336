"""Conformance, metadata and the inventory: what the Spec check and the drained check read."""

from __future__ import annotations

from egress.engines import Engine, EpochCommit
from tests.engines.conftest import OpenEngine
from tests.engines.engines import outbox_message


async def test_metadata_values_are_kept_across_reopening(engine: Engine, reopen: OpenEngine) -> None:
    assert await engine.read_meta("spec_layout") is None
    await engine.write_meta("spec_layout", "{}")
    await engine.write_meta("spec_layout", '{"partition_count": 2}')
    await engine.close()
    again = await reopen()
    assert await again.read_meta("spec_layout") == '{"partition_count": 2}'


async def test_the_inventory_counts_where_committed_work_waits(engine: Engine) -> None:
    source = await engine.acquire("source:s", 0)
    await engine.commit(EpochCommit("source:s", 0, source, {("", 0): 5}, log_appends=[
        ("events", p, f"m{i}".encode(), b"[]", None, {}) for i, p in enumerate([0, 0, 2, 2, 2])]))
    job = await engine.acquire("c", 2)
    await engine.commit(EpochCommit("c", 2, job, {("events", 2): 1}, outbox=[outbox_message(1), outbox_message(2)],
                                    timers_set=[(b'["a"]', 10.0, "processing")]))
    found = await engine.inventory()
    assert found.log_ends == {("events", 0): 2, ("events", 2): 3}
    assert found.read_positions == {("events", 2): [1]}  # the source reader's position is not a read
    assert found.outbox == {("c", 2, "requests"): 2}
    assert found.timers == {("c", 2): 1}
