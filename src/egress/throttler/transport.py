"""How a client reaches the controller: the :class:`QuotaTransport` seam and the in-process transport.

A transport moves one ``RequestQuota`` call. It raises :class:`ControllerUnavailableError` when the
controller cannot be reached or does not answer within ``rpc_timeout`` (the client retries those), and
the controller's own errors (:class:`UnknownThrottlerError`, :class:`QuotaAmountError`) as they are.
HTTP lives in :mod:`egress.throttler.http_transport`; NATS comes with the scale-out issue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from egress.clock import Clock
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import ControllerClosedError, ControllerUnavailableError

T = TypeVar("T")


class QuotaTransport(Protocol):
    """Carries ``RequestQuota{throttler_id, client_id, amount, timestamp, quota_class_id, hold}``."""

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        """Return once ``amount`` units are granted; ``rpc_timeout`` seconds at most (then
        :class:`ControllerUnavailableError`, and the controller refunds the request).

        Returns the :class:`Grant` with its deadline on the caller's ``clock.monotonic()``: never
        later than the lease end the controller counted (``hold`` asks for a lease, in seconds).
        ``request_id``: the same for every attempt of one request of the client, so the controller
        replaces a copy of it still waiting instead of queueing a second one.
        """
        ...

    def withdraw(self, request_id: str) -> None:
        """Tell the controller, without waiting, that the client gave request ``request_id`` up
        (its caller was cancelled), so a copy of it still waiting there is refunded at once."""
        ...

    async def aclose(self) -> None:
        ...


async def with_timeout(clock: Clock, awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``awaitable`` for at most ``seconds`` on ``clock``; on expiry cancel it and raise
    :class:`ControllerUnavailableError` naming ``what``."""
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        done, _ = await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        timer.cancel()
        raise
    if task in done:
        timer.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ControllerUnavailableError(f"{what} timed out after {seconds:g} s")


class InProcessTransport:
    """Calls a :class:`ThrottlerController` in the same event loop (``egress run``'s default).

    ``controller`` may be replaced (a restarted controller); a closed one is reported as
    unreachable, like the HTTP service's ``503``, so clients retry until the next one answers.
    """

    def __init__(self, controller: ThrottlerController) -> None:
        self.controller = controller

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        """The controller's grant as it is: the client shares the controller's clock."""
        try:
            return await with_timeout(self.controller.clock,
                                      self.controller.request_quota(throttler_id, amount, timestamp=timestamp,
                                                                    quota_class_id=quota_class_id, client_id=client_id,
                                                                    hold=hold, request_id=request_id),
                                      rpc_timeout, f'RequestQuota to throttler "{throttler_id}"')
        except ControllerClosedError as error:
            raise ControllerUnavailableError(str(error)) from None

    def withdraw(self, request_id: str) -> None:
        """Nothing to send: cancelling the call cancelled (and refunded) the request."""

    async def aclose(self) -> None:
        return None
