"""A cluster's drained check from the engine alone: source flags of the live lease, outstanding work."""

from __future__ import annotations

from pathlib import Path

from egress.engines import LeaseInfo
from egress.runtime.cluster.drained import FinishedFlags, outstanding_work, source_is_finished
from egress.runtime.unit import Unit
from tests.unit.runtime.test_layout import inventory, plan_of

SOURCE = Unit.source("events_jsonl")


def lease(generation: int, unit: Unit = SOURCE) -> LeaseInfo:
    return LeaseInfo(unit.consumer, unit.partition, "worker-a", generation, 5.0)


def test_a_source_is_finished_when_its_flag_is_the_generation_of_its_live_lease() -> None:
    assert source_is_finished("7", SOURCE, [lease(7)])


def test_a_flag_of_an_older_lease_does_not_count_the_reader_must_finish_again() -> None:
    assert not source_is_finished("7", SOURCE, [lease(9)])


def test_a_source_without_a_live_lease_or_a_flag_is_not_finished() -> None:
    assert not source_is_finished("7", SOURCE, [])
    assert not source_is_finished(None, SOURCE, [lease(7)])


class Flags:
    """A reader's flags and the live leases as a watch reads them, counting the flag reads."""

    def __init__(self) -> None:
        self.flags: dict[Unit, str] = {}
        self.leases: list[LeaseInfo] = []
        self.reads = 0

    async def read(self, unit: Unit) -> str | None:
        self.reads += 1
        return self.flags.get(unit)

    async def live(self) -> list[LeaseInfo]:
        return self.leases


async def test_a_flag_read_set_is_not_read_again_while_its_readers_lease_lasts() -> None:
    readers = [SOURCE, Unit.source("events_jsonl", 1)]
    state, watch = Flags(), FinishedFlags()
    state.leases = [lease(3, readers[0]), lease(4, readers[1])]
    state.flags = {readers[0]: "3"}
    assert not await watch.all_finished(readers, state.read, state.live)
    assert state.reads == 2
    assert not await watch.all_finished(readers, state.read, state.live)
    assert state.reads == 3  # only reader 1's flag, still unset
    state.flags[readers[1]] = "4"
    assert await watch.all_finished(readers, state.read, state.live)
    assert await watch.all_finished(readers, state.read, state.live)
    assert state.reads == 4


async def test_no_flag_is_read_while_a_reader_running_here_has_not_finished() -> None:
    readers = [SOURCE, Unit.source("events_jsonl", 1)]
    state, watch = Flags(), FinishedFlags()
    state.leases = [lease(3, readers[0]), lease(4, readers[1])]
    state.flags = {readers[0]: "3", readers[1]: "4"}
    assert not await watch.all_finished(readers, state.read, state.live, reading_here={readers[1]})
    assert state.reads == 0
    assert await watch.all_finished(readers, state.read, state.live, reading_here=set())  # it finished
    assert state.reads == 2


async def test_a_known_flag_of_an_older_lease_is_read_again_and_counts_once_the_new_reader_finished() -> None:
    state, watch = Flags(), FinishedFlags()
    state.leases, state.flags = [lease(3)], {SOURCE: "3"}
    assert await watch.all_finished([SOURCE], state.read, state.live)
    state.leases = [lease(5)]  # the reader runs again under a new lease: it must finish again
    assert not await watch.all_finished([SOURCE], state.read, state.live)
    assert not await watch.all_finished([SOURCE], state.read, state.live)  # the old flag, read again
    state.flags[SOURCE] = "5"
    assert await watch.all_finished([SOURCE], state.read, state.live)
    assert state.reads == 3


def test_nothing_outstanding_once_every_reader_is_at_the_end_and_the_outbox_is_empty(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    done = inventory(log={("events", 0): 5, ("events", 1): 0}, positions={("events", 0): [5]})
    assert outstanding_work(done, plan) == []


def test_unread_log_messages_are_outstanding_also_of_a_partition_that_never_committed(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    behind = inventory(log={("events", 0): 5, ("events", 1): 3}, positions={("events", 0): [4]})
    assert outstanding_work(behind, plan) == [
        "stream events partition 0: 1 messages not yet read", "stream events partition 1: 3 messages not yet read"]


def test_unacknowledged_outbox_and_pending_timers_are_outstanding_but_not_a_blocked_jobs(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    waiting = inventory(outbox={("deliver", 0, "requests"): 2, ("deliver", 1, "requests"): 4},
                        timers={("deliver", 2): 1})
    assert outstanding_work(waiting, plan, blocked={("deliver", 1)}) == [
        "computation deliver partition 0: 2 messages of requests not yet acknowledged",
        "computation deliver partition 2: 1 pending timers"]


def test_work_out_of_the_specs_reach_is_left_to_the_unreachable_check(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, partition_count=2)
    assert outstanding_work(inventory(log={("events", 5): 3, ("other", 0): 2}), plan) == []
