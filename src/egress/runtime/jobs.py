"""The jobs one process runs, by unit: start one under its lease, stop one, wake them by input.

A unit (:class:`egress.runtime.unit.Unit`) is a computation's partition, run by a
:class:`PartitionJob`, or a source, run by a :class:`SourceReader`. The embedded host starts every
unit once; a cluster worker starts and stops units as their leases come and go. Both use this set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from egress.observe import Metrics
from egress.observe.logs import unit_context
from egress.runtime.partition_job import PartitionJob
from egress.runtime.source_reader import SourceReader
from egress.runtime.unit import Unit

Runner = PartitionJob | SourceReader
Slot = tuple[str, int]
"""``(log stream, partition)``: a log partition, what a job reads (a stream's lane, ``egress.runtime.lanes``)."""


@dataclass(slots=True)
class StartedUnit:
    """A started unit: its ``runner``, the lease ``generation`` it runs under and its ``task``."""

    runner: Runner
    generation: int
    task: asyncio.Task[None]


class JobSet:
    """The units this process runs. ``make(unit)`` builds a fresh runner for a unit (a job keeps
    its sinks and state for one run of it only); ``on_change`` is called when a unit's task ends.
    ``input_finished``: every source was read to its end (:meth:`tell_input_finished`)."""

    def __init__(self, make: Callable[[Unit], Runner], metrics: Metrics,
                 on_change: Callable[[], None] | None = None) -> None:
        self._make = make
        self._metrics = metrics
        self.on_change = on_change
        self.running: dict[Unit, StartedUnit] = {}
        self._blocked_before: dict[Unit, str] = {}  # the terminal sink error of a unit stopped here
        self.input_finished = False

    @property
    def jobs(self) -> list[PartitionJob]:
        return [r.runner for r in self.running.values() if isinstance(r.runner, PartitionJob)]

    @property
    def readers(self) -> list[SourceReader]:
        return [r.runner for r in self.running.values() if isinstance(r.runner, SourceReader)]

    def start(self, unit: Unit, generation: int) -> StartedUnit:
        """Start ``unit`` under the lease held at ``generation``."""
        runner = self._make(unit)
        if isinstance(runner, PartitionJob):
            runner.input_finished = self.input_finished
        self._blocked_before.pop(unit, None)
        # The unit's log context (egress.observe.logs): every record its task logs names it.
        task = asyncio.create_task(runner.run(generation=generation), name=str(unit),
                                   context=unit_context(unit.consumer, unit.partition))
        running = self.running[unit] = StartedUnit(runner, generation, task)
        self._metrics.partition_owned.labels(unit.consumer, str(unit.partition)).set(1)
        task.add_done_callback(self._ended)
        return running

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.on_change is not None:
            self.on_change()

    def ask_to_stop(self, unit: Unit) -> None:
        """Ask ``unit`` to stop (a job after its function's call in hand: ``PartitionJob.stop``; its
        task ends once that is committed)."""
        self.running[unit].runner.stop()

    def stop_all(self) -> None:
        for running in self.running.values():
            running.runner.stop()

    async def stop(self, unit: Unit, *, acknowledgements_within: float = 0.0) -> BaseException | None:
        """Stop ``unit`` (``PartitionJob.stop``), wait for its task and forget it; returns what its task raised.
        A partition job first waits up to ``acknowledgements_within`` seconds for its sinks' messages
        in flight (:meth:`PartitionJob.stop`)."""
        running = self.running[unit]
        if isinstance(running.runner, PartitionJob):
            running.runner.stop(acknowledgements_within=acknowledgements_within)
        else:
            running.runner.stop()
        error = await _outcome(running.task)
        self.forget(unit)
        return error

    def forget(self, unit: Unit) -> StartedUnit | None:
        """Drop ``unit`` from the set (its task has ended or is left to end)."""
        self._metrics.partition_owned.labels(unit.consumer, str(unit.partition)).set(0)
        running = self.running.pop(unit, None)
        if running is not None and isinstance(running.runner, PartitionJob) and running.runner.blocked_error:
            self._blocked_before[unit] = running.runner.blocked_error
        return running

    def blocked(self) -> list[str]:
        """The terminal sink errors that block units, of the running jobs and of those stopped here
        while blocked (one line each)."""
        now = {unit: job.blocked_error for unit, job in self.jobs_by_unit().items() if job.blocked_error}
        return [error for _, error in sorted({**self._blocked_before, **now}.items())]

    def jobs_by_unit(self) -> dict[Unit, PartitionJob]:
        """The running partition jobs (not the source readers) by unit."""
        return {unit: r.runner for unit, r in self.running.items() if isinstance(r.runner, PartitionJob)}

    def ended(self) -> dict[Unit, BaseException | None]:
        """The units whose task has ended, with what it raised (``None``: it returned)."""
        return {unit: _done_error(r.task) for unit, r in self.running.items() if r.task.done()}

    def tell_input_finished(self) -> None:
        """Every source is exhausted: jobs (those running, and those started from now on) send
        partial batches as soon as they catch up."""
        self.input_finished = True
        for job in self.jobs:
            job.input_finished = True
            job.wake()

    def readers_ended(self) -> bool:
        """Whether the task of every source reader running here has ended."""
        return all(r.task.done() for r in self.running.values() if isinstance(r.runner, SourceReader))

    def readers_reading(self) -> set[Unit]:
        """The source readers running here that have not read their source to the end (yet)."""
        return {unit for unit, r in self.running.items()
                if isinstance(r.runner, SourceReader) and not r.task.done() and not r.runner.finished}

    def reader_tasks(self) -> dict[asyncio.Task[None], SourceReader]:
        """The task of each source reader running here."""
        return {r.task: r.runner for r in self.running.values() if isinstance(r.runner, SourceReader)}

    def wake(self, slots: set[Slot] | None) -> None:
        """Wake the jobs reading any of ``slots`` (``None``: every job)."""
        for job in self.jobs:
            if slots is None or any((lane, job.partition) in slots for lane in job.plan.input_lanes):
                job.wake()


def _done_error(task: asyncio.Task[None]) -> BaseException | None:
    return asyncio.CancelledError() if task.cancelled() else task.exception()


async def _outcome(task: asyncio.Task[None]) -> BaseException | None:
    await asyncio.wait({task})
    return _done_error(task)
