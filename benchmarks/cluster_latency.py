"""End-to-end latency of a cluster worker whose NATS server is ``rtt`` away (``benchmarks/cluster.py
--rtt-ms``): one event at a time into an idle pipeline, from its line appended to a followed JSONL
file until the HTTP endpoint has it.

The pipeline is ``benchmarks/cluster.py``'s (the embedded phase's Spec: 4 partitions, the
pass-through function, the async HTTP sink with default parameters) with its source following a
new file, one worker (``egress run SPEC --engine <proxy> --worker-id w1``) reaching a fresh
nats-server through a :class:`~tests.delay_proxy.DelayProxy`, and the endpoint an aiohttp server
in this process that notes when each event's POST arrived (its body is the event's number). The
next event is appended only once the previous one arrived, so each one meets an idle pipeline: the
time is the path's (the followed file's poll, the source reader's commit, the job's read, its commit,
the POST), not a queue's. The first events warm the path up (the worker joins and takes its units
meanwhile) and are not counted.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import yaml
from aiohttp import web

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.delay_proxy import DelayProxy  # noqa: E402
from tests.nats_server import NatsServer  # noqa: E402

WARM_UP = 20  # events sent and waited for before the measured ones
FIRST_TIMEOUT = 120.0  # seconds for the first event: the worker starts, joins and takes its units
EVENT_TIMEOUT = 30.0  # seconds for each later one


class ArrivalReceiver:
    """An aiohttp endpoint on 127.0.0.1 (a thread of its own) answering 200 to every POST and
    noting ``time.perf_counter()`` at the arrival of each body (an event number)."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="arrivals")
        self.url = ""

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)

    async def _serve(self) -> None:
        async def post(request: web.Request) -> web.Response:
            body = await request.read()
            with self._changed:
                self.arrived.setdefault(int(body), time.perf_counter())
                self._changed.notify_all()
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/events", post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/events"

    def wait_for(self, number: int, timeout: float) -> float:
        """The arrival time of event ``number``; raises ``RuntimeError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while number not in self.arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"event {number} did not arrive within {timeout:g} s")
                self._changed.wait(left)
            return self.arrived[number]

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


def latency_spec(work: Path, phase: Path, url: str) -> tuple[Path, Path]:
    """The embedded phase's Spec following ``phase/live.jsonl`` and posting to ``url``: (Spec, file)."""
    spec = yaml.safe_load((work / "embedded" / "spec.yaml").read_text())
    spec["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"] = url
    live = phase / "live.jsonl"
    live.write_bytes(b"")
    spec["sources"]["payloads"]["parameters"] = {"path": str(live), "follow": True}
    path = phase / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(work / "embedded" / "functions.py", phase / "functions.py")
    return path, live


def run_latency(work: Path, rtt: float, events: int) -> list[float]:
    """Seconds from append to arrival of ``events`` events, one at a time, with the NATS server
    ``rtt`` seconds of round trip away (see the module docs)."""
    phase = work / f"latency-rtt{rtt * 1e3:g}ms"
    shutil.rmtree(phase, ignore_errors=True)
    phase.mkdir(parents=True)
    receiver = ArrivalReceiver()
    receiver.start()
    server = NatsServer(phase / "nats").start()
    proxy = DelayProxy(server.port, rtt / 2)
    proxy.start()
    spec, live = latency_spec(work, phase, receiver.url)
    log = open(phase / "w1.log", "wb")  # noqa: SIM115 - closed below, after the process ends
    worker = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--engine", proxy.url,
                               "--worker-id", "w1", "--state-dir", str(phase / "state-w1"), "--quiet"],
                              cwd=phase, stdout=log, stderr=subprocess.STDOUT)
    latencies: list[float] = []
    try:
        with open(live, "ab", buffering=0) as out:
            for number in range(WARM_UP + events):
                sent = time.perf_counter()
                out.write(b'{"id":%d,"payload":%s}\n' % (number, orjson.dumps(str(number))))
                arrived = receiver.wait_for(number, FIRST_TIMEOUT if number == 0 else EVENT_TIMEOUT)
                if number >= WARM_UP:
                    latencies.append(arrived - sent)
    finally:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(worker.pid, 9)
                worker.wait()
        log.close()
        proxy.stop()
        server.stop()
        receiver.stop()
    return latencies


def describe_latency(rtt: float, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"latency rtt {rtt * 1e3:g} ms: {len(latencies)} events one at a time, append → arrival p50 "
            f"{statistics.median(latencies) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms")
