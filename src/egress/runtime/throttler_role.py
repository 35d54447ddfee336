"""The cluster's throttler: one controller per pipeline, elected among the workers, reached over NATS.

Every worker of a cluster run on NATS (``egress run --engine nats://...``) has a :class:`Throttling`
whose transport is :class:`~egress.throttler.nats_transport.NatsTransport` to the pipeline's
subject, and a :class:`ControllerElection`. The election is the engine lease of consumer
:data:`CONTROLLER_ROLE` partition 0: every ``retry_period`` seconds a worker that does not hold it
tries to take it (``try_acquire``, owner = worker id, ``lease_ttl``); the holder serves a fresh
:class:`~egress.throttler.controller.ThrottlerController` on the subject and renews the lease every
``renew_period`` seconds. It stops serving (and so granting) when a renewal returns ``False``, and
on its own clock once ``lease_ttl`` has passed since it sent its last successful renewal (a worker
cut off from NATS, or paused): the lease may have lapsed and another worker may be serving, so
two controllers never grant at the same time. An orderly stop releases the lease: another worker
takes it within ``retry_period``. A worker that dies keeps it until it lapses: ``lease_ttl``
(rounded up to whole seconds by NATS) after its last renewal, within a second of which NATS
removes it, then another worker takes it at its next try.

The envelope across a change of controller: the new controller starts as after a restart at an
unknown time (``assume_restart``): every bucket closed for one lease (``prefetch_lease`` + the
reply allowance), then empty. Whatever its predecessor granted before it stopped is used up by
then, so at the point of use every window still sees at most ``limit·T + limit·period`` (the
argument of a restarted ``egress throttler serve``). Clients retry under ``retrying_channel`` and
``rpc_timeout`` meanwhile; calls wait, they do not fail until that budget is spent.

DynamicSpec ``throttlers`` reach every worker, and so the controller wherever it runs, through the
engine's metadata (:class:`SharedThrottlers`, key :data:`SPEC_KEY`): a worker whose own DynamicSpec
file changes its ``throttlers`` (or that starts with ones other than those published) publishes
them with the next version; every worker applies the newest version it reads, at each try for or
renewal of the lease. The last change published wins. A new controller starts from the throttlers
in force on its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from egress.clock import Clock
from egress.engines import ROLE_PREFIX, Engine, LeaseInfo
from egress.errors import SpecErrors
from egress.runtime.options import RunOptions
from egress.spec import DynamicSpec
from egress.throttler import ThrottlerController, Throttling
from egress.throttler.nats_transport import (
    REPLY_ALLOWANCE,
    NatsConnection,
    NatsQuotaServer,
    NatsTransport,
    request_subject,
)

if TYPE_CHECKING:
    from egress.engines.nats import NatsEngine

logger = logging.getLogger(__name__)

CONTROLLER_ROLE = ROLE_PREFIX + "throttler-controller"
"""The consumer name of the controller lease (partition 0)."""

RETRY_PERIOD = 0.5
"""Seconds between a worker's tries for the controller lease while another holds it."""


SPEC_KEY = "throttler_spec"
"""Engine metadata key of the pipeline's DynamicSpec ``throttlers``: JSON ``{"version", "worker",
"throttlers"}`` (the ``throttlers`` mapping as a DynamicSpec file holds it)."""


class SharedThrottlers:
    """Keeps the DynamicSpec ``throttlers`` of every worker of a cluster the same, live.

    :meth:`sync` publishes ``throttling.file_throttlers`` under :data:`SPEC_KEY` of ``engine`` when
    they changed since the last call (the first call: when they differ from the published ones),
    with the version after the published one; then applies the published throttlers when they are
    not those in force (``Throttling.adopt_throttlers``). ``applied`` is the version in force here.
    Concurrent changes on two workers: the one written last wins.
    """

    def __init__(self, engine: Engine, throttling: Throttling, worker_id: str) -> None:
        self.engine = engine
        self.throttling = throttling
        self.worker_id = worker_id
        self.applied = 0
        self._file_seen: dict[str, Any] | None = None

    async def sync(self) -> None:
        """Publish this worker's changed throttlers, then apply the newest published ones. Raises
        the engine's errors; published throttlers invalid here are logged and not applied."""
        stored = await self._read()
        file_throttlers = _plain(self.throttling.file_throttlers)
        if file_throttlers != self._file_seen:
            first = self._file_seen is None
            self._file_seen = file_throttlers
            if not (first and stored is not None and stored["throttlers"] == file_throttlers):
                stored = {"version": (0 if stored is None else int(stored["version"])) + 1,
                          "worker": self.worker_id, "throttlers": file_throttlers}
                await self.engine.write_meta(SPEC_KEY, json.dumps(stored))
        if stored is None:
            return
        if stored["throttlers"] != _plain(self.throttling.dynamic.throttlers):
            source = f"engine metadata {SPEC_KEY} version {stored['version']} (from worker {stored['worker']})"
            try:
                self.throttling.adopt_throttlers(stored["throttlers"], source=source)
            except SpecErrors as error:
                logger.warning("worker %s: the published throttlers are not applied: %s", self.worker_id, error)
                return
            logger.info("worker %s applies the throttlers of %s", self.worker_id, source)
        self.applied = int(stored["version"])

    async def _read(self) -> dict[str, Any] | None:
        text = await self.engine.read_meta(SPEC_KEY)
        return None if text is None else dict(json.loads(text))


def _plain(throttlers: dict[str, Any]) -> dict[str, Any]:
    """``throttlers`` as they read back from JSON, so that what is published compares equal to
    what is in force (a YAML or YSON file may hold tuples, dates or other scalars)."""
    return dict(json.loads(json.dumps(throttlers, default=str)))


class ControllerElection:
    """Takes, holds and gives up the controller lease of one worker (``worker_id``) on ``engine``,
    serving ``throttling``'s throttlers on ``subject`` over ``connection`` while it holds it.

    ``lease_ttl``, ``renew_period`` and ``retry_period`` are seconds on ``clock``. :meth:`run`
    runs until cancelled; :meth:`stop` then steps down and releases the lease. ``elected`` lists
    ``(generation, clock.now())`` of every term this worker began. ``registry`` gets the gauge
    ``egress_throttler_controller{worker_id}`` (1 while this worker serves) and the counter
    ``egress_throttler_controller_terms_total``.
    """

    def __init__(self, engine: Engine, throttling: Throttling, connection: NatsConnection, subject: str,
                 worker_id: str, clock: Clock, *, lease_ttl: float, renew_period: float, retry_period: float,
                 registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.throttling = throttling
        self.connection = connection
        self.subject = subject
        self.worker_id = worker_id
        self.clock = clock
        self.lease_ttl = lease_ttl
        self.renew_period = renew_period
        self.retry_period = retry_period
        self.elected: list[tuple[int, float]] = []
        self.shared: SharedThrottlers | None = None  # DynamicSpec throttlers spread across the workers
        self._server: NatsQuotaServer | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._generation: int | None = None
        self._entitled_until = float("-inf")  # monotonic: the lease surely holds until then
        if registry is not None:
            registry.register(_ElectionCollector(self))

    @property
    def serving(self) -> bool:
        """Whether this worker is the controller now (it serves and its lease surely holds: a
        worker whose engine calls hang through an outage stops counting once its lease may lapse)."""
        return self._server is not None and self.entitled()

    def entitled(self) -> bool:
        """Whether the lease surely still holds (``lease_ttl`` since the last renewal was sent)."""
        return self.clock.monotonic() < self._entitled_until

    async def run(self) -> None:
        """Try for the lease, or renew it, until cancelled (engine failures are logged and retried);
        after each, :meth:`SharedThrottlers.sync` when ``shared`` is set."""
        while True:
            try:
                await self._step()
            except Exception as error:  # the engine unreachable for a moment: try again
                logger.warning("worker %s: the throttler controller lease: %s: %s", self.worker_id,
                               type(error).__name__, error)
            if self.shared is not None:
                try:
                    await self.shared.sync()
                except Exception as error:
                    logger.warning("worker %s: the shared throttlers: %s: %s", self.worker_id,
                                   type(error).__name__, error)
            await self.clock.sleep(self._pause())

    def _pause(self) -> float:
        if self._server is None:
            return self.retry_period
        return max(0.0, min(self.renew_period, self._entitled_until - self.clock.monotonic()))

    async def _step(self) -> None:
        """Renew the lease held (or lose it), else try to take it; serve while it surely holds."""
        self.throttling.live_workers = max(1, len(await self.engine.members()))  # fallback_rate's divisor
        sent = self.clock.monotonic()
        if self._generation is not None:
            if await self.engine.renew(CONTROLLER_ROLE, 0, self._generation, self.lease_ttl):
                self._entitled_until = sent + self.lease_ttl
            else:
                self._generation = None
                await self._step_down("another worker holds its lease")
        if self._generation is None:
            sent = self.clock.monotonic()
            generation = await self.engine.try_acquire(CONTROLLER_ROLE, 0, self.worker_id, self.lease_ttl)
            if generation is not None:
                self._generation, self._entitled_until = generation, sent + self.lease_ttl
        if self._generation is not None and self._server is None and self.entitled():
            await self._serve(self._generation)

    async def _serve(self, generation: int) -> None:
        """Begin a term: a controller closed for one lease, then empty (never full)."""
        controller = ThrottlerController(self.throttling.throttlers, self.clock, assume_restart=True,
                                         allowance=REPLY_ALLOWANCE)
        server = NatsQuotaServer(controller, self.connection, self.subject, entitled=self.entitled)
        try:
            await server.start()
        except Exception:
            await controller.aclose()
            with contextlib.suppress(Exception):
                await self.engine.release(CONTROLLER_ROLE, 0, generation)
            self._generation = None
            raise
        self._server = server
        self.throttling.controller = controller
        self.elected.append((generation, self.clock.now()))
        self._watchdog = asyncio.get_running_loop().create_task(self._step_down_when_unentitled(server))
        logger.info("worker %s is the throttler controller (generation %d) on %s", self.worker_id, generation,
                    self.subject)

    async def _step_down_when_unentitled(self, server: NatsQuotaServer) -> None:
        """End the term once the lease may have lapsed, even while the engine calls of :meth:`run`
        hang through an outage: a controller that comes back must start afresh (closed, then
        empty), its clients having spent ``fallback_rate`` meanwhile."""
        while self._server is server:
            remaining = self._entitled_until - self.clock.monotonic()
            if remaining <= 0:
                await self._step_down(f"its lease was not renewed within {self.lease_ttl:g} s")
                return
            await self.clock.sleep(remaining)

    async def _step_down(self, why: str) -> None:
        server, self._server = self._server, None
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
        if server is None:
            return
        if self.throttling.controller is server.controller:
            self.throttling.controller = None
        logger.warning("worker %s is no longer the throttler controller: %s", self.worker_id, why)
        await server.stop()

    async def stop(self) -> None:
        """Step down and release the lease (another worker takes it within its ``retry_period``)."""
        generation, self._generation = self._generation, None
        await self._step_down("the worker stops")
        if generation is not None:
            try:
                await self.engine.release(CONTROLLER_ROLE, 0, generation)
            except Exception as error:
                logger.warning("the throttler controller lease was not released (%s); it lapses in %g s",
                               error, self.lease_ttl)
        await self.connection.aclose()

    def status(self, leases: list[LeaseInfo]) -> dict[str, Any]:
        """``/status``'s ``throttler``: the controller's worker (from the lease) and this worker's part."""
        holder = next((lease for lease in leases if (lease.consumer, lease.partition) == (CONTROLLER_ROLE, 0)), None)
        return {"controller": None if holder is None else holder.owner,
                "controller_generation": None if holder is None else holder.generation,
                "serving_here": self.serving, "subject": self.subject, "terms_here": len(self.elected)}


class _ElectionCollector:
    def __init__(self, election: ControllerElection) -> None:
        self._election = election

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        election = self._election
        serving = GaugeMetricFamily("egress_throttler_controller",
                                    "1 while this worker is the pipeline's throttler controller.", labels=["worker_id"])
        serving.add_metric([election.worker_id], 1.0 if election.serving else 0.0)
        terms = CounterMetricFamily("egress_throttler_controller_terms",
                                    "Times this worker became the throttler controller.", labels=["worker_id"])
        terms.add_metric([election.worker_id], len(election.elected))
        yield from (serving, terms)


def cluster_throttling(engine: NatsEngine, dynamic: DynamicSpec, clock: Clock, *, file: str | None, worker_id: str,
                       options: RunOptions,
                       registry: CollectorRegistry | None) -> tuple[Throttling, ControllerElection]:
    """The :class:`Throttling` (clients over NATS to ``engine``'s pipeline subject) and the
    :class:`ControllerElection` of cluster worker ``worker_id``: the lease lasts
    ``options.lease_ttl``, is renewed every ``options.heartbeat_period`` and tried for every
    :data:`RETRY_PERIOD` seconds (at most a heartbeat). Raises :class:`SpecErrors` for invalid
    ``throttlers`` in ``dynamic`` (read from ``file``)."""
    connection = NatsConnection(engine.servers, name=f"egress throttler {worker_id}")
    subject = request_subject(engine.bucket)
    throttling = Throttling(dynamic, clock, registry=registry, file=file,
                            transport=NatsTransport(connection, subject, clock))
    election = ControllerElection(engine, throttling, connection, subject, worker_id, clock,
                                  lease_ttl=options.lease_ttl, renew_period=options.heartbeat_period,
                                  retry_period=min(RETRY_PERIOD, options.heartbeat_period), registry=registry)
    election.shared = SharedThrottlers(engine, throttling, worker_id)
    return throttling, election
