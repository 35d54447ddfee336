"""The embedded host: one process takes every unit of the pipeline and runs them on one event loop.

The run takes every unit with ``Ownership.acquire`` and runs until ``request_stop()``, a failure,
or, with ``until_drained``, until every source is exhausted and every job is idle (all
acknowledged) or blocked by a terminal sink failure. A source that fails (a bad record, its server
unreachable) stops the other sources, and the run stops once the jobs delivered what the sources
committed before (as ``until_drained`` does), or at once on ``request_stop()``; the run's error
is the source's. On an engine whose log is the runtime's to trim (``egress.runtime.retention``)
the log is trimmed every ``log_trim_period`` seconds and once more at the end.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egress.engines import Engine, LeaseInfo
from egress.runtime.hosts import HostContext, RunResult, WorkerView, plan_units
from egress.runtime.layout import unreachable_work
from egress.runtime.retention import log_retention, trim_consumed, trim_periodically
from egress.spec import DynamicSpec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from egress.throttler import Throttling

logger = logging.getLogger(__name__)

FAILURE_NOTICE = 2.0
"""Seconds a run may take to deliver what a failed source committed before the log says it waits for it."""


@dataclass
class _SourceFailure:
    """A source reader's failure, ``at`` ``clock.monotonic()``; ``told``: logged while the run delivers."""

    source_id: str
    error: BaseException
    at: float
    told: bool = False


class EmbeddedHost:
    """Every unit in this process (:class:`~egress.runtime.hosts.Host`)."""

    shared = False
    worker: WorkerView | None = None

    def __init__(self, context: HostContext) -> None:
        self._context = context
        self._source_failure: _SourceFailure | None = None

    async def join(self, engine: Engine, started_at: float) -> None:
        return None

    def elected_throttling(self, engine: Engine, dynamic: DynamicSpec, *, file: str | None,
                           registry: CollectorRegistry | None) -> Throttling | None:
        return None

    def request_stop(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def source_finished(self, engine: Engine, source_id: str, leases: list[LeaseInfo]) -> bool:
        return False  # every reader runs here and tells itself

    async def describe(self, engine: Engine | None, leases: list[LeaseInfo]) -> dict[str, Any]:
        return {"worker": None, "members": [], "throttler": None}

    async def run(self, engine: Engine, result: RunResult) -> None:
        """Take every unit (``acquire``: this process owns them all), then watch them and run until all end."""
        context = self._context
        for unit in plan_units(context.plan):
            if context.stop.is_set():
                break
            context.units.start(unit, await engine.acquire(unit.consumer, unit.partition))
        retention = log_retention(engine)
        watchers = [asyncio.create_task(self._watch(engine, result))]
        if retention is not None:  # the log does not grow without bound (egress.runtime.retention)
            watchers.append(asyncio.create_task(trim_periodically(
                retention, engine.location.name, context.plan, context.options, context.clock)))
        try:
            await self._supervise([running.task for running in context.units.running.values()], result)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        if retention is not None and result.error is None:
            await trim_consumed(retention, context.plan, context.options)  # what the last epochs consumed

    async def _supervise(self, tasks: list[asyncio.Task[None]], result: RunResult) -> None:
        """Wait for all tasks; the first failure is the run's error. A job's stops the others (after
        their current epoch); a source reader's stops the other readers, and the jobs once they
        delivered what is committed (:meth:`_watch`)."""
        readers = self._context.units.reader_tasks()
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = task.exception()
                if error is None:
                    continue
                if result.error is None:
                    result.error = error
                reader = readers.get(task)
                if reader is not None and not self._context.stop.is_set():
                    self._deliver_committed_then_stop(reader.plan.source_id, error)
                else:
                    self._context.stop_run()

    def _deliver_committed_then_stop(self, source_id: str, error: BaseException) -> None:
        """Source ``source_id``'s reader failed with ``error``: no source reads on, and
        :meth:`_watch` stops the run once the jobs delivered what the sources committed before."""
        if self._source_failure is None:
            self._source_failure = _SourceFailure(source_id, error, self._context.clock.monotonic())
        for reader in self._context.units.readers:
            reader.stop()

    async def _watch(self, engine: Engine, result: RunResult) -> None:
        """Tell jobs when every source is exhausted (batching sinks then send partial batches as
        soon as their job catches up); with ``until_drained``, stop once sources are exhausted and
        every job is idle or blocked."""
        context = self._context
        told = False
        while not context.stop.is_set():
            await context.clock.sleep(context.options.epoch_period)
            finished = self._input_ended()
            if finished and not told:
                told = True
                context.units.tell_input_finished()
            failure = self._source_failure
            if (context.options.until_drained or failure is not None) and finished \
                    and all(j.idle for j in context.units.jobs):
                # Idle jobs only prove that the work they own is done: also count what no job owns.
                result.unreachable = unreachable_work(await engine.inventory(), context.plan)
                result.drained = (not result.unreachable and all(j.blocked_error is None for j in context.units.jobs)
                                  and failure is None)
                context.stop_run()
            elif failure is not None and not failure.told \
                    and context.clock.monotonic() - failure.at >= FAILURE_NOTICE:
                failure.told = True
                logger.warning("source %r failed (%s); delivering what was committed before it, then stopping "
                               "(Ctrl-C: stop now)", failure.source_id, failure.error)

    def _input_ended(self) -> bool:
        """Whether nothing more comes into the log: every source read to its end or, after a source
        failed, every reader ended."""
        if self._source_failure is not None:
            return self._context.units.readers_ended()
        return all(r.finished for r in self._context.units.readers)
