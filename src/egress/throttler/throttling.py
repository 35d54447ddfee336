"""What a pipeline run needs from the throttler, in one object: the integration point for the runtime.

One :class:`Throttling` per ``egress run`` process. It validates DynamicSpec ``throttlers`` (and the
computations' throttler fields), runs the controller in-process or talks to ``egress throttler
serve`` (``throttler_url``), hands out one :class:`ThrottlerFactory` per computation (or sink) for
``ctx.get_throttler_or_throw`` / ``ctx.try_get_throttler``, throttles input batches automatically
(:class:`InputThrottle`), applies a new DynamicSpec live, and registers the sensors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from egress.clock import Clock
from egress.spec.models import DynamicSpec
from egress.throttler.client import TimestampProvider
from egress.throttler.controller import ThrottlerController
from egress.throttler.factory import ThrottlerFactory, ThrottlerHandle
from egress.throttler.fallback import AwayBudget
from egress.throttler.models import ThrottlerSpec, validate_dynamic_throttlers
from egress.throttler.sensors import ClientSensors, ControllerCollector
from egress.throttler.transport import InProcessTransport, QuotaTransport

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

THROTTLER_STATE_NAME = "throttler-horizon.json"
"""The in-process controller's restart horizon, in the run's state directory."""


class InputThrottle:
    """Automatic throttling of one computation's input batches (``input_rows_throttler_id`` counts
    messages, ``input_bytes_throttler_id`` sums message byte sizes); follows live reconfiguration."""

    def __init__(self, throttling: Throttling, computation_id: str, factory: ThrottlerFactory) -> None:
        self._throttling = throttling
        self._computation_id = computation_id
        self._factory = factory

    def throttler_ids(self) -> tuple[str | None, str | None]:
        """(rows throttler id, bytes throttler id) configured now; ``None`` when not set."""
        computation = self._throttling.dynamic.computations.get(self._computation_id)
        if computation is None:
            return None, None
        return computation.input_rows_throttler_id, computation.input_bytes_throttler_id

    @property
    def active(self) -> bool:
        return any(self.throttler_ids())

    async def wait(self, rows: int, byte_size: int, *, timestamp: float | None = None) -> float:
        """Wait for quota for one batch (rows first, then bytes); returns the seconds waited (the
        ``Input.Throttle`` span). Raises the errors of :meth:`ThrottlerHandle.throttle`. Cancelled
        while waiting for the bytes, it gives the rows' units back (the batch will not be processed)."""
        clock = self._throttling.clock
        started = clock.monotonic()
        rows_id, bytes_id = self.throttler_ids()
        taken: ThrottlerHandle | None = None
        try:
            if rows_id is not None and rows > 0:
                handle = self._factory.get_throttler_or_throw(rows_id)
                await handle.throttle(rows, timestamp=timestamp)
                taken = handle
            if bytes_id is not None and byte_size > 0:
                await self._factory.get_throttler_or_throw(bytes_id).throttle(byte_size, timestamp=timestamp)
        except BaseException:
            if taken is not None and taken.is_configured:
                taken.release(rows)
            raise
        return clock.monotonic() - started

    async def wait_unless(self, stop: asyncio.Event, rows: int, byte_size: int, *,
                          timestamp: float | None = None) -> float | None:
        """:meth:`wait`, given up as soon as ``stop`` is set (a job asked to stop while its batch
        waits for quota: Ctrl-C, or its partition moving to another worker). Returns the seconds
        waited, or ``None`` when it gave up: the batch got no quota (units already taken for its
        rows are given back) and must not be processed."""
        if stop.is_set():
            return None
        waiting = asyncio.ensure_future(self.wait(rows, byte_size, timestamp=timestamp))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        if waiting.cancelled():
            return None
        return waiting.result()


class Throttling:
    """The throttlers of one process. Raises :class:`SpecErrors` at construction for an invalid
    DynamicSpec (call it before the pipeline starts: class ids are checked there).

    ``throttler_url`` = ``http://host:port`` of ``egress throttler serve``; ``transport`` = another
    way to a controller elsewhere (a cluster worker's NATS transport: the worker that holds the
    controller lease sets :attr:`controller` while it serves, so that :meth:`reconfigure` reaches
    it); with neither the controller runs in-process, keeping its restart horizon in ``state_file``
    (the run's state directory: a restarted run keeps the envelope). ``registry`` receives the
    sensors (the run's ``Metrics.registry``; the controller's while this process has one).
    """

    def __init__(self, dynamic: DynamicSpec, clock: Clock, *, registry: CollectorRegistry | None = None,
                 throttler_url: str | None = None, file: str | None = None,
                 state_file: str | Path | None = None, transport: QuotaTransport | None = None) -> None:
        self.clock = clock
        self.dynamic = dynamic
        self.throttlers: dict[str, ThrottlerSpec] = validate_dynamic_throttlers(dynamic, file=file)
        self.file_throttlers: dict[str, Any] = dict(dynamic.throttlers)  # as this process's own file says
        self.controller: ThrottlerController | None = None
        self.transport: QuotaTransport
        if transport is not None:
            self.transport = transport
        elif throttler_url is None:
            self.controller = ThrottlerController(self.throttlers, clock, state_file=state_file)
            self.transport = InProcessTransport(self.controller)
        else:
            from egress.throttler.http_transport import HttpTransport

            self.transport = HttpTransport(throttler_url, clock)
        self.sensors = ClientSensors(registry) if registry is not None else None
        if registry is not None and (self.controller is not None or transport is not None):
            registry.register(ControllerCollector(lambda: self.controller))
        self._factories: list[tuple[ThrottlerFactory, str, Mapping[str, str | None] | None]] = []
        self.live_workers = 1  # the cluster's, kept up to date by its election; fallback_rate is shared by them
        self._fallbacks: dict[str, AwayBudget] = {}

    def fallback(self, throttler_id: str) -> AwayBudget | None:
        """The budget every client of ``throttler_id`` in this process shares while no controller
        answers: ``fallback_rate / live_workers`` units/s (as configured now); ``None`` without
        ``fallback_rate`` when the client is made."""
        spec = self.throttlers.get(throttler_id)
        if spec is None or spec.fallback_rate is None:
            return None
        budget = self._fallbacks.get(throttler_id)
        if budget is None:
            budget = self._fallbacks[throttler_id] = AwayBudget(
                lambda: self._fallback_rate(throttler_id), lambda: self._request_period(throttler_id))
        return budget

    def _fallback_rate(self, throttler_id: str) -> float:
        spec = self.throttlers.get(throttler_id)
        rate = spec.fallback_rate if spec is not None else None
        return (rate or 0.0) / max(1, self.live_workers)

    def _request_period(self, throttler_id: str) -> float:
        spec = self.throttlers.get(throttler_id)
        return spec.request_period if spec is not None else 0.0

    def class_ids(self, computation_id: str) -> dict[str, str | None]:
        """The computation's quota class per throttler, from its ``input_*_throttler_class_id``."""
        computation = self.dynamic.computations.get(computation_id)
        if computation is None:
            return {}
        found: dict[str, str | None] = {}
        for throttler_id, class_id in ((computation.input_rows_throttler_id, computation.input_rows_throttler_class_id),
                                       (computation.input_bytes_throttler_id,
                                        computation.input_bytes_throttler_class_id)):
            if throttler_id is not None:
                found[throttler_id] = class_id
        return found

    def factory(self, computation_id: str, *, client_id: str = "", timestamp_provider: TimestampProvider | None = None,
                class_ids: Mapping[str, str | None] | None = None) -> ThrottlerFactory:
        """A factory for one job of ``computation_id`` (or one sink: pass its ``class_ids``).

        Without ``class_ids`` the computation's classes apply to every request it makes to that
        throttler, manual ones included (as upstream). Kept up to date by :meth:`reconfigure`.
        """
        factory = ThrottlerFactory(self.transport, self.clock, self.throttlers,
                                   class_ids=class_ids if class_ids is not None else self.class_ids(computation_id),
                                   client_id=client_id or computation_id, timestamp_provider=timestamp_provider,
                                   sensors=self.sensors, computation_id=computation_id, fallback=self.fallback)
        self._factories.append((factory, computation_id, class_ids))
        return factory

    async def close_factory(self, factory: ThrottlerFactory) -> None:
        """A job ended: fail its waiting calls and stop following reconfigures for it."""
        self._factories = [entry for entry in self._factories if entry[0] is not factory]
        await factory.aclose()

    def input_throttle(self, computation_id: str, factory: ThrottlerFactory) -> InputThrottle:
        """Automatic input throttling of ``computation_id`` through the job's ``factory``."""
        return InputThrottle(self, computation_id, factory)

    def reconfigure(self, dynamic: DynamicSpec, *, file: str | None = None) -> None:
        """Apply a new DynamicSpec live (raises :class:`SpecErrors` and changes nothing when invalid).
        Its ``throttlers`` become :attr:`file_throttlers`: what this process's own file says."""
        self._apply(dynamic, file=file)
        self.file_throttlers = dict(dynamic.throttlers)

    def adopt_throttlers(self, throttlers: Mapping[str, Any], *, source: str) -> None:
        """Apply DynamicSpec ``throttlers`` from elsewhere (another cluster worker's DynamicSpec,
        published in the engine's metadata ``source``); the rest of this process's DynamicSpec and
        :attr:`file_throttlers` stay. Raises :class:`SpecErrors` (paths ``throttlers/...`` in
        ``source``) and changes nothing when they are invalid here, e.g. a computation's
        ``input_rows_throttler_id`` names a throttler they lack."""
        self._apply(self.dynamic.model_copy(update={"throttlers": dict(throttlers)}), file=source)

    def _apply(self, dynamic: DynamicSpec, *, file: str | None) -> None:
        throttlers = validate_dynamic_throttlers(dynamic, file=file)
        self.dynamic, self.throttlers = dynamic, throttlers
        if self.controller is not None:
            self.controller.reconfigure(throttlers)
        for factory, computation_id, class_ids in self._factories:
            factory.reconfigure(throttlers, class_ids if class_ids is not None else self.class_ids(computation_id))

    async def aclose(self) -> None:
        for factory, _, _ in self._factories:
            await factory.aclose()
        await self.transport.aclose()
        if self.controller is not None:
            await self.controller.aclose()
