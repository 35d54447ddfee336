"""The cluster host: this process is one worker of a cluster sharing the pipeline's units.

A :class:`~egress.runtime.cluster.worker.Worker` takes and hands over this process's share of the
units. Jobs of another worker's upstream wake on the engine's append notifications, and every
``remote_poll_period`` seconds regardless (the notifications are at most once): on an engine that
tells whether appends may have been missed (``MissedAppends``, NATS), only when it says so, so the
jobs of an idle cluster are not woken to read inputs nothing was appended to. Every
``drained_check_period`` seconds the host reads the engine: once every source is finished
(``source_finished`` metadata of its live lease) the jobs are told, and with ``until_drained`` the
worker stops once its jobs are idle or blocked and the inventory shows no work outstanding
anywhere (``egress.runtime.cluster.drained``); once the jobs were told, the engine is read only
while they are idle (nothing else is left to learn), and a flag read set is not read again while
its reader's lease lasts. On an engine on a message bus with DynamicSpec
throttlers and no ``--throttler-url`` the workers elect the throttler controller
(``egress.runtime.cluster.throttler_role``); on a shared SQLite database (``--processes N``) the
worker running :func:`~egress.runtime.retention.trimming_unit` trims the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from egress.engines import Engine, LeaseInfo, MessageBus, MissedAppends
from egress.runtime.cluster.drained import FinishedFlags, outstanding_work, source_is_finished
from egress.runtime.cluster.duplicates import (
    PROCESS_SPACE,
    DuplicateWorkerError,
    claim_worker_id,
    new_instance,
    process_of,
    process_space,
    renewal,
)
from egress.runtime.cluster.worker import ClusterSpecError, Worker, WorkerSettings, refuse_another_spec, spec_digest
from egress.runtime.hosts import HostContext, RunResult, plan_units
from egress.runtime.layout import unreachable_work
from egress.runtime.retention import log_retention, trim_consumed, trim_periodically, trimming_unit
from egress.runtime.source_reader import finished_key
from egress.runtime.unit import Unit
from egress.spec import DynamicSpec
from egress.throttler import Throttling

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from egress.runtime.cluster.throttler_role import ControllerElection


class ClusterHost:
    """This process's share of the units, as cluster worker ``worker_id``
    (:class:`~egress.runtime.hosts.Host`). ``status_url`` gives the ``/status`` address other
    workers show for this one (``None``: no ``--http-port``)."""

    shared = True

    def __init__(self, context: HostContext, worker_id: str, status_url: Callable[[], str | None]) -> None:
        self._context = context
        self.worker_id = worker_id
        self._status_url = status_url
        self._started_at = 0.0
        self._finished_flags = FinishedFlags()
        self._instance = new_instance()  # this process's token in its membership record
        self._taken_over: tuple[Any, Any] | None = None  # a crashed predecessor's record under this id
        self.worker: Worker | None = None  # while the run runs
        self.election: ControllerElection | None = None  # on a message bus, with throttlers to serve

    async def join(self, engine: Engine, started_at: float) -> None:
        """Refuse a worker id another live process runs under
        (:class:`~egress.runtime.cluster.duplicates.DuplicateWorkerError`; a record a crashed one
        left is taken over, after up to a heartbeat period), and a Spec other than the live
        members' (of two with different Specs the later leaves)."""
        self._started_at = started_at
        predecessor = await claim_worker_id(engine, self.worker_id, self._instance, self._context.clock,
                                            heartbeat_period=self._context.options.heartbeat_period)
        if predecessor is not None:
            logger.info("worker %s: %s ran under this worker id and stopped: took its membership record over",
                        self.worker_id, process_of(predecessor))
            self._taken_over = renewal(predecessor)
        await refuse_another_spec(engine, spec_digest(self._context.plan.spec), self.worker_id,
                                  self._context.plan.spec_file, started_at)

    def elected_throttling(self, engine: Engine, dynamic: DynamicSpec, *, file: str | None,
                           registry: CollectorRegistry | None) -> Throttling | None:
        """On a message bus, with DynamicSpec throttlers and no ``--throttler-url``: the workers
        elect the controller; the throttling whose clients reach it over the bus."""
        if not dynamic.throttlers or self._context.options.throttler_url is not None \
                or not isinstance(engine, MessageBus):
            return None
        from egress.runtime.cluster.throttler_role import cluster_throttling

        throttling, self.election = cluster_throttling(
            engine, dynamic, self._context.clock, file=file, worker_id=self.worker_id,
            options=self._context.options, registry=registry)
        return throttling

    def request_stop(self) -> None:
        if self.worker is not None:
            self.worker.request_stop()

    async def close(self) -> None:
        if self.election is not None:
            await self.election.stop()

    async def source_finished(self, engine: Engine, source_id: str, leases: list[LeaseInfo]) -> bool:
        """By whichever worker: the ``source_finished`` flag of each reader partition's live lease."""
        for partition in range(self._context.plan.sources[source_id].readers):
            flag = await engine.read_meta(finished_key(source_id, partition))
            if not source_is_finished(flag, Unit.source(source_id, partition), leases):
                return False
        return True

    async def describe(self, engine: Engine | None, leases: list[LeaseInfo]) -> dict[str, Any]:
        members = [] if engine is None else await engine.members()
        return {"worker": self.worker_id,
                "members": [{"worker_id": m.worker_id, **m.details} for m in members],
                "throttler": None if self.election is None else self.election.status(leases)}

    async def run(self, engine: Engine, result: RunResult) -> None:
        """Run this worker's share of the units until stopped."""
        context = self._context
        self.worker = worker = Worker(engine, context.units, plan_units(context.plan), self._settings(), context.clock)
        context.units.on_change = worker.notice
        engine.on_appends(context.units.wake)
        background = [asyncio.create_task(self._poll_remote_inputs(engine)),
                      asyncio.create_task(self._watch(engine, result))]
        if self.election is not None:
            background.append(asyncio.create_task(self.election.run()))
        retention = log_retention(engine)
        if retention is not None:  # --processes N: one worker trims the shared log (egress.runtime.retention)
            trimmer = trimming_unit(context.plan)
            background.append(asyncio.create_task(trim_periodically(
                retention, engine.location.name, context.plan, context.options, context.clock,
                holds=lambda: trimmer in context.units.running)))
        if context.stop.is_set():
            worker.request_stop()
        try:
            await worker.run()
        except (ClusterSpecError, DuplicateWorkerError):
            raise
        except Exception as error:  # a failure of the pipeline (a job's, or the engine's)
            result.error = error
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        if retention is not None and result.error is None:
            # Each worker once: what the last epochs consumed.
            await trim_consumed(retention, context.plan, context.options)

    def _settings(self) -> WorkerSettings:
        options = self._context.options
        details: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": self._started_at,
                                      PROCESS_SPACE: process_space()}
        status_url = self._status_url()
        if status_url is not None:
            details["status_url"] = status_url
        return WorkerSettings(self.worker_id, spec_digest(self._context.plan.spec), lease_ttl=options.lease_ttl,
                              heartbeat_period=options.heartbeat_period, spec_file=self._context.plan.spec_file,
                              details=details, instance=self._instance, taken_over=self._taken_over)

    async def _poll_remote_inputs(self, engine: Engine) -> None:
        """The backstop of the append notifications (at-most-once): wake every job now and then,
        on a ``MissedAppends`` engine only when it says an append may have been missed (and when
        asking it failed: the jobs' reads meet the engine's trouble themselves)."""
        asks = engine if isinstance(engine, MissedAppends) else None
        while True:
            await self._context.clock.sleep(self._context.options.remote_poll_period)
            if asks is not None:
                try:
                    if not await asks.appends_missed():
                        continue
                except Exception as error:  # the engine unreachable for a moment
                    logger.debug("asking the engine for missed appends failed (%s): waking every job", error)
            self._context.units.wake(None)

    async def _watch(self, engine: Engine, result: RunResult) -> None:
        """Every source finished (from the engine): tell the jobs; then, with ``until_drained``,
        stop once this worker's jobs are idle or blocked and no work is outstanding anywhere."""
        context = self._context
        while not context.stop.is_set():
            await context.clock.sleep(context.options.drained_check_period)
            if context.units.input_finished and not (context.options.until_drained
                                                     and all(j.idle for j in context.units.jobs)):
                continue  # told already: only the drained end is left, which needs this worker's jobs idle
            if not await self._sources_finished(engine):
                continue
            if not context.units.input_finished:
                context.units.tell_input_finished()
            idle = all(j.idle for j in context.units.jobs)
            if context.options.until_drained and idle and await self._drained(engine, result):
                result.drained = all(j.blocked_error is None for j in context.units.jobs)
                context.stop_run()

    async def _sources_finished(self, engine: Engine) -> bool:
        """Whether every source is finished. The flags are read first, the leases only once every
        reader has one: an unfinished source (a live one, always) costs no listing of the leases,
        and no read at all while this worker runs one of its readers, unfinished;
        a flag read set is not read again while its reader's lease lasts (:class:`FinishedFlags`)."""
        readers = [Unit.source(source_id, partition) for source_id, source in self._context.plan.sources.items()
                   for partition in range(source.readers)]
        return await self._finished_flags.all_finished(
            readers, lambda unit: engine.read_meta(finished_key(unit.name, unit.partition)), engine.leases,
            self._context.units.readers_reading())

    async def _drained(self, engine: Engine, result: RunResult) -> bool:
        inventory = await engine.inventory()
        blocked = {(job.plan.computation_id, job.partition) for job in self._context.units.jobs
                   if job.blocked_error is not None}
        result.unreachable = unreachable_work(inventory, self._context.plan)
        return not outstanding_work(inventory, self._context.plan, blocked) and not result.unreachable
