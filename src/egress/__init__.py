"""egress: a Python stream processor for calling the outside world reliably.

The public API for process functions, in YTsaurus Flow's names (``docs/process-functions.md``).
Each name is imported from its module when first used (:mod:`egress.lazy`), so ``import egress``
alone loads nothing else of egress, and a process function loads only what it names.
"""

from typing import TYPE_CHECKING

from egress.lazy import lazy_getattr

if TYPE_CHECKING:
    from egress.runtime.api import (
        IdentityMap,
        InitContext,
        MapFunction,
        Message,
        OutputCollector,
        ProcessFunction,
        RuntimeContext,
        Timer,
    )
    from egress.runtime.state import ExternalRow, ExternalStateClient, StateAccessor, StateClient
    from egress.throttler import ThrottlerHandle, ThrottlerNotConfiguredError
    from egress.version import __version__

_EXPORTS = {
    "IdentityMap": "egress.runtime.api",
    "InitContext": "egress.runtime.api",
    "MapFunction": "egress.runtime.api",
    "Message": "egress.runtime.api",
    "OutputCollector": "egress.runtime.api",
    "ProcessFunction": "egress.runtime.api",
    "RuntimeContext": "egress.runtime.api",
    "Timer": "egress.runtime.api",
    "ExternalRow": "egress.runtime.state",
    "ExternalStateClient": "egress.runtime.state",
    "StateAccessor": "egress.runtime.state",
    "StateClient": "egress.runtime.state",
    "ThrottlerHandle": "egress.throttler.factory",
    "ThrottlerNotConfiguredError": "egress.throttler.errors",
    "__version__": "egress.version",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)

__all__ = [
    "ExternalRow",
    "ExternalStateClient",
    "IdentityMap",
    "InitContext",
    "MapFunction",
    "Message",
    "OutputCollector",
    "ProcessFunction",
    "RuntimeContext",
    "StateAccessor",
    "StateClient",
    "ThrottlerHandle",
    "ThrottlerNotConfiguredError",
    "Timer",
    "__version__",
]
