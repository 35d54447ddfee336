"""Ingest rate of the live inputs beside a file, on the same pipeline, in one run.

The pipeline of ``benchmarks/latency.py`` (2 partitions, SQLite state, pass-through, async HTTP
sink to an in-process endpoint that answers 200 at once) is fed ``--events`` events (default
20,000) by each input in turn, and the time until the source reader has committed all of them
into the log (``egress_source_rows_total``) is measured:

* ``file``: a ``jsonl`` file of the events, read one-shot;
* ``http``: 64 concurrent clients POSTing one event each, a request only counting once answered
  200 (durable);
* ``nats``: the events published to a JetStream stream beforehand, read by the ``nats`` source.

Printed: events/s per input, and the ratio to the file. Starts its own nats-server unless ``--url``
names one. Run from the repository root::

    python benchmarks/ingest.py
"""

from __future__ import annotations

import argparse
import asyncio
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


async def rate(name: str, folder: Path, receiver: str, source: dict[str, Any], events: int,
               feed: Callable[[], Awaitable[None]] | None = None) -> float:
    """Events/s from the pipeline's start (or ``feed``'s) until all ``events`` are in the log."""
    spec, dynamic = write_spec(folder, receiver, source)
    pipeline = Pipeline(load_plan(spec, dynamic), folder / "state")
    running = asyncio.create_task(pipeline.run())
    if feed is not None:
        await asyncio.sleep(1.0)  # listening
    started = time.perf_counter()
    feeding = asyncio.create_task(feed()) if feed is not None else None
    while pipeline.metrics.total("egress_source_rows_total") < events:  # noqa: ASYNC110 - a counter, no event
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    if feeding is not None:
        await feeding
    pipeline.request_stop()
    result = await running
    assert result.ok, result.error
    print(f"{name}: {events / elapsed:,.0f} events/s ({events:,} in {elapsed:.2f} s)", flush=True)
    return events / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--url", help="a running nats-server with JetStream (default: start one)")
    args = parser.parse_args()
    events = args.events
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
                numbers = iter(range(events))
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as session:
                    async def client() -> None:
                        for i in numbers:
                            async with session.post(f"http://127.0.0.1:{port}/events", data=event(i)) as response:
                                assert response.status == 200, await response.text()

                    await asyncio.gather(*(client() for _ in range(CLIENTS)))

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
