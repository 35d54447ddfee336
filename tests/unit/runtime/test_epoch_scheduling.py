"""When a partition job's next epoch starts (adaptive epochs), on the virtual clock with exact times.

A real :class:`PartitionJob` over the in-memory engine of ``test_holds`` and a real async HTTP sink
whose transport answers each POST after a scripted latency:

* input woken into an idle job is read, committed and POSTed at once, however long ``epoch_period``;
* acknowledgements alone wait up to ``epoch_period`` and share one commit;
* input that arrives while a commit is in flight is taken whole by the epoch right after it;
* an acknowledgement that makes room for input held back for the sinks starts the next epoch at once;
* an async HTTP sink bounds what its job reads (``unacknowledged_limit``), far below ``max_unacknowledged``;
* epochs that only move the read positions (a computation that emits nothing) share one commit per
  ``epoch_period``, and a stop commits them at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from egress.connectors.sinks.async_http import UNACKNOWLEDGED_PER_CONNECTION
from egress.engines import LogMessage
from egress.keys import encode_key
from egress.observe import StatusTree
from egress.runtime import RunOptions
from egress.runtime.partition_job import PartitionJob
from tests.pipelines import Drops
from tests.unit.connectors.sinks.test_async_http_delivery import Outcome
from tests.unit.runtime.test_holds import UNIT, Setup


def job_of(setup: Setup, options: RunOptions) -> PartitionJob:
    return PartitionJob(setup.computation, UNIT.partition, streams=setup.streams, partition_count=1,
                        engine=setup.engine, clock=setup.clock, metrics=setup.metrics,  # type: ignore[arg-type]
                        status=StatusTree(), options=options, notify_downstream=lambda slots: None)


def acknowledged(setup: Setup) -> list[int]:
    """The acknowledged prefix (``seq``) each commit carried, in commit order."""
    return [commit.sink_progress["http"].max_persisted_seq_no for commit in setup.engine.commits]


def outboxes(setup: Setup) -> list[list[str]]:
    """The payloads of each commit's outbox, in commit order (empty outboxes left out)."""
    return [[m.row["payload"] for m in commit.outbox] for commit in setup.engine.commits if commit.outbox]


async def started_idle(tmp_path: Path, options: RunOptions, function_class: type | None = None
                       ) -> tuple[Setup, PartitionJob, asyncio.Task[None], list[LogMessage]]:
    """A job (of ``function_class``, else the setup's) over an empty log, run until idle at t = 5;
    also the log messages to append."""
    setup = Setup(tmp_path)
    if function_class is not None:
        setup.computation = dataclasses.replace(setup.computation, function_class=function_class)
    messages = list(setup.engine.log)
    setup.engine.log.clear()
    job = job_of(setup, options)
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(5.0)
    assert job.idle
    return setup, job, run, messages


async def stopped(setup: Setup, job: PartitionJob, run: asyncio.Task[None]) -> None:
    job.stop()
    await setup.clock.advance(0)
    await run


async def test_a_lone_message_woken_into_an_idle_job_is_committed_and_posted_at_once(tmp_path: Path) -> None:
    setup, job, run, messages = await started_idle(tmp_path, RunOptions(epoch_period=60.0))
    setup.engine.log.append(messages[0])
    job.wake()  # as the source reader's commit does
    await setup.clock.advance(0)
    assert outboxes(setup) == [["p0"]]  # committed at 5.0, not at 65
    assert setup.posts() == [5.0]
    await stopped(setup, job, run)


async def test_acknowledgements_alone_wait_up_to_the_epoch_period_and_share_one_commit(tmp_path: Path) -> None:
    setup, job, run, messages = await started_idle(tmp_path, RunOptions(epoch_period=0.5))
    setup.transport.script = lambda request, n: Outcome(200, latency=(0.7, 0.75, 0.8)[n - 1])
    setup.engine.log.extend(messages[:3])
    job.wake()
    await setup.clock.advance(0)
    assert setup.posts() == [5.0, 5.0, 5.0]
    commits = len(setup.engine.commits)
    # The first acknowledgement (5.7) wakes the job; the commit waits until 6.2 and takes all three.
    await setup.clock.advance(1.19)
    assert len(setup.engine.commits) == commits
    await setup.clock.advance(0.02)
    assert acknowledged(setup)[commits:] == [3]
    await stopped(setup, job, run)


async def test_input_that_arrives_during_a_commit_is_taken_whole_by_the_next_epoch(tmp_path: Path) -> None:
    setup, job, run, messages = await started_idle(tmp_path, RunOptions(epoch_period=60.0))
    setup.engine.commit_gate.close()
    setup.engine.log.append(messages[0])
    job.wake()
    await setup.clock.advance(1.0)  # the epoch of messages[0] waits for its commit
    for message in messages[1:5]:
        setup.engine.log.append(message)
        job.wake()
        await setup.clock.advance(0.1)
    assert outboxes(setup) == []
    setup.engine.commit_gate.open()
    await setup.clock.advance(0)  # at 6.4: that commit, then at once one epoch of the four that came meanwhile
    assert outboxes(setup) == [["p0"], ["p1", "p2", "p3", "p4"]]
    assert setup.posts() == [6.4] * 4  # the sink keeps 4 in flight: the fifth goes when the first is answered
    await stopped(setup, job, run)


async def test_an_acknowledgement_that_makes_room_for_held_back_input_starts_the_next_epoch_at_once(
        tmp_path: Path) -> None:
    setup = Setup(tmp_path)  # 40 messages in the log; each POST answered after 0.7
    job = job_of(setup, RunOptions(epoch_period=60.0, epoch_max_messages=2, max_unacknowledged=2))
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(2.2)
    # Two messages an epoch; the sink holds its 2 unacknowledged: input waits for it, and each
    # acknowledgement that makes room starts the next epoch at once (not 60 s later).
    assert setup.posts() == [0.0, 0.0, 0.7, 0.7, 1.4, 1.4, 2.1, 2.1]
    await stopped(setup, job, run)


async def test_an_async_http_sink_bounds_what_its_job_reads_to_its_unacknowledged_limit(tmp_path: Path) -> None:
    setup = Setup(tmp_path)  # one connection: the sink's limit is UNACKNOWLEDGED_PER_CONNECTION
    limit = UNACKNOWLEDGED_PER_CONNECTION
    setup.engine.log.extend(LogMessage("events", 0, i, f"m{i}".encode(), encode_key([i]), None,
                                       {"id": i, "payload": f"p{i}"}) for i in range(40, 40 + 12 * limit))
    setup.transport.script = lambda request, n: Outcome(200, latency=1.0)
    job = job_of(setup, RunOptions(epoch_period=0.5))  # max_unacknowledged 8192, epoch_max_messages 2048
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(0.5)
    sink = job.sinks["http"]
    assert sink.unacknowledged_limit == limit
    assert [len(outbox) for outbox in outboxes(setup)] == [limit]  # one epoch of the limit, then input waits
    most = sink.unacknowledged
    for _ in range(40):  # 4 in flight, each answered after 1 s: the job reads again as room is made
        await setup.clock.advance(1.0)
        most = max(most, sink.unacknowledged)
    assert all(len(outbox) <= limit for outbox in outboxes(setup))
    assert sum(len(outbox) for outbox in outboxes(setup)) > limit + 100
    assert most < 2 * limit  # never more than the limit plus one epoch's read
    await stopped(setup, job, run)


async def dropping_job_idle(tmp_path: Path, options: RunOptions
                            ) -> tuple[Setup, PartitionJob, asyncio.Task[None], list[LogMessage]]:
    """A job of a computation that emits nothing (``tests.pipelines:Drops``) over an empty log, idle
    at t = 5; also the log messages to append."""
    setup, job, run, messages = await started_idle(tmp_path, options, Drops)
    assert not setup.engine.commits
    return setup, job, run, messages


def positions(setup: Setup) -> list[list[int]]:
    return [list(commit.input_positions.values()) for commit in setup.engine.commits]


async def test_epochs_that_only_move_the_read_positions_share_one_commit_within_the_epoch_period(
        tmp_path: Path) -> None:
    setup, job, run, messages = await dropping_job_idle(tmp_path, RunOptions(epoch_period=0.5))
    for message in messages[:3]:  # each read by an epoch of its own at once, which emits nothing
        setup.engine.log.append(message)
        job.wake()
        await setup.clock.advance(0.1)
    assert positions(setup) == []  # held: due at 5.5, half a second after the first
    assert not job.idle
    await setup.clock.advance(0.19)
    assert positions(setup) == []
    await setup.clock.advance(0.02)
    assert positions(setup) == [[3]]  # one commit of the three epochs' positions, then idle
    assert job.idle
    await stopped(setup, job, run)


async def test_held_back_read_positions_are_committed_at_once_by_a_stop(tmp_path: Path) -> None:
    setup, job, run, messages = await dropping_job_idle(tmp_path, RunOptions(epoch_period=60.0))
    setup.engine.log.append(messages[0])
    job.wake()
    await setup.clock.advance(1.0)
    assert positions(setup) == []
    await stopped(setup, job, run)
    assert positions(setup) == [[1]]
