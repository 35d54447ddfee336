"""The runtime: plans, partition jobs, epochs, the pipeline runner and its hosts (embedded, cluster)."""

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
    from egress.runtime.hosts import RunResult
    from egress.runtime.options import RunOptions
    from egress.runtime.pipeline import EngineFactory, Pipeline
    from egress.runtime.plan import Plan, build_plan, load_plan

# Exported lazily (PEP 562): importing the package loads a submodule only when one of its names is used,
# so `import egress` does not pull in what a process function never touches.
_EXPORTS = {
    "IdentityMap": "egress.runtime.api",
    "InitContext": "egress.runtime.api",
    "MapFunction": "egress.runtime.api",
    "Message": "egress.runtime.api",
    "OutputCollector": "egress.runtime.api",
    "ProcessFunction": "egress.runtime.api",
    "RuntimeContext": "egress.runtime.api",
    "Timer": "egress.runtime.api",
    "RunOptions": "egress.runtime.options",
    "EngineFactory": "egress.runtime.pipeline",
    "Pipeline": "egress.runtime.pipeline",
    "RunResult": "egress.runtime.hosts",
    "Plan": "egress.runtime.plan",
    "build_plan": "egress.runtime.plan",
    "load_plan": "egress.runtime.plan",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "EngineFactory",
    "IdentityMap",
    "InitContext",
    "MapFunction",
    "Message",
    "OutputCollector",
    "Pipeline",
    "Plan",
    "ProcessFunction",
    "RunOptions",
    "RunResult",
    "RuntimeContext",
    "Timer",
    "build_plan",
    "load_plan",
]
