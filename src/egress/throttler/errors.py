"""Errors of the distributed throttler, with upstream's message texts."""

from __future__ import annotations

from egress.errors import EgressError


class ThrottlerError(EgressError):
    """Base class of throttler errors."""


class QuotaAmountError(ThrottlerError, ValueError):
    """``Quota amount must be non-negative, got N`` (upstream RequestQuota validation)."""


class UnknownThrottlerError(ThrottlerError, KeyError):
    """``Unknown throttler "X"``: the controller has no throttler of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ThrottlerNotConfiguredError(ThrottlerError):
    """``Throttler "X" is not configured for this client``: the name was removed from the DynamicSpec."""


class ThrottleInterruptedError(ThrottlerError):
    """Raised by a process function's ``await handle.throttle(...)`` when its job is asked to stop
    while the call waits for quota (Ctrl-C, SIGTERM, the partition moving to another worker). The
    job then discards the epoch (nothing of its batch is committed: whoever runs the partition next
    processes it again) and commits what its sinks acknowledged. Let it propagate; the job discards
    the epoch also when the function catches it."""


class ControllerUnavailableError(ThrottlerError):
    """The throttler controller did not answer (connection refused, timeout); retried by the client."""


class ControllerClosedError(ThrottlerError):
    """``the throttler controller is closed``: raised by a controller that stopped (a shutdown, or a
    restart on its way); transports report it as :class:`ControllerUnavailableError`."""


class RequestWithdrawnError(ThrottlerError):
    """Raised to a waiting ``RequestQuota`` that its client withdrew: it asked again with the same
    ``request_id`` (the new copy takes its place) or said it gave up. Nobody waits for its answer."""


class QuotaRequestFailedError(ThrottlerError):
    """``RequestQuota`` failed for good: past the retry budget, or rejected by the controller."""
