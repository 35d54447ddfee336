"""Ingest rate and cost of the live inputs beside a file, on the same pipeline, in one run.

The pipeline of ``benchmarks/latency.py`` (2 partitions, SQLite state, pass-through, async HTTP
sink) is fed ``--events`` events (default 20,000) by each input in turn. The sink's endpoint is
out of the egress process: nginx answering every POST ``200`` at once (``tests/nginx.py``), or,
without nginx, a Python endpoint in a process of its own. Measured per input:

* the rate: events from the feed's start until the source reader has committed all of them into
  the log (``egress_source_rows_total``);
* the CPU of the egress process per event from the feed's start until all of them are delivered
  to the endpoint (``egress_sink_records_delivered_total``): in to out, the whole relay;
* for ``http`` (and ``file`` beside it), an ``ingest only`` phase: the same pipeline but its
  computation drops every message (``tests.pipelines:Drops``), the CPU until all are in the log:
  what the source, its commits and the jobs reading the log cost, no delivery.

Inputs (``--inputs``, default all three):

* ``file``: a ``jsonl`` file of the events, read one-shot;
* ``http``: 64 concurrent clients POSTing one event each, a request only counting once answered
  200 (durable); the clients run in a process of their own (as a webhook relay's producers do), so
  their CPU is not the pipeline's; a ``429`` is sent again after a short pause (counted);
* ``nats``: the events published to a JetStream stream beforehand, read by the ``nats`` source.

Printed: events/s per input, the ratio to the file, CPU µs per event of the egress process and,
for ``http``, of the clients' process, and the load average (the figures of a shared machine are
only comparable within one run). Starts its own nats-server unless ``--url`` names one. With
``--profile FILE``, the ``http`` phase runs under cProfile (written to FILE; its CPU figure is then
the profiler's, not comparable). Run from the repository root::

    python benchmarks/ingest.py [--events N] [--inputs http] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.latency import free_port, write_spec  # noqa: E402
from tests.nats_server import nats_url, stop_nats_server  # noqa: E402
from tests.nginx import Nginx, answering_config, nginx_binary  # noqa: E402

from egress.runtime import Pipeline, load_plan  # noqa: E402

CLIENTS = 64


def event(i: int) -> bytes:
    return orjson.dumps({"id": i, "payload": f"event {i}"})


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def counted(counter: Any) -> float:
    """The sum of ``counter``'s ``_total`` samples over its labels: one family collected, not every
    sensor (``Metrics.total`` collects them all, about 1 ms of CPU a poll, which the egress process's
    CPU per event would count)."""
    return sum(sample.value for family in counter.collect() for sample in family.samples
               if sample.name.endswith("_total"))


def ingest_spec(folder: Path, receiver: str, source: dict[str, Any], deliver: bool = True,
                **changes: Any) -> tuple[Path, Path]:
    """``benchmarks/latency.py``'s Spec and dynamic Spec for ``source`` into ``folder``: its sink POSTs
    to ``receiver``; without ``deliver``, its computation drops every message (``tests.pipelines:Drops``);
    ``changes``: top-level keys of the Spec set (``partition_count=4``)."""
    spec, dynamic = write_spec(folder, receiver, source)
    if not deliver or changes:
        document = yaml.safe_load(spec.read_text())
        if not deliver:
            document["computations"]["deliver"]["processing_function"] = "tests.pipelines:Drops"
        document.update(changes)
        spec.write_text(yaml.safe_dump(document))
    return spec, dynamic


async def rate(name: str, folder: Path, receiver: str, source: dict[str, Any], events: int,
               feed: Callable[[], Awaitable[None]] | None = None, profile: str | None = None,
               deliver: bool = True) -> float:
    """Events/s from the pipeline's start (or ``feed``'s) until all ``events`` are in the log; CPU
    of this process until all are delivered (``deliver``), or, when the computation drops every
    message (``deliver=False``: the ingest alone), until all are in the log."""
    spec, dynamic = ingest_spec(folder, receiver, source, deliver)
    pipeline = Pipeline(load_plan(spec, dynamic), folder / "state")
    running = asyncio.create_task(pipeline.run())
    if feed is not None:
        await asyncio.sleep(1.0)  # listening
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
    started, cpu, clients_cpu = time.perf_counter(), time.process_time(), children_cpu()
    feeding = asyncio.create_task(feed()) if feed is not None else None
    while counted(pipeline.metrics.source_rows) < events:  # noqa: ASYNC110 - a counter, no event
        await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - started
    while deliver and counted(pipeline.metrics.sink.records.family) < events:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    cpu = time.process_time() - cpu
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
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


async def post_events(url: str, events: int, clients: int, keyed: bool = False) -> None:
    """``clients`` concurrent clients POST events ``0 .. events-1``, one per request, each until
    answered 200; a 429 is sent again after 50 ms. Prints the 429s to stderr. With ``keyed``, event
    ``i`` carries ``Idempotency-Key: event-i``."""
    numbers = iter(range(events))
    refused = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def client() -> None:
            nonlocal refused
            for i in numbers:
                headers = {"Idempotency-Key": f"event-{i}"} if keyed else None
                while True:
                    async with session.post(url, data=event(i), headers=headers) as response:
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
    parser.add_argument("--inputs", default="file,http,nats", help="comma-separated: file, http, nats")
    parser.add_argument("--profile", help="run the http phase under cProfile, its stats to this file")
    parser.add_argument("--post-to", help=argparse.SUPPRESS)  # the clients' process
    parser.add_argument("--keyed", action="store_true", help=argparse.SUPPRESS)  # its events with keys
    parser.add_argument("--answer-on", type=int, help=argparse.SUPPRESS)  # the endpoint's process, without nginx
    args = parser.parse_args()
    events = args.events
    inputs = set(args.inputs.split(","))
    if args.post_to:
        await post_events(args.post_to, events, CLIENTS, args.keyed)
        return
    if args.answer_on:
        await answer(args.answer_on)
        return
    url = args.url or nats_url() if "nats" in inputs else None
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        endpoint, receiver = start_endpoint(root / "endpoint")
        try:
            await measure(root, receiver, events, inputs, url, args.profile, figures)
        finally:
            stop_endpoint(endpoint)
            if "nats" in inputs and args.url is None:
                stop_nats_server()
    print("ingest: " + " | ".join(f"{name} {value:,.0f} events/s"
                                  + (f" ({value / figures['file']:.2f}x file)" if "file" in figures else "")
                                  for name, value in figures.items()))


def start_endpoint(folder: Path) -> tuple[Nginx | subprocess.Popen[bytes], str]:
    """The sink's endpoint in another process: nginx answering 200, else this script's ``--answer-on``."""
    port = free_port()
    if nginx_binary() is not None:
        return Nginx(folder, port, answering_config(port)).start(), f"http://127.0.0.1:{port}/events"
    print("nginx is not installed: the endpoint is a Python process (apt-get install nginx for the figures "
          "of docs/benchmarks.md)", file=sys.stderr)
    process = subprocess.Popen([sys.executable, __file__, "--answer-on", str(port)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    return process, f"http://127.0.0.1:{port}/events"


def stop_endpoint(endpoint: Nginx | subprocess.Popen[bytes]) -> None:
    if isinstance(endpoint, Nginx):
        endpoint.stop()
    else:
        endpoint.terminate()
        endpoint.wait(10)


async def answer(port: int) -> None:
    """An endpoint answering every POST 200 (the fallback without nginx), until terminated."""
    from aiohttp import web

    async def receive(request: web.Request) -> web.Response:
        await request.read()
        return web.Response()

    app = web.Application()
    app.router.add_post("/events", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def measure(root: Path, receiver: str, events: int, inputs: set[str], url: str | None, profile: str | None,
                  figures: dict[str, float]) -> None:
    """The phases named in ``inputs``, their events/s into ``figures``."""
    if "file" in inputs:
        data = root / "events.jsonl"
        data.write_bytes(b"".join(event(i) + b"\n" for i in range(events)))
        figures["file"] = await rate("file", root / "file", receiver,
                                     {"source_class_name": "jsonl", "parameters": {"path": str(data)}}, events)
    if "http" in inputs:

        port = free_port()

        async def post_all() -> None:
            clients = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--post-to", f"http://127.0.0.1:{port}/events", "--events", str(events))
            assert await clients.wait() == 0, "the clients failed"

        figures["http"] = await rate("http", root / "http", receiver,
                                     {"source_class_name": "http", "parameters": {"port": port}}, events, post_all,
                                     profile)
        if "file" in inputs:
            await rate("file, ingest only", root / "file-ingest", receiver,
                       {"source_class_name": "jsonl", "parameters": {"path": str(root / "events.jsonl")}}, events,
                       deliver=False)
        await rate("http, ingest only", root / "http-ingest", receiver,
                   {"source_class_name": "http", "parameters": {"port": port}}, events, post_all, deliver=False)
    if "nats" in inputs:
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


if __name__ == "__main__":
    asyncio.run(main())
