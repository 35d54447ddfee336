"""Ingest rate of the live inputs beside a file, on the same pipeline, in one run.

The pipeline of ``benchmarks/latency.py`` (2 partitions, SQLite state, pass-through, async HTTP
sink to an in-process endpoint that answers 200 at once) is fed ``--events`` events (default
20,000) by each input in turn, and the time until the source reader has committed all of them
into the log (``egress_source_rows_total``) is measured:

* ``file``: a ``jsonl`` file of the events, read one-shot;
* ``http``: 64 concurrent clients POSTing one event each, a request only counting once answered
  200 (durable); the clients run in a process of their own (as a webhook relay's producers do), so
  their CPU is not the pipeline's; a ``429`` is sent again after a short pause (counted);
* ``nats``: the events published to a JetStream stream beforehand, read by the ``nats`` source.

Printed: events/s per input, the ratio to the file, CPU µs per event of this process (the pipeline
and the in-process endpoint) and, for ``http``, of the clients' process, and the load average (the
figures of a shared machine are only comparable within one run). Starts its own nats-server unless
``--url`` names one. Run from the repository root::

    python benchmarks/ingest.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.latency import free_port, start_arrivals, write_spec  # noqa: E402
from tests.nats_server import nats_url, stop_nats_server  # noqa: E402

from egress.runtime import Pipeline, load_plan  # noqa: E402

CLIENTS = 64


def event(i: int) -> bytes:
    return orjson.dumps({"id": i, "payload": f"event {i}"})


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def rate(name: str, folder: Path, receiver: str, source: dict[str, Any], events: int,
               feed: Callable[[], Awaitable[None]] | None = None) -> float:
    """Events/s from the pipeline's start (or ``feed``'s) until all ``events`` are in the log."""
    spec, dynamic = write_spec(folder, receiver, source)
    pipeline = Pipeline(load_plan(spec, dynamic), folder / "state")
    running = asyncio.create_task(pipeline.run())
    if feed is not None:
        await asyncio.sleep(1.0)  # listening
    started, cpu, clients_cpu = time.perf_counter(), time.process_time(), children_cpu()
    feeding = asyncio.create_task(feed()) if feed is not None else None
    while pipeline.metrics.total("egress_source_rows_total") < events:  # noqa: ASYNC110 - a counter, no event
        await asyncio.sleep(0.01)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if feeding is not None:
        await feeding
    clients_cpu = children_cpu() - clients_cpu
    pipeline.request_stop()
    result = await running
    assert result.ok, result.error
    clients = f", clients {clients_cpu / events * 1e6:,.0f} µs CPU per event" if clients_cpu else ""
    print(f"{name}: {events / elapsed:,.0f} events/s ({events:,} in {elapsed:.2f} s; egress {cpu / events * 1e6:,.0f} "
          f"µs CPU per event{clients}; load average {os.getloadavg()[0]:.1f})", flush=True)
    return events / elapsed


async def post_events(url: str, events: int, clients: int) -> None:
    """``clients`` concurrent clients POST events ``0 .. events-1``, one per request, each until
    answered 200; a 429 is sent again after 50 ms. Prints the 429s to stderr."""
    numbers = iter(range(events))
    refused = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def client() -> None:
            nonlocal refused
            for i in numbers:
                while True:
                    async with session.post(url, data=event(i)) as response:
                        if response.status == 200:
                            break
                        assert response.status == 429, await response.text()
                    refused += 1
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(clients)))
    if refused:
        print(f"http: {refused:,} POSTs answered 429 and sent again", file=sys.stderr)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--url", help="a running nats-server with JetStream (default: start one)")
    parser.add_argument("--post-to", help=argparse.SUPPRESS)  # the clients' process
    args = parser.parse_args()
    events = args.events
    if args.post_to:
        await post_events(args.post_to, events, CLIENTS)
        return
    _, runner, receiver = await start_arrivals()
    url = args.url or nats_url()
    figures: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory)
            data = root / "events.jsonl"
            data.write_bytes(b"".join(event(i) + b"\n" for i in range(events)))
            figures["file"] = await rate("file", root / "file", receiver,
                                         {"source_class_name": "jsonl", "parameters": {"path": str(data)}}, events)

            port = free_port()

            async def post_all() -> None:
                clients = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--post-to", f"http://127.0.0.1:{port}/events", "--events", str(events))
                assert await clients.wait() == 0, "the clients failed"

            figures["http"] = await rate("http", root / "http", receiver,
                                         {"source_class_name": "http", "parameters": {"port": port}}, events, post_all)

            import nats

            client = await nats.connect(url)
            js = client.jetstream()
            stream = f"ingest_{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            acks = [await js.publish(f"{stream}.x", event(i)) for i in range(events)]
            assert len(acks) == events
            figures["nats"] = await rate("nats", root / "nats", receiver,
                                         {"source_class_name": "nats", "parameters": {"url": url, "stream": stream}},
                                         events)
            await js.delete_stream(stream)
            await client.close()
    finally:
        await runner.cleanup()
        if args.url is None:
            stop_nats_server()
    print("ingest: " + " | ".join(f"{name} {value:,.0f} events/s ({value / figures['file']:.2f}x file)"
                                  for name, value in figures.items()))


if __name__ == "__main__":
    asyncio.run(main())
