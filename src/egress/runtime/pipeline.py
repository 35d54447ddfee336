"""The runner's lifecycle: open the engine, check the state directory, set up throttling, run the
units on a host, close.

``Pipeline.run()`` first checks that the Spec's layout is the one the state directory's committed
data depends on (``egress.runtime.layout``; a mismatch raises ``SpecMismatchError`` and changes
nothing), then hands a reader per source and a partition job per computation partition to its
host (``egress.runtime.hosts``): embedded (one process, every unit on one event loop,
``egress.runtime.embedded``) or one worker of a cluster (``worker_id`` given: the units are shared
with the other live workers of the same engine, ``egress.runtime.cluster``). It runs until
``request_stop()`` (Ctrl-C), a failure, or, with ``until_drained``, until everything is delivered.
Stopping lets every job commit its current epoch first, so nothing committed is lost. While it
runs the DynamicSpec file is reloaded when it changes; ``/status`` is the status view's
(``egress.runtime.status_view``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from egress.clock import Clock, RealClock, unless_set
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import Engine, SqliteEngine, StateLocation
from egress.errors import SpecMismatchError
from egress.observe import Metrics, StatusTree
from egress.runtime.dynamic_spec import DynamicSpecFile
from egress.runtime.embedded import EmbeddedHost
from egress.runtime.hosts import Host, HostContext, RunResult, WorkerView
from egress.runtime.jobs import JobSet, Runner
from egress.runtime.layout import (
    LAYOUT_KEY,
    holds_no_work,
    layout_mismatch,
    spec_layout,
    unreachable_work,
    unrecorded_mismatch,
)
from egress.runtime.options import RunOptions
from egress.runtime.partition_job import PartitionJob
from egress.runtime.plan import Plan
from egress.runtime.source_reader import DownstreamProgress, SourceReader
from egress.runtime.status_view import RunState, StatusView
from egress.runtime.unit import Unit
from egress.spec import DynamicSpec

if TYPE_CHECKING:
    from egress.observe.server import StatusServer
    from egress.runtime.cluster.host import ClusterHost
    from egress.throttler import Throttling

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
            drained = holds_no_work(await engine.inventory())  # then draining it would change nothing: say so
            raise layout_mismatch(recorded, plan, engine.location, drained) or mismatch
        if recorded == current:
            return
    await engine.write_meta(LAYOUT_KEY, orjson.dumps(current).decode())


class Pipeline:
    """A runnable pipeline from a checked :class:`Plan` and a state directory.

    ``engine_factory`` makes the storage engine each ``run()`` opens (default
    :func:`sqlite_engine`); the runtime uses it only through the ``Engine`` protocol and its
    capabilities (``egress.engines.protocols``). Without ``worker_id`` the run is embedded
    (:class:`~egress.runtime.embedded.EmbeddedHost`: it takes every unit). With it, the run is a
    cluster worker of that name (:class:`~egress.runtime.cluster.host.ClusterHost`, lease TTL and
    heartbeat from ``options``), sharing the units with the engine's other live members; ``run()``
    then raises :class:`~egress.runtime.cluster.worker.ClusterSpecError` when they run another Spec,
    and :class:`~egress.runtime.cluster.duplicates.DuplicateWorkerError` when another live process
    runs under that name.
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
        self.units = JobSet(self._make_runner, self.metrics)
        self._stop = asyncio.Event()
        self._engine: Engine | None = None
        self._engine_factory = engine_factory
        self.throttling: Throttling | None = None
        self.dead_letters = DeadLetterFiles()  # shared by the sinks: one writer per dead-letter file
        self.location: StateLocation | None = None  # where the committed data lives, once run() made its engine
        # Made now: a change of the file while the run starts is still a change.
        self.dynamic_spec = DynamicSpecFile(lambda: self.plan, self._apply_dynamic, self.status, clock=self.clock,
                                            period=self.options.dynamic_spec_period, stop=self._stop)
        context = HostContext(plan, self.units, self.options, self.clock, self._stop, self.request_stop)
        self.host: Host = EmbeddedHost(context) if worker_id is None else self._cluster_host(context, worker_id)
        self.status_view = StatusView(plan=lambda: self.plan, engine=lambda: self._engine, units=self.units,
                                      host=self.host, metrics=self.metrics, clock=self.clock, status=self.status,
                                      dead_letters=self.dead_letters, run_state=self._run_state)
        self.server = self._status_server(http_host, http_port) if http_port is not None else None

    def _cluster_host(self, context: HostContext, worker_id: str) -> ClusterHost:
        """This process as the cluster worker ``worker_id`` (the cluster's modules: imported only for one,
        so that an embedded run does not load them)."""
        from egress.runtime.cluster.host import ClusterHost

        return ClusterHost(context, worker_id, status_url=self._status_url)

    def _status_server(self, http_host: str, http_port: int) -> StatusServer:
        """The ``--http-port`` endpoint (aiohttp and the dashboard: imported only for it)."""
        from egress.observe.server import StatusServer

        view = self.status_view
        return StatusServer(self.metrics, view.document, http_host, http_port, refresh=view.refresh_gauges,
                            dashboard=view.dashboard(), resume_endpoint=view.resume_endpoint)

    def _status_url(self) -> str | None:
        return None if self.server is None else f"http://{self.server.address}/status"

    def _run_state(self) -> RunState:
        return RunState(self.stopping, self.dynamic_spec.file, self.dynamic_spec.version, self.dynamic_spec.error)

    @property
    def dynamic_spec_version(self) -> int:
        """How many reloads of the DynamicSpec file were applied."""
        return self.dynamic_spec.version

    @property
    def dynamic_spec_error(self) -> str | None:
        """Why the last reload of the DynamicSpec file was not applied (``None``: it was)."""
        return self.dynamic_spec.error

    async def status_document(self) -> dict[str, Any]:
        """The JSON of ``/status`` (:meth:`StatusView.document`)."""
        return await self.status_view.document()

    @property
    def worker(self) -> WorkerView | None:
        """The cluster worker while a cluster run runs (``None``: embedded, or not running)."""
        return self.host.worker

    @property
    def jobs(self) -> list[PartitionJob]:
        """The partition jobs running in this process now."""
        return self.units.jobs

    @property
    def readers(self) -> list[SourceReader]:
        """The source readers running in this process now."""
        return self.units.readers

    def interrupt(self) -> None:
        """The first step of a stop a signal asks for, safe in the signal's handler while a process
        function blocks the loop (it sets plain flags only): the epoch each running job has in hand
        calls the function for nothing more and commits what it processed
        (``PartitionJob.stop_request``). :meth:`request_stop`, called on the loop, still stops the run."""
        for job in self.units.jobs:
            job.stop_request.requested = True

    def request_stop(self) -> None:
        """Stop every unit: each job commits what its epoch in hand processed (the function's call in
        hand returns first), then what is acknowledged, and ends; call it on the loop."""
        self._stop.set()
        self.units.stop_all()
        self.host.request_stop()

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
        """Open the engine, check the state directory, set up throttling, run the units on the
        host until the run stops, close; the result says how it ended."""
        started = self.clock.monotonic()
        started_at = self.clock.now()  # a worker's start: of two with different Specs the later leaves
        result = RunResult()
        engine = self._engine_factory(self.state_dir, self.plan.spec.pipeline, self.options)
        self.location = engine.location
        if not await self._open(engine, started_at):
            return result
        self._engine = engine
        try:
            if self.server is not None:
                await self.server.start()
            watcher = asyncio.create_task(self.dynamic_spec.watch())
            try:
                await self.host.run(engine, result)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            result.blocked = self.units.blocked()
        finally:
            await self._close(engine)
        result.elapsed = self.clock.monotonic() - started
        return result

    async def _open(self, engine: Engine, started_at: float) -> bool:
        """Open ``engine``, let the host join, check the state directory and set up throttling;
        ``False`` (the engine closed again) when stopped before the engine answered."""
        try:
            try:
                opened = await unless_set(engine.open(), self._stop)  # a server to connect to may not answer
            except SpecMismatchError as mismatch:  # another pipeline's directory: name the Spec, as layouts do
                raise mismatch.in_file(self.plan.spec_file) from None
            if not opened:  # stopped before anything ran
                await engine.close()
                return False
            await self.host.join(engine, started_at)  # before the layout check, which may record this Spec's additions
            await self._check_state_directory(engine)
            self.throttling = self._throttling(engine)
        except BaseException:
            await engine.close()
            raise
        return True

    def _throttling(self, engine: Engine) -> Throttling | None:
        """The host's elected throttling, else this process's own when the DynamicSpec declares
        throttlers or a ``--throttler-url`` is given (``None`` otherwise)."""
        dynamic = self.plan.dynamic_spec
        if not (dynamic.throttlers or self.options.throttler_url is not None):
            return None  # nor would a host elect one; and no prometheus-client registry is made for it
        elected = self.host.elected_throttling(engine, dynamic, file=self.plan.dynamic_spec_file,
                                               registry=self.metrics.registry)
        if elected is not None:
            return elected
        from egress.throttler import THROTTLER_STATE_NAME, Throttling  # its client and controller: only for throttlers

        return Throttling(dynamic, self.clock, registry=self.metrics.registry, throttler_url=self.options.throttler_url,
                          file=self.plan.dynamic_spec_file, state_file=self.state_dir / THROTTLER_STATE_NAME)

    async def _close(self, engine: Engine) -> None:
        """Stop the status server, what the host took, the throttling, then close ``engine``."""
        try:
            if self.server is not None:
                await self.server.stop()
            await self.host.close()
            if self.throttling is not None:
                await self.throttling.aclose()
        finally:
            self._engine = None
            await engine.close()

    async def _check_state_directory(self, engine: Engine) -> None:
        """:func:`check_state_directory` of this run's plan on its engine."""
        await check_state_directory(engine, self.plan)

    def _make_runner(self, unit: Unit) -> Runner:
        """A fresh source reader or partition job for ``unit``, from the plan in force."""
        spec = self.plan.spec
        if unit.is_source:
            source = self.plan.sources[unit.name]

            def notify(partition: int, lane: str = source.lane(unit.partition)) -> None:
                self.units.wake({(lane, partition)})

            return SourceReader(source, self._require_engine(), self.plan.base_dir, spec.partition_count, self.metrics,
                                self.options, notify, spec.pipeline, record_finished=self.host.shared,
                                downstream=functools.partial(self._downstream_progress, source.lane(unit.partition)),
                                clock=self.clock, partition=unit.partition)
        return PartitionJob(
            self.plan.computations[unit.name], unit.partition, streams=spec.streams,
            partition_count=spec.partition_count, engine=self._require_engine(), clock=self.clock,
            metrics=self.metrics, status=self.status, options=self.options, notify_downstream=self.units.wake,
            throttling=self.throttling, dead_letters=self.dead_letters,
        )

    def _downstream_progress(self, lane: str) -> list[DownstreamProgress]:
        """The partitions of the computations reading the log stream ``lane`` (a source reader's lane,
        ``egress.runtime.lanes``), for its reader's backlog (the http source's ``429``;
        ``egress.runtime.source_reader.downstream_backlog``): those running here with their progress
        in it; in a cluster, the others with ``read_offset`` ``None``."""
        local = self.units.jobs_by_unit()
        progress = []
        for computation in self.plan.computations.values():
            if lane not in computation.input_lanes:
                continue
            for partition in range(self.plan.spec.partition_count):
                job = local.get(Unit.computation(computation.computation_id, partition))
                if job is not None:
                    progress.append(DownstreamProgress(computation.computation_id, partition,
                                                       job.positions().get(lane, 0),
                                                       sum(sink.unacknowledged for sink in job.sinks.values())))
                elif self.host.shared:
                    progress.append(DownstreamProgress(computation.computation_id, partition, None, 0))
        return progress

    def _require_engine(self) -> Engine:
        assert self._engine is not None, "units start only while the pipeline runs"
        return self._engine

    def _apply_dynamic(self, plan: Plan, dynamic: DynamicSpec) -> None:
        """Put a reloaded DynamicSpec in force: the throttling's throttlers (which may refuse it
        with :class:`SpecError`), the plan, every running job's parameters."""
        if self.throttling is not None:
            self.throttling.reconfigure(dynamic, file=plan.dynamic_spec_file)
        self.plan = plan
        for job in self.jobs:
            job.apply_dynamic(plan.computations[job.plan.computation_id])
