"""egress: a Python stream processor for calling the outside world reliably.

The public API for process functions, in YTsaurus Flow's names.
"""

from egress.runtime.api import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext, Timer

__version__ = "0.1.0"

__all__ = ["InitContext", "Message", "OutputCollector", "ProcessFunction", "RuntimeContext", "Timer", "__version__"]
