"""``egress run`` with the firehose_http sink, killed with SIGKILL while its batches are being retried,
then run again to the end: every record arrives, and every batch keeps its request id across the kill.

Batch boundaries here are deterministic: 300,000-byte records and a 1 MiB size hint close a batch of
three when the fourth record arrives, all records are committed within moments, and only the last
batch waits for the 3 s interval; that is what makes the request id stable across a restart today
(docs/firehose.md, "What remains"). The receiver refuses every request (503) until the kill, so the
run that is killed acknowledges nothing and the restart re-forms the same batches from the same
committed outbox. Requests of the killed run still in the receiver's socket may be handled after
the kill: duplicates under the same request id, which is what the id is for.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from aiohttp import web

import egress.connectors.sinks.firehose_http  # noqa: F401  (registers firehose_http in the test process too)
from egress.firehose import FirehoseReceiver, TransientError
from tests.conftest import REPO, payload_spec
from tests.pipelines import Passthrough

pytestmark = pytest.mark.integration

RECORDS = 30
RECORD_BYTES = 300_000


class RegisteringPassthrough(Passthrough):
    """tests.pipelines.Passthrough; importing this module registers the firehose_http sink in ``egress run``
    (the plan imports a computation's function before it looks up its sinks)."""


class Endpoint:
    """Records every call; answers 503 until ``healed``."""

    def __init__(self) -> None:
        self.healed = False
        self.calls: list[tuple[str, tuple[bytes, ...], bool]] = []

    async def __call__(self, request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        self.calls.append((request_id, tuple(records), self.healed))
        if not self.healed:
            raise TransientError("not yet")


def egress_run(spec: Path, dynamic: Path, state: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                             "--state-dir", str(state), "--quiet", *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


async def test_request_ids_survive_a_sigkill(tmp_path: Path) -> None:
    endpoint = Endpoint()
    runner = web.AppRunner(FirehoseReceiver(endpoint).app, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    payloads: list[str | None] = [f"{i:06d}".ljust(RECORD_BYTES, "x") for i in range(RECORDS)]
    spec, dynamic = payload_spec(tmp_path, url, payloads)
    document = yaml.safe_load(spec.read_text())
    computation = document["computations"]["deliver"]
    computation["processing_function"] = f"{__name__}:RegisteringPassthrough"
    parameters = {"url": url, "payload_column": "payload", "stream_name": "flights", "retry_duration": 7200,
                  "buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 3}}
    computation["sinks"]["http"] = {"sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
                                    "parameters": parameters}
    spec.write_text(yaml.safe_dump(document))
    dynamic.write_text(yaml.safe_dump({"computations": {"deliver": {"sinks": {"http": {"parameters": {
        "retry_initial_delay": "50ms", "retry_maximum_delay": "100ms"}}}}}}))
    state = tmp_path / "state"
    started: list[subprocess.Popen[bytes]] = []
    try:
        first = egress_run(spec, dynamic, state)
        started.append(first)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while not (len({c[0] for c in endpoint.calls}) >= 2
                   and any(sum(1 for c in endpoint.calls if c[0] == rid) >= 2 for rid, _, _ in endpoint.calls)):
            assert first.poll() is None, first.stderr.read() if first.stderr else b""
            assert loop.time() < deadline, "the first run never reached the endpoint twice"
            await asyncio.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 30)
        endpoint.healed = True
        before = {rid for rid, _, healed in endpoint.calls}

        second = egress_run(spec, dynamic, state, "--until-drained")
        started.append(second)
        code = await asyncio.to_thread(second.wait, int(os.environ.get("FH_KILL_TIMEOUT", "120")))
        assert code == 0, second.stderr.read() if second.stderr else b""
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait, 30)
        await runner.cleanup()

    records_of: dict[str, set[tuple[bytes, ...]]] = defaultdict(set)
    for rid, records, _ in endpoint.calls:
        records_of[rid].add(records)
    assert all(len(variants) == 1 for variants in records_of.values()), "a request id carried two batches"
    after = {rid for rid, _, healed in endpoint.calls if healed}
    assert len(after) == RECORDS // 3
    delivered = sorted(r for rid in after for records in records_of[rid] for r in records)
    assert delivered == sorted(p.encode() for p in payloads if p is not None)
    assert before <= after, "a batch attempted before the kill came back under another request id"
