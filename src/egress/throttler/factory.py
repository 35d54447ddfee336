"""Throttler handles for user code and the runtime: stable across reconfigure, one client per name.

Source: upstream Flow throttler factory (``GetThrottlerOrThrow`` / ``TryGetThrottler``): the factory
swaps the inner client on ``Reconfigure`` so a handle kept from ``init`` stays valid; a removed name
makes the handle raise ``Throttler "X" is not configured for this client``; re-adding revives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from egress.clock import Clock
from egress.throttler.client import PrefetchingClient, TimestampProvider
from egress.throttler.errors import ThrottleInterruptedError, ThrottlerNotConfiguredError
from egress.throttler.fallback import AwayBudget
from egress.throttler.models import ThrottlerSpec
from egress.throttler.sensors import ClientSensors
from egress.throttler.transport import QuotaTransport


def _not_configured(throttler_id: str) -> ThrottlerNotConfiguredError:
    return ThrottlerNotConfiguredError(f'Throttler "{throttler_id}" is not configured for this client')


class ThrottlerHandle:
    """What ``ctx.get_throttler_or_throw(id)`` returns (upstream ``IThroughputThrottlerPtr``)."""

    def __init__(self, factory: ThrottlerFactory, throttler_id: str) -> None:
        self._factory = factory
        self.throttler_id = throttler_id

    @property
    def is_configured(self) -> bool:
        return self.throttler_id in self._factory._clients

    def _client(self) -> PrefetchingClient:
        client = self._factory._clients.get(self.throttler_id)
        if client is None:
            raise _not_configured(self.throttler_id)
        return client

    async def throttle(self, amount: float, *, timestamp: float | None = None) -> None:
        """Wait for ``amount`` units (messages, bytes or requests: the throttler's unit).

        ``timestamp`` (seconds) overrides the job's lag timestamp. Raises
        :class:`ThrottlerNotConfiguredError` while the name is not declared, plus the errors of
        :meth:`PrefetchingClient.throttle`, among them :class:`ThrottleInterruptedError` when the
        job is asked to stop while the call waits (``ThrottlerFactory.stopping``).
        """
        factory = self._factory
        try:
            await self._client().throttle(amount, timestamp=timestamp, stop=factory.stopping)
        except ThrottleInterruptedError:
            factory.interrupted = True
            raise

    def try_acquire(self, amount: float) -> bool:
        """Use ``amount`` units from the local prefetch without waiting; ``False`` if they are not there."""
        return self._client().try_acquire(amount)

    def release(self, amount: float) -> None:
        """Give back ``amount`` units taken but not used."""
        self._client().release(amount)


class ThrottlerFactory:
    """The throttlers one computation (job) sees: handles by id over one transport.

    ``throttlers`` is DynamicSpec ``throttlers`` validated (:func:`validate_throttlers`);
    ``class_ids`` maps throttler id → the computation's quota class for it; ``client_id`` names the
    job in RPCs; ``timestamp_provider`` gives the job's lag timestamp (seconds); ``sensors`` and
    ``computation_id`` label the client sensors.

    ``stopping`` is the job's stop event (its job sets it while the process function runs, so not
    for the automatic input throttle, which gives up by itself): a handle's :meth:`ThrottlerHandle.throttle`
    waiting when it is set raises :class:`ThrottleInterruptedError` and sets ``interrupted``, which
    tells the job to discard its epoch (also when the process function caught the error).
    """

    def __init__(self, transport: QuotaTransport, clock: Clock, throttlers: Mapping[str, ThrottlerSpec], *,
                 class_ids: Mapping[str, str | None] | None = None, client_id: str = "",
                 timestamp_provider: TimestampProvider | None = None, sensors: ClientSensors | None = None,
                 computation_id: str = "", fallback: Callable[[str], AwayBudget | None] | None = None) -> None:
        self._transport = transport
        self._fallback = fallback
        self._clock = clock
        self._client_id = client_id
        self._timestamp_provider = timestamp_provider
        self._sensors = sensors
        self._computation_id = computation_id
        self._class_ids: dict[str, str | None] = dict(class_ids or {})
        self._clients: dict[str, PrefetchingClient] = {}
        self._handles: dict[str, ThrottlerHandle] = {}
        self._retired: list[PrefetchingClient] = []
        self.stopping: asyncio.Event | None = None
        self.interrupted = False
        self.reconfigure(throttlers, class_ids)

    def reconfigure(self, throttlers: Mapping[str, ThrottlerSpec],
                    class_ids: Mapping[str, str | None] | None = None) -> None:
        """Apply a new DynamicSpec: changed throttlers keep their client (and quota on hand), removed
        ones fail their waiting calls with ``Throttler "X" is not configured for this client``."""
        if class_ids is not None:
            self._class_ids = dict(class_ids)
        for throttler_id in [t for t in self._clients if t not in throttlers]:
            removed = self._clients.pop(throttler_id)
            removed.closed = _not_configured(throttler_id)
            removed.fail_all(removed.closed)
            self._retired.append(removed)
        for throttler_id, spec in throttlers.items():
            class_id = self._class_ids.get(throttler_id)
            client = self._clients.get(throttler_id)
            if client is None:
                self._clients[throttler_id] = PrefetchingClient(
                    throttler_id, spec, self._transport, self._clock, client_id=self._client_id, class_id=class_id,
                    timestamp_provider=self._timestamp_provider, sensors=self._sensors,
                    computation_id=self._computation_id,
                    fallback=None if self._fallback is None else self._fallback(throttler_id))
            else:
                client.reconfigure(spec, class_id)
                client.fallback = None if self._fallback is None else self._fallback(throttler_id)

    def get_throttler_or_throw(self, throttler_id: str) -> ThrottlerHandle:
        """The handle of a declared throttler (the same object every time); raises
        :class:`ThrottlerNotConfiguredError` when ``throttler_id`` is not declared."""
        if throttler_id not in self._clients:
            raise _not_configured(throttler_id)
        return self._handle(throttler_id)

    def try_get_throttler(self, throttler_id: str) -> ThrottlerHandle | None:
        """The handle, or ``None`` while ``throttler_id`` is not declared (ask again after it is)."""
        return self._handle(throttler_id) if throttler_id in self._clients else None

    def _handle(self, throttler_id: str) -> ThrottlerHandle:
        handle = self._handles.get(throttler_id)
        if handle is None:
            handle = self._handles[throttler_id] = ThrottlerHandle(self, throttler_id)
        return handle

    def client(self, throttler_id: str) -> PrefetchingClient | None:
        """The current client of a name (for tests and sensors)."""
        return self._clients.get(throttler_id)

    async def aclose(self) -> None:
        """Fail every waiting call and stop the clients (the transport is the caller's to close)."""
        for throttler_id, client in list(self._clients.items()):
            await client.aclose(_not_configured(throttler_id))
        for client in self._retired:
            await client.aclose(client.closed or _not_configured(client.throttler_id))
        self._clients.clear()
