"""The distributed throttler (Flow's): one global rate per named throttler, weighted quota classes,
lag priority, a controller with in-process and HTTP transports, and the prefetching client.

Layers, each its own module: :mod:`~egress.throttler.bucket` (token bucket, pure),
:mod:`~egress.throttler.scheduler` (SFQ over classes, pure), :mod:`~egress.throttler.queue` (one
throttler's waiting requests, pure), :mod:`~egress.throttler.controller` (one timer, live config),
:mod:`~egress.throttler.client` and :mod:`~egress.throttler.factory` (prefetch, stable handles),
:mod:`~egress.throttler.transport` / :mod:`~egress.throttler.http_transport` /
:mod:`~egress.throttler.service` (moving ``RequestQuota``), :mod:`~egress.throttler.throttling`
(what the runtime wires). See ``docs/throttler.md``.
"""

from typing import TYPE_CHECKING

from egress.lazy import lazy_getattr

if TYPE_CHECKING:
    from egress.throttler.controller import ThrottlerController
    from egress.throttler.errors import (
        ControllerClosedError,
        ControllerUnavailableError,
        QuotaAmountError,
        QuotaRequestFailedError,
        ThrottleInterruptedError,
        ThrottlerError,
        ThrottlerNotConfiguredError,
        UnknownThrottlerError,
    )
    from egress.throttler.factory import ThrottlerFactory, ThrottlerHandle
    from egress.throttler.models import ThrottlerSpec, validate_dynamic_throttlers, validate_throttlers
    from egress.throttler.throttling import THROTTLER_STATE_NAME, InputThrottle, Throttling

# Exported lazily (PEP 562): importing the package loads a submodule only when one of its names is used,
# so `import egress` does not pull in what a process function never touches.
_EXPORTS = {
    "ThrottlerController": "egress.throttler.controller",
    "ControllerClosedError": "egress.throttler.errors",
    "ControllerUnavailableError": "egress.throttler.errors",
    "QuotaAmountError": "egress.throttler.errors",
    "QuotaRequestFailedError": "egress.throttler.errors",
    "ThrottleInterruptedError": "egress.throttler.errors",
    "ThrottlerError": "egress.throttler.errors",
    "ThrottlerNotConfiguredError": "egress.throttler.errors",
    "UnknownThrottlerError": "egress.throttler.errors",
    "ThrottlerFactory": "egress.throttler.factory",
    "ThrottlerHandle": "egress.throttler.factory",
    "ThrottlerSpec": "egress.throttler.models",
    "validate_dynamic_throttlers": "egress.throttler.models",
    "validate_throttlers": "egress.throttler.models",
    "THROTTLER_STATE_NAME": "egress.throttler.throttling",
    "InputThrottle": "egress.throttler.throttling",
    "Throttling": "egress.throttler.throttling",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "THROTTLER_STATE_NAME",
    "ControllerClosedError",
    "ControllerUnavailableError",
    "InputThrottle",
    "QuotaAmountError",
    "QuotaRequestFailedError",
    "ThrottleInterruptedError",
    "ThrottlerController",
    "ThrottlerError",
    "ThrottlerFactory",
    "ThrottlerHandle",
    "ThrottlerNotConfiguredError",
    "ThrottlerSpec",
    "Throttling",
    "UnknownThrottlerError",
    "validate_dynamic_throttlers",
    "validate_throttlers",
]
