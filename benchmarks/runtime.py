"""Runtime throughput: a stateful process function and timers, on one core, committed to SQLite.

What is measured, in one process pinned to one CPU (``os.sched_setaffinity``), with full durability
(SQLite ``synchronous=FULL``, the default):

1. ``stateful``: all 336,776 flights of ``data/flights-2013.csv.gz`` are first read into the log by
   the csv source (timed separately as ``ingest``); then a pipeline whose only computation is
   :class:`TailnumCounter` (a keyed counter in internal state, keyed by ``tailnum``, one partition)
   processes them. The figure is messages / wall time of that second run: reading the log, calling
   the function, serialising the touched state and committing state, positions and epochs.
   The totals are checked against a plain ``collections.Counter`` of the CSV.
2. ``timers``: the retryable async request example (``examples/retryable_async_request``) with
   ``--requests`` events (default 100,000) on the virtual clock (the 5 s retry delay costs no wall
   time), two partitions. Two thirds of the requests fail once or twice and retry on a timer.
   Reported: timers fired / wall time of the whole run (every message and timer of both
   computations included) and the request rate; the totals are checked.

The last line is one comparable summary::

    runtime: stateful 40,000 msg/s (336,776 flights, ingest 60,000 rows/s) | timers 20,000 fired/s ...

Run it from the repository root (figures: ``docs/benchmarks.md``)::

    python benchmarks/runtime.py
    python benchmarks/runtime.py --requests 20000 --flights 100000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import gzip
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from egress import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext  # noqa: E402
from egress.clock import VirtualClock  # noqa: E402
from egress.engines.sqlite import read_state  # noqa: E402
from egress.runtime import Pipeline, RunOptions, load_plan  # noqa: E402

FLIGHTS = REPO / "data" / "flights-2013.csv.gz"
RETRYABLE = REPO / "examples" / "retryable_async_request"


@dataclass
class Count:
    flights: int = 0


class TailnumCounter(ProcessFunction):
    """Counts flights per key (``tailnum``) in internal state ``count``."""

    def init(self, ctx: InitContext) -> None:
        self.count = ctx.state_client("count", Count)

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        self.count.get(message.key).value.flights += 1


def flights_spec(directory: Path, data: Path, with_counter: bool) -> Path:
    example = yaml.safe_load((REPO / "examples" / "http_delivery" / "spec.yaml").read_text())
    flights = example["streams"]["flights"]
    flights["group_by"] = ["tailnum"]
    spec = {"pipeline": "runtime_benchmark", "partition_count": 1, "streams": {"flights": flights},
            "sources": {"flights_csv": {"source_class_name": "csv", "output_stream_id": "flights",
                                        "parameters": {"path": str(data)}}}}
    if with_counter:
        spec["computations"] = {"count": {"processing_function": "benchmarks.runtime:TailnumCounter",
                                          "input_stream_ids": ["flights"]}}
    path = directory / ("spec.yaml" if with_counter else "ingest.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def limited_flights(directory: Path, count: int | None) -> tuple[Path, collections.Counter[str | None]]:
    """The flights file (or its first ``count`` rows) and the expected count per tailnum."""
    expected: collections.Counter[str | None] = collections.Counter()
    with gzip.open(FLIGHTS, "rt", newline="") as text:
        rows = csv.DictReader(text)
        for n, row in enumerate(rows):
            if count is not None and n >= count:
                break
            expected[None if row["tailnum"] in ("", "NA") else row["tailnum"]] += 1
    if count is None:
        return FLIGHTS, expected
    path = directory / "flights.csv.gz"
    with gzip.open(FLIGHTS, "rt", newline="") as source, gzip.open(path, "wt", newline="") as target:
        for n, line in enumerate(source):
            if n > count:
                break
            target.write(line)
    return path, expected


async def stateful(directory: Path, count: int | None) -> tuple[int, float, float]:
    data, expected = limited_flights(directory, count)
    state = directory / "flights-state"
    started = time.perf_counter()
    result = await Pipeline(load_plan(flights_spec(directory, data, False)), state,
                            options=RunOptions(until_drained=True)).run()
    ingest = time.perf_counter() - started
    assert result.ok, result
    started = time.perf_counter()
    result = await Pipeline(load_plan(flights_spec(directory, data, True)), state,
                            options=RunOptions(until_drained=True)).run()
    elapsed = time.perf_counter() - started
    assert result.ok, result
    counted = {json.loads(key)[0]: json.loads(value)["flights"] for _, _, key, value in read_state(state)["internal"]}
    assert counted == dict(expected), "the counts differ from the CSV"
    return sum(expected.values()), ingest, elapsed


async def timers(directory: Path, requests: int) -> tuple[int, int, float]:
    events = directory / "events.jsonl"
    expected: collections.Counter[str] = collections.Counter()
    with events.open("w") as out:
        for i in range(requests):
            key, data = f"user-{i % 1000}", "x" * (i % 50 + 1)
            expected[key] += len(data)
            out.write(json.dumps({"key": key, "data": data}) + "\n")
    spec = yaml.safe_load((RETRYABLE / "spec.yaml").read_text())
    spec["sources"]["events"]["parameters"]["path"] = str(events)
    path = directory / "retryable.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    clock = VirtualClock(1_800_000_000.0)
    pipeline = Pipeline(load_plan(path), directory / "retryable-state", clock=clock,
                        options=RunOptions(until_drained=True))
    started = time.perf_counter()
    async with clock.autojumping():
        result = await pipeline.run()
    elapsed = time.perf_counter() - started
    assert result.ok, result
    totals = {json.loads(k)[0]: json.loads(v)["total_length"] for _, _, k, v in
              read_state(directory / "retryable-state")["external"]}
    assert totals == dict(expected), "the totals differ from the requests"
    fired = int(pipeline.metrics.value("egress_computation_timers_fired_total"))
    return requests, fired, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flights", type=int, default=None, help="only the first N flights (default: all)")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="egress-runtime-bench-") as temporary:
        directory = Path(temporary)
        flights, ingest, elapsed = asyncio.run(stateful(directory, args.flights))
        print(f"stateful: {flights:,} flights counted by tailnum in {elapsed:.2f} s = {flights / elapsed:,.0f} msg/s "
              f"(ingest into the log before: {ingest:.2f} s = {flights / ingest:,.0f} rows/s)", flush=True)
        requests, fired, seconds = asyncio.run(timers(directory, args.requests))
        print(f"timers: {requests:,} requests, {fired:,} timers fired in {seconds:.2f} s = {fired / seconds:,.0f} "
              f"timers/s, {requests / seconds:,.0f} requests/s end to end", flush=True)
    print(f"runtime: stateful {flights / elapsed:,.0f} msg/s ({flights:,} flights, ingest {flights / ingest:,.0f} "
          f"rows/s) | timers {fired / seconds:,.0f} fired/s ({fired:,} timers, {requests:,} requests, "
          f"{requests / seconds:,.0f} requests/s) | one core, SQLite synchronous=FULL")


if __name__ == "__main__":
    main()
