"""The embedded runner: one process, one SQLite state directory, all partitions on one event loop.

``Pipeline.run()`` starts a reader per source and a partition job per computation partition, and
runs until ``request_stop()`` (Ctrl-C), a failure, or, with ``until_drained``, until every source
is exhausted and every job is idle (all acknowledged) or blocked by a terminal sink failure.
Stopping lets every job commit its current epoch first, so nothing committed is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from egress.clock import Clock, RealClock
from egress.engines import SqliteEngine
from egress.observe import Metrics, StatusTree
from egress.runtime.options import RunOptions
from egress.runtime.partition_job import PartitionJob
from egress.runtime.plan import Plan
from egress.runtime.source_reader import SourceReader


@dataclass
class RunResult:
    """How a run ended: ``drained`` (all delivered), ``blocked`` (terminal sink errors, one line
    each), ``error`` (a failure that stopped the run), ``elapsed`` seconds."""

    drained: bool = False
    blocked: list[str] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.blocked


class Pipeline:
    """A runnable pipeline from a checked :class:`Plan` and a state directory."""

    def __init__(
        self,
        plan: Plan,
        state_dir: str | Path,
        *,
        clock: Clock | None = None,
        options: RunOptions | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.plan = plan
        self.state_dir = Path(state_dir)
        self.clock = clock or RealClock()
        self.options = options or RunOptions()
        self.metrics = metrics or Metrics()
        self.status = StatusTree(self._on_status_change)
        self.readers: list[SourceReader] = []
        self.jobs: list[PartitionJob] = []
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        """Stop after every job commits its current epoch (safe to call from a signal handler)."""
        self._stop.set()
        for job in self.jobs:
            job.wake()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _on_status_change(self, path: str, broken: bool) -> None:
        self.metrics.broken.labels(path).set(1 if broken else 0)

    async def run(self) -> RunResult:
        started = self.clock.monotonic()
        result = RunResult()
        spec = self.plan.spec
        engine = SqliteEngine(self.state_dir, spec.pipeline, synchronous=self.options.synchronous)
        await engine.open()
        try:
            by_input: dict[tuple[str, int], list[PartitionJob]] = {}
            for computation in self.plan.computations.values():
                for partition in range(spec.partition_count):
                    job = PartitionJob(
                        computation, partition, streams=spec.streams, partition_count=spec.partition_count,
                        engine=engine, clock=self.clock, metrics=self.metrics, status=self.status,
                        options=self.options, notify_downstream=self._notifier(by_input),
                    )
                    self.jobs.append(job)
                    for stream in computation.input_stream_ids:
                        by_input.setdefault((stream, partition), []).append(job)
            for source in self.plan.sources.values():
                def notify(partition: int, stream: str = source.stream_id) -> None:
                    for job in by_input.get((stream, partition), []):
                        job.wake()

                self.readers.append(SourceReader(source, engine, self.plan.base_dir, spec.partition_count,
                                                 self.metrics, self.options, notify))
            tasks = [asyncio.create_task(r.run(self._stop), name=f"source {r.plan.source_id}") for r in self.readers]
            tasks += [asyncio.create_task(j.run(self._stop), name=f"{j.plan.computation_id}#{j.partition}")
                      for j in self.jobs]
            watcher = asyncio.create_task(self._watch(result))
            try:
                await self._supervise(tasks, result)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            result.blocked = [e for e in (job.blocked_error for job in self.jobs) if e]
        finally:
            await engine.close()
        result.elapsed = self.clock.monotonic() - started
        return result

    def _notifier(self, by_input: dict[tuple[str, int], list[PartitionJob]]) -> Callable[[set[tuple[str, int]]], None]:
        def notify(slots: set[tuple[str, int]]) -> None:
            for slot in slots:
                for job in by_input.get(slot, []):
                    job.wake()

        return notify

    async def _supervise(self, tasks: list[asyncio.Task[None]], result: RunResult) -> None:
        """Wait for all tasks; the first failure stops the others (after their current epoch)."""
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = task.exception()
                if error is not None and result.error is None:
                    result.error = error
                    self.request_stop()

    async def _watch(self, result: RunResult) -> None:
        """With ``until_drained``: stop once sources are exhausted and every job is idle or blocked."""
        if not self.options.until_drained:
            return
        while not self._stop.is_set():
            await self.clock.sleep(self.options.epoch_period)
            if all(r.finished for r in self.readers) and all(j.idle for j in self.jobs):
                result.drained = all(j.blocked_error is None for j in self.jobs)
                self.request_stop()
