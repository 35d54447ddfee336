"""The runtime: plans, partition jobs, epochs and the embedded pipeline runner."""

from egress.runtime.api import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.runtime.options import RunOptions
from egress.runtime.pipeline import EngineFactory, Pipeline, RunResult
from egress.runtime.plan import Plan, build_plan, load_plan

__all__ = [
    "EngineFactory",
    "InitContext",
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
