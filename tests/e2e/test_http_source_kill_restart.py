"""End to end: clients POST events to ``egress run``'s http source while it is SIGKILLed and restarted
5 times; no 200 is ever given for an event that is then lost: every event a client got 200 for
reaches the receiver."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from tests.e2e.conftest import REPO, RUN_HEADER, Receiver, wait_for_first_request
from tests.e2e.test_kill_restart import load_record

pytestmark = pytest.mark.e2e

KILLS = 5
KILL_DELAY = (0.05, 0.5)
CLIENTS = 8
SEED = int(os.environ.get("EGRESS_KILL_SEED", "20261201"))


class Clients:
    """``CLIENTS`` concurrent clients POSTing ``{"id": n, "payload": "event n"}`` (n unique) on their
    own thread and loop until :meth:`stop`; ``acknowledged`` are the ids answered 200. A request that
    fails (egress killed, not yet listening) is sent again later under a new id: its fate is unknown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: set[int] = set()
        self.next_id = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.acknowledged

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await asyncio.gather(*(self._client(session) for _ in range(CLIENTS)))

    async def _client(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            event_id, self.next_id = self.next_id, self.next_id + 1
            body = orjson.dumps({"id": event_id, "payload": f"event {event_id}"})
            try:
                async with session.post(self.url, data=body) as response:
                    if response.status == 200:
                        self.acknowledged.add(event_id)
                    else:
                        await asyncio.sleep(0.01)
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.02)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_spec(directory: Path, source_port: int, receiver_port: int, run: int) -> Path:
    spec = {
        "pipeline": "http_kill",
        "partition_count": 2,
        "streams": {
            "events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                       "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string"}]},
        },
        "sources": {"hooks": {"source_class_name": "http", "output_stream_id": "events",
                              "parameters": {"port": source_port}}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough",
            "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": f"http://127.0.0.1:{receiver_port}/events",
                                              "payload_column": "payload", "headers": {RUN_HEADER: str(run)}}}},
        }},
    }
    path = directory / f"spec-run{run}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(directory: Path, spec: Path, run: int, *options: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = directory / f"run{run}.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--state-dir",
                                    str(directory / "state"), "--quiet", *options],
                                   cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    return process, log


@pytest.mark.timeout(240)
def test_every_event_answered_200_arrives_across_five_sigkills(tmp_path: Path, receiver: Receiver) -> None:
    rng = random.Random(SEED)
    port = free_port()
    clients = Clients(f"http://127.0.0.1:{port}/events")
    clients.start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for run in range(KILLS):
            process, log = start(tmp_path, write_spec(tmp_path, port, receiver.port, run), run)
            processes.append(process)
            wait_for_first_request(receiver.record, run, process, log)
            time.sleep(rng.uniform(*KILL_DELAY))
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            assert process.returncode == -signal.SIGKILL, log.read_text()
        acknowledged = set(clients.stop())
        process, log = start(tmp_path, write_spec(tmp_path, port, receiver.port, KILLS), KILLS, "--until-drained")
        processes.append(process)
        assert process.wait(timeout=120) == 0, log.read_text()
    finally:
        clients.stop()
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    delivered = {r.body for r in load_record(receiver.record) if 200 <= r.status <= 299}
    want = {hashlib.sha256(f"event {i}".encode()).hexdigest(): i for i in acknowledged}
    lost = sorted(i for digest, i in want.items() if digest not in delivered)
    assert len(acknowledged) > 500
    assert not lost, f"{len(lost)} of {len(acknowledged)} events answered 200 never arrived, e.g. {lost[:5]}"
    print(f"\n{len(acknowledged)} events acknowledged, all delivered ({len(delivered)} distinct bodies)")
