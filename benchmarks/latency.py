"""Latency of the live inputs: an event into an idle pipeline until the HTTP sink's receiver has it.

For each input (``http``: a POST to the http source, answered 200 once committed; ``nats``: a
JetStream publish; ``follow``: a line appended to a followed file), one pipeline runs in this
process (SQLite state in a temporary folder, 2 partitions, the default ``epoch_period`` of 50 ms,
a pass-through function, the async HTTP sink) and ``--events`` events (default 200) are sent one at
a time: the next only once the receiver (an aiohttp endpoint in the same process) got the previous
one, so the pipeline is idle at each send. Printed: p50 and p99 of send → arrival, in ms. Starts its
own nats-server (stopped at the end) unless ``--url`` names one. Run from the repository root::

    python benchmarks/latency.py
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.nats_server import nats_url, stop_nats_server  # noqa: E402

from egress.runtime import Pipeline, load_plan  # noqa: E402


class Arrivals:
    """The receiving endpoint: when each payload arrived (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.arrived = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/events", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        self.times[(await request.read()).decode()] = time.perf_counter()
        self.arrived.set()
        return web.Response()

    async def wait(self, payload: str) -> float:
        while payload not in self.times:
            self.arrived.clear()
            await self.arrived.wait()
        return self.times[payload]


async def start_arrivals() -> tuple[Arrivals, web.AppRunner, str]:
    """The receiving endpoint, listening: ``(arrivals, runner to clean up, its URL)``."""
    arrivals = Arrivals()
    runner = web.AppRunner(arrivals.app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return arrivals, runner, f"http://127.0.0.1:{port}/events"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_spec(folder: Path, receiver: str, source: dict[str, Any]) -> tuple[Path, Path]:
    spec = {
        "pipeline": "latency", "partition_count": 2,
        "streams": {"events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                               "group_by": ["id"]},
                    "requests": {"schema": [{"name": "payload", "type": "string"}]}},
        "sources": {"input": {"output_stream_id": "events", **source}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough",
            "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": receiver, "payload_column": "payload"}}}}},
    }
    folder.mkdir(exist_ok=True)
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    (folder / "dynamic.yaml").write_text("{}\n")
    return folder / "spec.yaml", folder / "dynamic.yaml"


async def measure(name: str, folder: Path, receiver: str, arrivals: Arrivals, source: dict[str, Any],
                  send: Callable[[int, bytes], Awaitable[None]], events: int) -> list[float]:
    spec, dynamic = write_spec(folder, receiver, source)
    pipeline = Pipeline(load_plan(spec, dynamic), folder / "state")
    running = asyncio.create_task(pipeline.run())
    await asyncio.sleep(1.0)  # started and idle
    latencies = []
    try:
        for i in range(-5, events):  # 5 warm-up events
            payload = f"{name} {i}"
            started = time.perf_counter()
            await send(i, orjson.dumps({"id": i, "payload": payload}))
            arrived = await asyncio.wait_for(arrivals.wait(payload), 10)
            if i >= 0:
                latencies.append((arrived - started) * 1000)
    finally:
        pipeline.request_stop()
        result = await running
        assert result.ok, result.error
    quantiles = statistics.quantiles(latencies, n=100)
    print(f"{name}: p50 {statistics.median(latencies):.1f} ms, p99 {quantiles[98]:.1f} ms "
          f"({events} events, one at a time)", flush=True)
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--url", help="a running nats-server with JetStream (default: start one)")
    args = parser.parse_args()
    arrivals, runner, receiver = await start_arrivals()
    url = args.url or nats_url()
    try:
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory)
            async with aiohttp.ClientSession() as session:
                port = free_port()

                async def post(_: int, body: bytes) -> None:
                    async with session.post(f"http://127.0.0.1:{port}/events", data=body) as response:
                        assert response.status == 200, await response.text()

                await measure("http", root / "http", receiver, arrivals,
                              {"source_class_name": "http", "parameters": {"port": port}}, post, args.events)

            import nats

            client = await nats.connect(url)
            js = client.jetstream()
            stream = f"latency_{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])

            async def publish(_: int, body: bytes) -> None:
                await js.publish(f"{stream}.x", body)

            await measure("nats", root / "nats", receiver, arrivals,
                          {"source_class_name": "nats", "parameters": {"url": url, "stream": stream}}, publish,
                          args.events)
            await js.delete_stream(stream)
            await client.close()

            (root / "follow").mkdir()
            log = root / "follow" / "app.jsonl"
            log.touch()

            async def append(_: int, body: bytes) -> None:
                with log.open("ab") as file:
                    file.write(body + b"\n")

            await measure("follow", root / "follow", receiver, arrivals,
                          {"source_class_name": "jsonl", "parameters": {"path": str(log), "follow": True}}, append,
                          args.events)
    finally:
        await runner.cleanup()
        if args.url is None:
            stop_nats_server()


if __name__ == "__main__":
    asyncio.run(main())
