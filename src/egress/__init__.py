"""egress: a Python stream processor for calling the outside world reliably.

The public API for process functions, in YTsaurus Flow's names (``docs/process-functions.md``).
"""

from egress.runtime.api import (
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

__all__ = [
    "ExternalRow",
    "ExternalStateClient",
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
