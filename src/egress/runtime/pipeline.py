"""The embedded runner: one process, one SQLite state directory, all partitions on one event loop.

``Pipeline.run()`` first checks that the Spec's layout is the one the state directory's committed
data depends on (``egress.runtime.layout``; a mismatch raises ``SpecMismatchError`` and changes
nothing), then starts a reader per source and a partition job per computation partition, and
runs until ``request_stop()`` (Ctrl-C), a failure, or, with ``until_drained``, until every source
is exhausted and every job is idle (all acknowledged) or blocked by a terminal sink failure.
Stopping lets every job commit its current epoch first, so nothing committed is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from egress.clock import Clock, RealClock
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import Engine, SqliteEngine
from egress.errors import SpecError, SpecMismatchError
from egress.observe import Metrics, StatusTree
from egress.observe.server import StatusServer
from egress.runtime.layout import LAYOUT_KEY, layout_mismatch, spec_layout, unreachable_work, unrecorded_mismatch
from egress.runtime.options import RunOptions
from egress.runtime.partition_job import PartitionJob
from egress.runtime.plan import Plan, build_plan
from egress.runtime.source_reader import SourceReader
from egress.spec import DynamicSpec, load_document, validate_model
from egress.throttler import THROTTLER_STATE_NAME, Throttling

DYNAMIC_SPEC_STATUS = "/dynamic_spec"

EngineFactory = Callable[[Path, str, RunOptions], Engine]
"""Makes a run's engine, not yet opened, from ``(state directory, pipeline name, run options)``."""


def sqlite_engine(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
    """The default engine: SQLite in ``state_dir`` with ``options.synchronous``. Typed ``Engine``,
    so mypy checks that ``SqliteEngine`` satisfies the protocol; the one place the runtime names it."""
    return SqliteEngine(state_dir, pipeline, synchronous=options.synchronous)


@dataclass
class RunResult:
    """How a run ended: ``drained`` (all delivered), ``blocked`` (terminal sink errors, one line
    each), ``unreachable`` (committed work no job of the Spec handles, one line per place; found
    by the drained check), ``error`` (a failure that stopped the run), ``elapsed`` seconds."""

    drained: bool = False
    blocked: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.blocked and not self.unreachable


class Pipeline:
    """A runnable pipeline from a checked :class:`Plan` and a state directory.

    ``engine_factory`` makes the storage engine each ``run()`` opens (default
    :func:`sqlite_engine`); the runtime uses it only through the ``Engine`` protocol.
    """

    def __init__(
        self,
        plan: Plan,
        state_dir: str | Path,
        *,
        clock: Clock | None = None,
        options: RunOptions | None = None,
        metrics: Metrics | None = None,
        http_port: int | None = None,
        http_host: str = "127.0.0.1",
        engine_factory: EngineFactory = sqlite_engine,
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
        self._engine: Engine | None = None
        self._engine_factory = engine_factory
        self.server = StatusServer(self.metrics, self.status_document, http_host, http_port) if http_port is not None \
            else None
        self.throttling: Throttling | None = None
        self.dead_letters = DeadLetterFiles()  # shared by the sinks: one writer per dead-letter file
        self.dynamic_spec_error: str | None = None
        self.dynamic_spec_version = 0

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
        engine = self._engine_factory(self.state_dir, spec.pipeline, self.options)
        dynamic = self.plan.dynamic_spec
        try:
            try:
                await engine.open()
            except SpecMismatchError as mismatch:  # another pipeline's directory: name the Spec, as layouts do
                raise mismatch.in_file(self.plan.spec_file) from None
            await self._check_state_directory(engine)
            if dynamic.throttlers or self.options.throttler_url is not None:
                self.throttling = Throttling(dynamic, self.clock, registry=self.metrics.registry,
                                             throttler_url=self.options.throttler_url,
                                             file=self.plan.dynamic_spec_file,
                                             state_file=self.state_dir / THROTTLER_STATE_NAME)
        except BaseException:
            await engine.close()
            raise
        self._engine = engine
        if self.server is not None:
            await self.server.start()
        try:
            by_input: dict[tuple[str, int], list[PartitionJob]] = {}
            wake_consumers = self._notifier(by_input)
            for computation in self.plan.computations.values():
                for partition in range(spec.partition_count):
                    job = PartitionJob(
                        computation, partition, streams=spec.streams, partition_count=spec.partition_count,
                        engine=engine, clock=self.clock, metrics=self.metrics, status=self.status,
                        options=self.options, notify_downstream=wake_consumers,
                        throttling=self.throttling, dead_letters=self.dead_letters,
                    )
                    self.jobs.append(job)
                    for stream in computation.input_stream_ids:
                        by_input.setdefault((stream, partition), []).append(job)
            for source in self.plan.sources.values():
                def notify(partition: int, stream: str = source.stream_id) -> None:
                    wake_consumers({(stream, partition)})

                self.readers.append(SourceReader(source, engine, self.plan.base_dir, spec.partition_count,
                                                 self.metrics, self.options, notify, spec.pipeline))
            tasks = [asyncio.create_task(r.run(self._stop), name=f"source {r.plan.source_id}") for r in self.readers]
            tasks += [asyncio.create_task(j.run(self._stop), name=f"{j.plan.computation_id}#{j.partition}")
                      for j in self.jobs]
            watchers = [asyncio.create_task(self._watch(result)), asyncio.create_task(self._watch_dynamic_spec())]
            try:
                await self._supervise(tasks, result)
            finally:
                for watcher in watchers:
                    watcher.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
            result.blocked = [e for e in (job.blocked_error for job in self.jobs) if e]
        finally:
            if self.server is not None:
                await self.server.stop()
            if self.throttling is not None:
                await self.throttling.aclose()
            self._engine = None
            await engine.close()
        result.elapsed = self.clock.monotonic() - started
        return result

    async def _check_state_directory(self, engine: Engine) -> None:
        """Refuse a Spec whose layout differs from the one the directory's committed data depends
        on (``egress.runtime.layout``), before anything runs or is written; record the layout when
        the directory has none yet (new, or written by an earlier egress: then first make sure no
        committed work is out of this Spec's reach) or when this Spec added to it. Raises
        :class:`SpecMismatchError`."""
        current = spec_layout(self.plan)
        text = await engine.read_meta(LAYOUT_KEY)
        if text is None:
            unreachable = unreachable_work(await engine.inventory(), self.plan)
            if unreachable:
                raise unrecorded_mismatch(unreachable, self.plan, self.state_dir)
        else:
            recorded = orjson.loads(text)
            mismatch = layout_mismatch(recorded, self.plan, self.state_dir)
            if mismatch is not None:
                raise mismatch
            if recorded == current:
                return
        await engine.write_meta(LAYOUT_KEY, orjson.dumps(current).decode())

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
        """Tell jobs when every source is exhausted (batching sinks then send partial batches as
        soon as their job catches up); with ``until_drained``, stop once sources are exhausted and
        every job is idle or blocked."""
        told = False
        while not self._stop.is_set():
            await self.clock.sleep(self.options.epoch_period)
            finished = all(r.finished for r in self.readers)
            if finished and not told:
                told = True
                for job in self.jobs:
                    job.input_finished = True
                    job.wake()
            if self.options.until_drained and finished and all(j.idle for j in self.jobs):
                assert self._engine is not None
                # Idle jobs only prove that the work they own is done: also count what no job owns.
                result.unreachable = unreachable_work(await self._engine.inventory(), self.plan)
                result.drained = not result.unreachable and all(j.blocked_error is None for j in self.jobs)
                self.request_stop()

    # -- DynamicSpec, applied live --------------------------------------------------------------

    async def _watch_dynamic_spec(self) -> None:
        """Reload the DynamicSpec file when it changes (checked every ``dynamic_spec_period``)."""
        path = self.plan.dynamic_spec_file
        if path is None:
            return
        last = _modified(path)
        while not self._stop.is_set():
            await self.clock.sleep(self.options.dynamic_spec_period)
            current = _modified(path)
            if current != last:
                last = current
                self.reload_dynamic_spec()

    def reload_dynamic_spec(self) -> bool:
        """Read, check and apply the DynamicSpec file; returns whether it was applied.

        A file that does not load or validate is reported (status path ``/dynamic_spec`` and
        ``dynamic_spec_error``) and ignored: the parameters in force stay.
        """
        file = self.plan.dynamic_spec_file
        assert file is not None
        try:
            dynamic = validate_model(DynamicSpec, load_document(file), file=file)
            plan = build_plan(self.plan.spec, dynamic, base_dir=self.plan.base_dir, spec_file=self.plan.spec_file,
                              dynamic_spec_file=file)
            if self.throttling is not None:
                self.throttling.reconfigure(dynamic, file=file)
        except SpecError as error:
            self.dynamic_spec_error = f"ignored, the previous DynamicSpec stays in force: {error}"
            self.status.set_error(DYNAMIC_SPEC_STATUS, 0, self.dynamic_spec_error)
            return False
        self.dynamic_spec_error = None
        self.status.clear_error(DYNAMIC_SPEC_STATUS, 0)
        self.plan = plan
        for job in self.jobs:
            job.apply_dynamic(plan.computations[job.plan.computation_id])
        self.dynamic_spec_version += 1
        return True

    async def status_document(self) -> dict[str, Any]:
        """The JSON of ``/status``: errors by path, partitions with lag, the dead letters written (how
        many, and the latest without its payload), the DynamicSpec's state."""
        partitions = []
        for job in self.jobs:
            lag = 0
            if self._engine is not None:
                for stream, offset in job.positions().items():
                    lag += await self._engine.end_offset(stream, job.partition) - offset
            partitions.append({
                "computation": job.plan.computation_id,
                "partition": job.partition,
                "input_lag": lag,
                "unacknowledged": {sink_id: sink.unacknowledged for sink_id, sink in job.sinks.items()},
                "blocked": job.blocked_error,
            })
        return {
            "pipeline": self.plan.spec.pipeline,
            "stopping": self.stopping,
            "status": {entry.path: entry.error for entry in self.status.entries()},
            "partitions": partitions,
            "sources": {r.plan.source_id: {"finished": r.finished} for r in self.readers},
            "dead_letters": self.dead_letters.status(),
            "dynamic_spec": {"file": self.plan.dynamic_spec_file, "version": self.dynamic_spec_version,
                             "error": self.dynamic_spec_error},
        }


def _modified(path: str) -> tuple[float, int] | None:
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return (stat.st_mtime, stat.st_size)
