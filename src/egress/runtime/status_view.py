"""What a running pipeline shows: ``/status``, the gauges refreshed before a scrape of ``/metrics``,
and the dashboard's feed (:mod:`egress.observe.dashboard`: the Spec's graph, the end offsets of the
streams computations read, the throttlers' limits).

Built from narrow inputs, not from the ``Pipeline``: the plan in force, the engine while it is open
(read only), this process's units, the host (where the other units run), the metrics, the clock,
the status tree, the dead-letter files and the run's own state (:class:`RunState`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egress.clock import Clock
from egress.connectors.base import FansOut
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import Engine, LeaseInfo
from egress.errors import SpecError
from egress.observe import Metrics, StatusTree
from egress.observe.status import egress_version, readiness
from egress.runtime.hosts import Host, plan_units
from egress.runtime.jobs import JobSet
from egress.runtime.partition_job import PartitionJob
from egress.runtime.plan import Plan
from egress.runtime.unit import Unit
from egress.spec.models import Spec
from egress.throttler.models import validate_dynamic_throttlers

if TYPE_CHECKING:
    from egress.observe.dashboard import Dashboard


@dataclass(frozen=True, slots=True)
class RunState:
    """The run's own state as ``/status`` shows it: ``stopping`` (a stop was asked for), the
    DynamicSpec ``file`` in force, its ``version`` (reloads applied) and its ``error`` (the last
    reload's, ``None`` once one applied)."""

    stopping: bool
    dynamic_spec_file: str | None
    dynamic_spec_version: int
    dynamic_spec_error: str | None


def spec_graph(spec: Spec) -> dict[str, Any]:
    """Sources → computations → sinks of ``spec`` (see :func:`~egress.observe.dashboard.graph_document`)."""
    from egress.observe.dashboard import graph_document  # with the dashboard only: it imports aiohttp

    return graph_document(
        sources={source_id: source.source_class_name for source_id, source in spec.sources.items()},
        computations={cid: (c.input_stream_ids, c.output_stream_ids) for cid, c in spec.computations.items()},
        source_streams={source_id: source.output_stream_id for source_id, source in spec.sources.items()},
        sinks={cid: {sink_id: sink.sink_class_name for sink_id, sink in c.sinks.items()}
               for cid, c in spec.computations.items()},
    )


def throttler_limits(plan: Plan) -> dict[str, float | None]:
    """Units per second each throttler of ``plan``'s DynamicSpec allows (``ThrottlerSpec.rate``;
    ``None``: unlimited)."""
    try:
        specs = validate_dynamic_throttlers(plan.dynamic_spec)
    except SpecError:
        return {}
    return {throttler_id: spec.rate for throttler_id, spec in specs.items()}


class StatusView:
    """``/status``, the scrape-time gauges and the dashboard of one run (see the module).

    ``plan`` and ``engine`` are read at each call: the plan in force (a DynamicSpec reload replaces
    it), the engine while the run has it open (``None`` before and after)."""

    def __init__(self, *, plan: Callable[[], Plan], engine: Callable[[], Engine | None], units: JobSet, host: Host,
                 metrics: Metrics, clock: Clock, status: StatusTree, dead_letters: DeadLetterFiles,
                 run_state: Callable[[], RunState]) -> None:
        self._plan = plan
        self._engine = engine
        self._units = units
        self._host = host
        self._metrics = metrics
        self._clock = clock
        self._status = status
        self._dead_letters = dead_letters
        self._run_state = run_state

    async def document(self) -> dict[str, Any]:
        """The JSON of ``/status``: errors by path, partitions with their owner (``leases()``) and input
        lag, the dead letters written (how many, and the latest without its payload), the
        DynamicSpec's state, and in a cluster this ``worker`` and the live ``members``."""
        engine, plan, state = self._engine(), self._plan(), self._run_state()
        leases = await engine.leases() if engine is not None else []
        owners = {(lease.consumer, lease.partition): lease.owner for lease in leases}
        described = await self._host.describe(engine, leases)
        document = {
            "pipeline": plan.spec.pipeline,
            "version": egress_version(),
            "running": engine is not None,
            "stopping": state.stopping,
            "worker": described["worker"],
            "members": described["members"],
            "throttler": described["throttler"],
            "status": {entry.path: entry.error for entry in self._status.entries()},
            "partitions": await self._partitions(engine, plan, owners),
            "sources": await self._sources(engine, plan, owners, leases),
            "dead_letters": self._dead_letters.status(),
            "dynamic_spec": {"file": state.dynamic_spec_file, "version": state.dynamic_spec_version,
                             "error": state.dynamic_spec_error},
        }
        document["ready"] = readiness(document)
        return document

    async def _sources(self, engine: Engine | None, plan: Plan, owners: dict[tuple[str, int], str],
                       leases: list[LeaseInfo]) -> dict[str, dict[str, Any]]:
        """Each source: read to the end by every reader (in a cluster, by whichever worker: the
        ``source_finished`` flags of the live leases), the owner of its reader partition 0, and with
        several readers ``owners``, each partition's; ``unread_records`` summed over the readers that
        run here (``None`` while one of them cannot tell, or some run elsewhere)."""
        readers: dict[str, list[Any]] = {}
        for reader in self._units.readers:
            readers.setdefault(reader.plan.source_id, []).append(reader)
        sources: dict[str, dict[str, Any]] = {}
        for source_id, source in plan.sources.items():
            here = readers.get(source_id, [])
            finished = len(here) == source.readers and all(reader.finished for reader in here)
            if engine is not None and not finished:
                finished = await self._host.source_finished(engine, source_id, leases)
            unread = [reader.unread_records() for reader in here]
            entry: dict[str, Any] = {
                "finished": finished, "owner": owners.get(Unit.source(source_id).key),
                "unread_records": 0 if finished else (
                    sum(unread) if len(here) == source.readers and None not in unread else None)}
            if source.readers > 1:
                entry["owners"] = [owners.get(Unit.source(source_id, k).key) for k in range(source.readers)]
            sources[source_id] = entry
        return sources

    async def _partitions(self, engine: Engine | None, plan: Plan,
                          owners: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
        """Every computation partition: its owner and input lag; where it runs here, its sinks' state
        (``unacknowledged`` messages, ``in_flight`` deliveries started and not ended, ``held``: why
        its sinks start no new delivery now, ``egress.runtime.holds``; ``blocked``)."""
        local = self._units.jobs_by_unit()
        remote = await committed_positions(engine, plan) if engine is not None and self._host.shared else {}
        partitions = []
        for unit in plan_units(plan):
            if unit.is_source:
                continue
            job = local.get(unit)
            positions = job.positions() if job is not None else remote.get(unit)
            lag = await input_lag(engine, plan, unit, positions)
            entry: dict[str, Any] = {"computation": unit.name, "partition": unit.partition,
                                     "owner": owners.get(unit.key), "input_lag": lag, "input_lag_seconds": None}
            if job is not None:
                endpoints = {sink_id: sink.endpoint_rows() for sink_id, sink in job.sinks.items()
                             if isinstance(sink, FansOut)}
                if endpoints:
                    entry["endpoints"] = endpoints
                entry.update(unacknowledged={sink_id: sink.unacknowledged for sink_id, sink in job.sinks.items()},
                             in_flight={sink_id: sink.in_flight for sink_id, sink in job.sinks.items()},
                             held=sorted(job.holds.causes), blocked=job.blocked_error,
                             input_lag_seconds=self._input_lag_seconds(job, lag))
            partitions.append(entry)
        return partitions

    def _input_lag_seconds(self, job: PartitionJob, lag: int | None) -> float | None:
        """Seconds since ``job`` last read all its input, while it has ``lag`` messages unread (0 without)."""
        if lag is None:
            return None
        return max(0.0, self._clock.monotonic() - job.caught_up_at) if lag else 0.0

    async def resume_endpoint(self, name: str) -> int:
        """``egress endpoint resume NAME``: resume endpoint ``name`` in every fan-out sink instance
        this process runs; how many knew it."""
        resumed = 0
        for job in self._units.jobs_by_unit().values():
            for sink in job.sinks.values():
                if isinstance(sink, FansOut) and sink.resume_endpoint(name):
                    resumed += 1
        return resumed

    async def refresh_gauges(self) -> None:
        """Before a scrape of ``/metrics``: the unread records of each source read here, the input lag
        (messages, seconds) and the unacknowledged messages of each partition this process runs."""
        metrics, engine, plan = self._metrics, self._engine(), self._plan()
        for reader in self._units.readers:
            unread = reader.unread_records()
            if unread is not None:
                metrics.source_unread_records.labels(reader.plan.source_id).set(unread)
        for unit, job in self._units.jobs_by_unit().items():
            labels = (unit.name, str(unit.partition))
            lag = await input_lag(engine, plan, unit, job.positions())
            if lag is not None:
                metrics.partition_input_lag.labels(*labels).set(lag)
                metrics.partition_input_lag_seconds.labels(*labels).set(self._input_lag_seconds(job, lag) or 0.0)
            for sink_id, sink in job.sinks.items():
                metrics.partition_unacknowledged.labels(*labels, sink_id).set(sink.unacknowledged)

    async def stream_ends(self) -> dict[tuple[str, int], int]:
        """The end offset of each ``(stream, partition)`` a computation reads, the sum over the stream's
        lanes (``egress.runtime.lanes``; ``{}`` while no engine is open)."""
        engine, plan = self._engine(), self._plan()
        if engine is None:
            return {}
        lanes = {lane: stream for computation in plan.computations.values()
                 for lane, stream in computation.input_lanes.items()}
        ends: dict[tuple[str, int], int] = {}
        for lane, stream in sorted(lanes.items()):
            for partition in range(plan.spec.partition_count):
                ends[(stream, partition)] = ends.get((stream, partition), 0) + await engine.end_offset(lane, partition)
        return ends

    def dashboard(self) -> Dashboard:
        """The dashboard: the ``/status`` document, metrics, graph, stream ends and throttlers' limits
        (imports aiohttp: made only for ``--http-port``)."""
        from egress.observe.dashboard import Dashboard

        return Dashboard(self._metrics.registry, self._clock, title=f"pipeline {self._plan().spec.pipeline}",
                         status=self.document, graph=lambda: spec_graph(self._plan().spec),
                         ends=self.stream_ends, limits=lambda: throttler_limits(self._plan()))


async def committed_positions(engine: Engine, plan: Plan) -> dict[Unit, dict[str, int]]:
    """The committed input positions of every computation partition, from the inventory (for
    those another worker runs), by log stream read (a stream's lanes, ``egress.runtime.lanes``):
    known for a stream only one computation reads (the inventory does not say whose a position is)."""
    readers: dict[str, list[str]] = {}
    for computation in plan.computations.values():
        for lane in computation.input_lanes:
            readers.setdefault(lane, []).append(computation.computation_id)
    committed = (await engine.inventory()).read_positions
    positions: dict[Unit, dict[str, int]] = {}
    for computation in plan.computations.values():
        lanes = list(computation.input_lanes)
        if any(len(readers[lane]) > 1 for lane in lanes):
            continue
        for partition in range(plan.spec.partition_count):
            positions[Unit.computation(computation.computation_id, partition)] = {
                lane: max(committed.get((lane, partition), [0])) for lane in lanes}
    return positions


async def input_lag(engine: Engine | None, plan: Plan, unit: Unit, positions: dict[str, int] | None) -> int | None:
    """Messages of computation ``unit``'s inputs after ``positions`` (by log stream read, every lane
    of each input stream; ``None``: unknown here, or no engine open)."""
    if engine is None or positions is None:
        return None
    lag = 0
    for lane in plan.computations[unit.name].input_lanes:
        lag += await engine.end_offset(lane, unit.partition) - positions.get(lane, 0)
    return lag
