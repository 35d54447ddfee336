"""The runner: embedded (one process, one SQLite state directory, every unit on one event loop) or
one worker of a cluster (``worker_id`` given: the units are shared with the other live workers of
the same engine, ``egress.runtime.worker``).

``Pipeline.run()`` first checks that the Spec's layout is the one the state directory's committed
data depends on (``egress.runtime.layout``; a mismatch raises ``SpecMismatchError`` and changes
nothing), then starts a reader per source and a partition job per computation partition, and
runs until ``request_stop()`` (Ctrl-C), a failure, or, with ``until_drained``, until every source
is exhausted and every job is idle (all acknowledged) or blocked by a terminal sink failure.
Stopping lets every job commit its current epoch first, so nothing committed is lost. A source
that fails (a bad record, its server unreachable) stops the other sources, and the run stops once
the jobs delivered what the sources committed before (as ``until_drained`` does), or at once on
``request_stop()``; the run's error is the source's.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from egress.clock import Clock, RealClock, unless_set
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import Engine, SqliteEngine, StateLocation
from egress.errors import SpecError, SpecMismatchError
from egress.observe import Metrics, StatusTree
from egress.observe.status import egress_version, readiness
from egress.runtime.assignment import Unit
from egress.runtime.drained import outstanding_work, source_is_finished
from egress.runtime.jobs import JobSet, Runner, is_source
from egress.runtime.layout import LAYOUT_KEY, layout_mismatch, spec_layout, unreachable_work, unrecorded_mismatch
from egress.runtime.options import RunOptions
from egress.runtime.partition_job import PartitionJob
from egress.runtime.plan import Plan, build_plan
from egress.runtime.retention import trim_consumed, trim_periodically, trimming_unit
from egress.runtime.source_reader import DownstreamProgress, SourceReader, finished_key
from egress.runtime.worker import ClusterSpecError, Worker, WorkerSettings, refuse_another_spec
from egress.spec import DynamicSpec, Spec, load_document, validate_model
from egress.throttler import THROTTLER_STATE_NAME, Throttling

if TYPE_CHECKING:
    from egress.engines.nats import NatsEngine
    from egress.observe.server import StatusServer
    from egress.runtime.throttler_role import ControllerElection

DYNAMIC_SPEC_STATUS = "/dynamic_spec"

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Path, str, RunOptions], Engine]
"""Makes a run's engine, not yet opened, from ``(state directory, pipeline name, run options)``."""


def sqlite_engine(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
    """The default engine: SQLite in ``state_dir`` with ``options.synchronous``. Typed ``Engine``,
    so mypy checks that ``SqliteEngine`` satisfies the protocol; the one place the runtime names it."""
    return SqliteEngine(state_dir, pipeline, synchronous=options.synchronous)


def shared_sqlite_engine(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
    """SQLite in ``state_dir`` shared with other processes (``egress run --processes N``: the
    parent holds the directory's lock, each worker process opens this)."""
    return SqliteEngine(state_dir, pipeline, synchronous=options.synchronous, shared=True)


def nats_engine_factory(servers: list[str], worker_id: str | None = None) -> EngineFactory:
    """An engine factory for NATS JetStream at ``servers`` (``nats://host:port`` each); the lease
    owner is ``worker_id``. Imports nats-py only when called."""
    def make(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
        from egress.engines.nats import NatsEngine

        return NatsEngine(servers, pipeline, owner=worker_id, lease_ttl=options.lease_ttl, replicas=options.replicas)

    return make


def spec_digest(spec: Spec) -> str:
    """The hex BLAKE2b digest of the Spec as loaded (the same in YSON, YAML or JSON, whatever the
    key order): the workers of one cluster compare it."""
    text = orjson.dumps(spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(text, digest_size=16).hexdigest()


async def check_state_directory(engine: Engine, plan: Plan) -> None:
    """Refuse a Spec whose layout differs from the one the engine's committed data depends on
    (``egress.runtime.layout``), before anything runs or is written; record the layout when the
    engine has none yet (new, or written by an earlier egress: then first make sure no committed
    work is out of this Spec's reach) or when this Spec added to it. Raises
    :class:`SpecMismatchError` naming the engine's ``location``."""
    current = spec_layout(plan)
    text = await engine.read_meta(LAYOUT_KEY)
    if text is None:
        unreachable = unreachable_work(await engine.inventory(), plan)
        if unreachable:
            raise unrecorded_mismatch(unreachable, plan, engine.location)
    else:
        recorded = orjson.loads(text)
        mismatch = layout_mismatch(recorded, plan, engine.location)
        if mismatch is not None:
            raise mismatch
        if recorded == current:
            return
    await engine.write_meta(LAYOUT_KEY, orjson.dumps(current).decode())


FAILURE_NOTICE = 2.0
"""Seconds a run may take to deliver what a failed source committed before the log says it waits for it."""


@dataclass
class _SourceFailure:
    """A source reader's failure, ``at`` ``clock.monotonic()``; ``told``: logged while the run delivers."""

    source_id: str
    error: BaseException
    at: float
    told: bool = False


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
    :func:`sqlite_engine`); the runtime uses it only through the ``Engine`` protocol. Without
    ``worker_id`` the run is embedded: it takes every unit with ``Ownership.acquire``. With it, the
    run is a cluster worker of that name (``egress.runtime.worker.Worker``, lease TTL and heartbeat
    from ``options``), sharing the units with the engine's other live members; ``run()`` then
    raises :class:`~egress.runtime.worker.ClusterSpecError` when they run another Spec.
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
        worker_id: str | None = None,
    ) -> None:
        self.plan = plan
        self.state_dir = Path(state_dir)
        self.clock = clock or RealClock()
        self.options = options or RunOptions()
        self.metrics = metrics or Metrics()
        self.status = StatusTree(self._on_status_change)
        self.worker_id = worker_id
        self.worker: Worker | None = None  # while a cluster run runs
        self.units = JobSet(self._make_runner, self.metrics)
        self._input_finished = False
        self._source_failure: _SourceFailure | None = None  # embedded: the run delivers what is committed and stops
        self._started_at = 0.0
        self._stop = asyncio.Event()
        self._engine: Engine | None = None
        self._engine_factory = engine_factory
        self.server = self._status_server(http_host, http_port) if http_port is not None else None
        self.throttling: Throttling | None = None
        self.throttler_election: ControllerElection | None = None  # a cluster worker on NATS with throttlers
        self.dead_letters = DeadLetterFiles()  # shared by the sinks: one writer per dead-letter file
        self.dynamic_spec_error: str | None = None
        self.dynamic_spec_version = 0
        self.location: StateLocation | None = None  # where the committed data lives, once run() made its engine
        # The DynamicSpec file as the plan read it (about now): a change while the run starts is still a change.
        self._dynamic_spec_read = _modified(plan.dynamic_spec_file) if plan.dynamic_spec_file else None

    def _status_server(self, http_host: str, http_port: int) -> StatusServer:
        """The ``--http-port`` endpoint (aiohttp and the dashboard: imported only for it)."""
        from egress.observe.server import StatusServer
        from egress.runtime.dashboard_feed import pipeline_dashboard

        return StatusServer(self.metrics, self.status_document, http_host, http_port,
                            refresh=self._refresh_gauges, dashboard=pipeline_dashboard(self))

    @property
    def jobs(self) -> list[PartitionJob]:
        """The partition jobs running in this process now."""
        return self.units.jobs

    @property
    def readers(self) -> list[SourceReader]:
        """The source readers running in this process now."""
        return self.units.readers

    def all_units(self) -> list[Unit]:
        """Every unit of the Spec: each source reader, then each computation's partitions."""
        units: list[Unit] = [(f"source:{source_id}", 0) for source_id in self.plan.sources]
        units += [(cid, p) for cid in self.plan.computations for p in range(self.plan.spec.partition_count)]
        return units

    def request_stop(self) -> None:
        """Stop after every job commits its current epoch (safe to call from a signal handler)."""
        self._stop.set()
        self.units.stop_all()
        if self.worker is not None:
            self.worker.request_stop()

    @property
    def engine(self) -> Engine | None:
        """The engine while the run has it open (``None`` before and after)."""
        return self._engine

    @property
    def running(self) -> bool:
        """Whether the run has opened its engine and not yet closed it."""
        return self._engine is not None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _on_status_change(self, path: str, broken: bool) -> None:
        self.metrics.broken.labels(path).set(1 if broken else 0)

    async def run(self) -> RunResult:
        started = self.clock.monotonic()
        self._started_at = self.clock.now()  # a worker's start: of two with different Specs the later leaves
        result = RunResult()
        spec = self.plan.spec
        engine = self._engine_factory(self.state_dir, spec.pipeline, self.options)
        self.location = engine.location
        dynamic = self.plan.dynamic_spec
        try:
            try:
                opened = await unless_set(engine.open(), self._stop)  # a server to connect to may not answer
            except SpecMismatchError as mismatch:  # another pipeline's directory: name the Spec, as layouts do
                raise mismatch.in_file(self.plan.spec_file) from None
            if not opened:  # stopped before anything ran
                await engine.close()
                return result
            if self.worker_id is not None:  # before the layout check, which may record this Spec's additions
                await refuse_another_spec(engine, spec_digest(spec), self.worker_id, self.plan.spec_file,
                                          self._started_at)
            await self._check_state_directory(engine)
            nats = self._electing_on(engine, dynamic)
            if nats is not None:
                from egress.runtime.throttler_role import cluster_throttling

                self.throttling, self.throttler_election = cluster_throttling(
                    nats, dynamic, self.clock, file=self.plan.dynamic_spec_file, worker_id=self.worker_id or "",
                    options=self.options, registry=self.metrics.registry)
            elif dynamic.throttlers or self.options.throttler_url is not None:
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
            watchers = [asyncio.create_task(self._watch_dynamic_spec())]
            try:
                if self.worker_id is None:
                    await self._run_embedded(engine, result, watchers)
                else:
                    watchers.append(asyncio.create_task(self._watch_cluster(engine, result)))
                    if self.throttler_election is not None:
                        watchers.append(asyncio.create_task(self.throttler_election.run()))
                    await self._run_worker(engine, self.worker_id, result)
            finally:
                for watcher in watchers:
                    watcher.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
            result.blocked = self.units.blocked()
        finally:
            if self.server is not None:
                await self.server.stop()
            if self.throttler_election is not None:
                await self.throttler_election.stop()
            if self.throttling is not None:
                await self.throttling.aclose()
            self._engine = None
            await engine.close()
        result.elapsed = self.clock.monotonic() - started
        return result

    def _electing_on(self, engine: Engine, dynamic: DynamicSpec) -> NatsEngine | None:
        """The NATS engine of a cluster worker whose DynamicSpec declares throttlers and that is
        given no ``--throttler-url``: its workers elect the controller (``egress.runtime.throttler_role``)."""
        if self.worker_id is None or not dynamic.throttlers or self.options.throttler_url is not None:
            return None
        from egress.engines import NatsEngine

        return engine if isinstance(engine, NatsEngine) else None

    async def _check_state_directory(self, engine: Engine) -> None:
        """:func:`check_state_directory` of this run's plan on its engine."""
        await check_state_directory(engine, self.plan)

    def _make_runner(self, unit: Unit) -> Runner:
        """A fresh source reader or partition job for ``unit``, from the plan in force."""
        consumer, partition = unit
        spec = self.plan.spec
        if is_source(unit):
            source = self.plan.sources[consumer.removeprefix("source:")]

            def notify(partition: int, stream: str = source.stream_id) -> None:
                self.units.wake({(stream, partition)})

            return SourceReader(source, self._require_engine(), self.plan.base_dir, spec.partition_count, self.metrics,
                                self.options, notify, spec.pipeline, record_finished=self.worker_id is not None,
                                downstream=functools.partial(self._downstream_progress, source.stream_id),
                                clock=self.clock)
        job = PartitionJob(
            self.plan.computations[consumer], partition, streams=spec.streams, partition_count=spec.partition_count,
            engine=self._require_engine(), clock=self.clock, metrics=self.metrics, status=self.status,
            options=self.options, notify_downstream=self.units.wake, throttling=self.throttling,
            dead_letters=self.dead_letters,
        )
        job.input_finished = self._input_finished
        return job

    def _downstream_progress(self, stream_id: str) -> list[DownstreamProgress]:
        """The partitions of the computations reading ``stream_id``, for its source's backlog (the
        http source's ``429``; ``egress.runtime.source_reader.downstream_backlog``): those running
        here with their progress; in a cluster, the others with ``read_offset`` ``None``."""
        local = {(job.plan.computation_id, job.partition): job for job in self.jobs}
        progress = []
        for computation in self.plan.computations.values():
            if stream_id not in computation.input_stream_ids:
                continue
            for partition in range(self.plan.spec.partition_count):
                job = local.get((computation.computation_id, partition))
                if job is not None:
                    progress.append(DownstreamProgress(computation.computation_id, partition,
                                                       job.positions().get(stream_id, 0),
                                                       sum(sink.unacknowledged for sink in job.sinks.values())))
                elif self.worker_id is not None:
                    progress.append(DownstreamProgress(computation.computation_id, partition, None, 0))
        return progress

    def _require_engine(self) -> Engine:
        assert self._engine is not None, "units start only while the pipeline runs"
        return self._engine

    async def _run_embedded(self, engine: Engine, result: RunResult, watchers: list[asyncio.Task[None]]) -> None:
        """Take every unit (``acquire``: this process owns them all), then watch them (``_watch``,
        added to ``watchers``) and run until all end."""
        for unit in self.all_units():
            if self._stop.is_set():
                break
            self.units.start(unit, await engine.acquire(*unit))
        watchers.append(asyncio.create_task(self._watch(result)))
        if isinstance(engine, SqliteEngine):  # the log does not grow without bound (egress.runtime.retention)
            watchers.append(asyncio.create_task(trim_periodically(engine, self.plan, self.options, self.clock)))
        await self._supervise([running.task for running in self.units.running.values()], result)
        if isinstance(engine, SqliteEngine) and result.error is None:
            await trim_consumed(engine, self.plan, self.options)  # what the last epochs consumed

    async def _run_worker(self, engine: Engine, worker_id: str, result: RunResult) -> None:
        """Run this worker's share of the units until stopped; jobs of another worker's upstream
        wake on the engine's append notifications, and every ``remote_poll_period`` regardless."""
        details: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": self._started_at}
        if self.server is not None:
            details["status_url"] = f"http://{self.server.address}/status"
        settings = WorkerSettings(worker_id, spec_digest(self.plan.spec), lease_ttl=self.options.lease_ttl,
                                  heartbeat_period=self.options.heartbeat_period, spec_file=self.plan.spec_file,
                                  details=details)
        self.worker = worker = Worker(engine, self.units, self.all_units(), settings, self.clock)
        self.units.on_change = worker.notice
        engine.on_appends(self.units.wake)
        background = [asyncio.create_task(self._poll_remote_inputs())]
        if isinstance(engine, SqliteEngine):  # --processes N: one worker trims the shared log (runtime.retention)
            trimmer = trimming_unit(self.plan)
            background.append(asyncio.create_task(trim_periodically(
                engine, self.plan, self.options, self.clock, holds=lambda: trimmer in self.units.running)))
        if self._stop.is_set():
            worker.request_stop()
        try:
            await worker.run()
        except ClusterSpecError:
            raise
        except Exception as error:  # a failure of the pipeline (a job's, or the engine's)
            result.error = error
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        if isinstance(engine, SqliteEngine) and result.error is None:
            await trim_consumed(engine, self.plan, self.options)  # each worker once: what the last epochs consumed

    async def _poll_remote_inputs(self) -> None:
        """The backstop of the append notifications (at-most-once): wake every job now and then."""
        while True:
            await self.clock.sleep(self.options.remote_poll_period)
            self.units.wake(None)

    async def _supervise(self, tasks: list[asyncio.Task[None]], result: RunResult) -> None:
        """Wait for all tasks; the first failure is the run's error. A job's stops the others (after
        their current epoch); a source reader's stops the other readers, and the jobs once they
        delivered what is committed (:meth:`_watch`)."""
        readers = {running.task: running.runner for running in self.units.running.values()
                   if isinstance(running.runner, SourceReader)}
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
                if reader is not None and not self._stop.is_set():
                    self._deliver_committed_then_stop(reader.plan.source_id, error)
                else:
                    self.request_stop()

    def _deliver_committed_then_stop(self, source_id: str, error: BaseException) -> None:
        """Source ``source_id``'s reader failed with ``error``: no source reads on, and
        :meth:`_watch` stops the run once the jobs delivered what the sources committed before."""
        if self._source_failure is None:
            self._source_failure = _SourceFailure(source_id, error, self.clock.monotonic())
        for reader in self.readers:
            reader.stop()

    async def _watch(self, result: RunResult) -> None:
        """Tell jobs when every source is exhausted (batching sinks then send partial batches as
        soon as their job catches up); with ``until_drained``, stop once sources are exhausted and
        every job is idle or blocked."""
        told = False
        while not self._stop.is_set():
            await self.clock.sleep(self.options.epoch_period)
            finished = self._input_ended()
            if finished and not told:
                told = True
                self._tell_input_finished()
            failure = self._source_failure
            if (self.options.until_drained or failure is not None) and finished and all(j.idle for j in self.jobs):
                assert self._engine is not None
                # Idle jobs only prove that the work they own is done: also count what no job owns.
                result.unreachable = unreachable_work(await self._engine.inventory(), self.plan)
                result.drained = (not result.unreachable and all(j.blocked_error is None for j in self.jobs)
                                  and failure is None)
                self.request_stop()
            elif failure is not None and not failure.told and self.clock.monotonic() - failure.at >= FAILURE_NOTICE:
                failure.told = True
                logger.warning("source %r failed (%s); delivering what was committed before it, then stopping "
                               "(Ctrl-C: stop now)", failure.source_id, failure.error)

    def _input_ended(self) -> bool:
        """Whether nothing more comes into the log: every source read to its end or, after a source
        failed, every reader ended."""
        if self._source_failure is not None:
            return all(running.task.done() for running in self.units.running.values()
                       if isinstance(running.runner, SourceReader))
        return all(r.finished for r in self.readers)

    def _tell_input_finished(self) -> None:
        """Every source is exhausted: jobs send partial batches as soon as they catch up."""
        self._input_finished = True
        for job in self.jobs:
            job.input_finished = True
            job.wake()

    async def _watch_cluster(self, engine: Engine, result: RunResult) -> None:
        """The cluster's :meth:`_watch`, from the engine: every source finished (``source_finished``
        metadata of its live lease), then, with ``until_drained``, stop once this worker's jobs are
        idle or blocked and the inventory shows no work outstanding anywhere (``egress.runtime.drained``)."""
        while not self._stop.is_set():
            await self.clock.sleep(self.options.drained_check_period)
            if not await self._sources_finished(engine):
                continue
            if not self._input_finished:
                self._tell_input_finished()
            idle = all(j.idle for j in self.jobs)
            if self.options.until_drained and idle and await self._cluster_drained(engine, result):
                result.drained = all(j.blocked_error is None for j in self.jobs)
                self.request_stop()

    async def _sources_finished(self, engine: Engine) -> bool:
        leases = await engine.leases()
        for source_id in self.plan.sources:
            flag = await engine.read_meta(finished_key(source_id))
            if not source_is_finished(flag, (f"source:{source_id}", 0), leases):
                return False
        return True

    async def _cluster_drained(self, engine: Engine, result: RunResult) -> bool:
        inventory = await engine.inventory()
        blocked = {(j.plan.computation_id, j.partition) for j in self.jobs if j.blocked_error is not None}
        result.unreachable = unreachable_work(inventory, self.plan)
        return not outstanding_work(inventory, self.plan, blocked) and not result.unreachable

    # -- DynamicSpec, applied live --------------------------------------------------------------

    async def _watch_dynamic_spec(self) -> None:
        """Reload the DynamicSpec file when it changes (checked every ``dynamic_spec_period``)."""
        path = self.plan.dynamic_spec_file
        if path is None:
            return
        last = self._dynamic_spec_read
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
        """The JSON of ``/status``: errors by path, partitions with their owner (``leases()``) and input
        lag, the dead letters written (how many, and the latest without its payload), the
        DynamicSpec's state, and in a cluster this ``worker`` and the live ``members``."""
        engine = self._engine
        leases = await engine.leases() if engine is not None else []
        owners = {(lease.consumer, lease.partition): lease.owner for lease in leases}
        document = {
            "pipeline": self.plan.spec.pipeline,
            "version": egress_version(),
            "running": engine is not None,
            "stopping": self.stopping,
            "worker": self.worker_id,
            "members": [] if engine is None or self.worker_id is None else
            [{"worker_id": m.worker_id, **m.details} for m in await engine.members()],
            "throttler": None if self.throttler_election is None else self.throttler_election.status(leases),
            "status": {entry.path: entry.error for entry in self.status.entries()},
            "partitions": await self._partitions_status(owners),
            "sources": await self._sources_status(owners),
            "dead_letters": self.dead_letters.status(),
            "dynamic_spec": {"file": self.plan.dynamic_spec_file, "version": self.dynamic_spec_version,
                             "error": self.dynamic_spec_error},
        }
        document["ready"] = readiness(document)
        return document

    async def _sources_status(self, owners: dict[Unit, str]) -> dict[str, dict[str, Any]]:
        """Each source: read to the end (in a cluster, by whichever worker: its ``source_finished``
        flag of the live lease) and its reader's owner."""
        engine = self._engine
        leases = await engine.leases() if engine is not None and self.worker_id is not None else []
        sources: dict[str, dict[str, Any]] = {}
        for source_id in self.plan.sources:
            finished = any(r.finished for r in self.readers if r.plan.source_id == source_id)
            if engine is not None and self.worker_id is not None and not finished:
                flag = await engine.read_meta(finished_key(source_id))
                finished = source_is_finished(flag, (f"source:{source_id}", 0), leases)
            sources[source_id] = {"finished": finished, "owner": owners.get((f"source:{source_id}", 0)),
                                  "unread_records": 0 if finished else self._unread_records(source_id)}
        return sources

    def _unread_records(self, source_id: str) -> int | None:
        """The records source ``source_id`` has not read yet, where its reader runs here (else ``None``)."""
        for reader in self.readers:
            if reader.plan.source_id == source_id:
                return reader.unread_records()
        return None

    async def _partitions_status(self, owners: dict[Unit, str]) -> list[dict[str, Any]]:
        """Every computation partition: its owner and input lag; where it runs here, its sinks' state
        (``unacknowledged`` messages, ``in_flight`` deliveries started and not ended, ``held``: why
        its sinks start no new delivery now, ``egress.runtime.holds``; ``blocked``)."""
        local = {(job.plan.computation_id, job.partition): job for job in self.jobs}
        remote = await self._committed_positions() if self.worker_id is not None else {}
        partitions = []
        for unit in self.all_units():
            if is_source(unit):
                continue
            job = local.get(unit)
            positions = job.positions() if job is not None else remote.get(unit)
            lag = await self._input_lag(unit, positions)
            entry: dict[str, Any] = {"computation": unit[0], "partition": unit[1], "owner": owners.get(unit),
                                     "input_lag": lag, "input_lag_seconds": None}
            if job is not None:
                entry.update(unacknowledged={sink_id: sink.unacknowledged for sink_id, sink in job.sinks.items()},
                             in_flight={sink_id: sink.in_flight for sink_id, sink in job.sinks.items()},
                             held=sorted(job.holds.causes), blocked=job.blocked_error,
                             input_lag_seconds=self._input_lag_seconds(job, lag))
            partitions.append(entry)
        return partitions

    async def _committed_positions(self) -> dict[Unit, dict[str, int]]:
        """The committed input positions of partitions another worker runs, from the inventory: known
        for a stream only one computation reads (the inventory does not say whose a position is)."""
        engine = self._require_engine()
        readers: dict[str, list[str]] = {}
        for computation in self.plan.computations.values():
            for stream in computation.input_stream_ids:
                readers.setdefault(stream, []).append(computation.computation_id)
        committed = (await engine.inventory()).read_positions
        positions: dict[Unit, dict[str, int]] = {}
        for computation in self.plan.computations.values():
            streams = computation.input_stream_ids
            if any(len(readers[stream]) > 1 for stream in streams):
                continue
            for partition in range(self.plan.spec.partition_count):
                positions[(computation.computation_id, partition)] = {
                    stream: max(committed.get((stream, partition), [0])) for stream in streams}
        return positions

    async def _input_lag(self, unit: Unit, positions: dict[str, int] | None) -> int | None:
        """Messages of ``unit``'s inputs after ``positions`` (``None``: unknown here, or no engine open)."""
        engine = self._engine
        if engine is None or positions is None:
            return None
        computation, partition = unit
        lag = 0
        for stream in self.plan.computations[computation].input_stream_ids:
            lag += await engine.end_offset(stream, partition) - positions.get(stream, 0)
        return lag

    def _input_lag_seconds(self, job: PartitionJob, lag: int | None) -> float | None:
        """Seconds since ``job`` last read all its input, while it has ``lag`` messages unread (0 without)."""
        if lag is None:
            return None
        return max(0.0, self.clock.monotonic() - job.caught_up_at) if lag else 0.0

    async def _refresh_gauges(self) -> None:
        """Before a scrape of ``/metrics``: the unread records of each source read here, the input lag
        (messages, seconds) and the unacknowledged messages of each partition this process runs."""
        metrics = self.metrics
        for reader in self.readers:
            unread = reader.unread_records()
            if unread is not None:
                metrics.source_unread_records.labels(reader.plan.source_id).set(unread)
        for job in self.jobs:
            labels = (job.plan.computation_id, str(job.partition))
            lag = await self._input_lag((job.plan.computation_id, job.partition), job.positions())
            if lag is not None:
                metrics.partition_input_lag.labels(*labels).set(lag)
                metrics.partition_input_lag_seconds.labels(*labels).set(self._input_lag_seconds(job, lag) or 0.0)
            for sink_id, sink in job.sinks.items():
                metrics.partition_unacknowledged.labels(*labels, sink_id).set(sink.unacknowledged)


def _modified(path: str) -> tuple[float, int] | None:
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return (stat.st_mtime, stat.st_size)
