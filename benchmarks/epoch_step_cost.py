"""CPU of one epoch step per input message, without I/O: :class:`egress.runtime.epoch.EpochStep`'s
``invoke`` over one batch, for a ``MapFunction`` (the map path) and a ``ProcessFunction`` (the
general path), each emitting one row per message to a sink's stream.

Wall-clock time on a shared machine is noisy; run it under cachegrind for instructions, which
repeat whatever the load, with ``--messages 0`` and ``--messages N``: the difference over N is the
instructions per message (the interpreter's start and the imports cancel out); ``PYTHONPATH``
picks the tree::

    PYTHONHASHSEED=0 PYTHONPATH=src flock /work/wt/bench.lock valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null .venv/bin/python benchmarks/epoch_step_cost.py --path map --messages 20000

Without valgrind it prints the microseconds per message of the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from egress import MapFunction, Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.clock import VirtualClock
from egress.engines import LogMessage
from egress.keys import encode_key
from egress.runtime.epoch import EpochStep
from egress.runtime.invoke import Invoker
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue


class Doubles(MapFunction):
    output_stream_id = "out"

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        return {"n": row["n"] * 2}


class Emits(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"n": message.row["n"]})


def batch_of(messages: int) -> list[LogMessage]:
    return [LogMessage("input", 0, i, i.to_bytes(16, "big"), encode_key([i % 100]), None, {"n": i})
            for i in range(messages)]


async def seconds_per_message(function: Any, batch: list[LogMessage]) -> float:
    """One epoch step of ``batch`` through ``function``: seconds per message."""
    clock = VirtualClock(0)
    invoker = Invoker("c", function, RuntimeContext(clock, 0), StateStore(0, 1), TimerQueue(), ["out"])
    step = EpochStep(invoker, 0, 1, sink_streams={"out"}, logged_streams=frozenset(), positions={("input", 0): 0})
    started = time.perf_counter()
    output = await step.invoke(batch, [])
    assert output.messages == len(batch)
    return (time.perf_counter() - started) / max(1, len(batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--path", choices=["map", "process", "both"], default="both")
    arguments = parser.parse_args()
    batch = batch_of(arguments.messages)
    for name, function_class in (("map", Doubles), ("process", Emits)):
        if arguments.path not in (name, "both"):
            continue
        best = min(asyncio.run(seconds_per_message(function_class(), batch)) for _ in range(arguments.runs))
        print(f"{name}: {best * 1e6:.3f} µs per message ({arguments.messages} messages)")


if __name__ == "__main__":
    main()
