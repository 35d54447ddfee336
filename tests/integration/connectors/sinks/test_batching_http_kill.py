"""``egress run`` with the batching_http sink, killed with SIGKILL, then run again to the end: nothing is
lost, and a duplicate is only ever a whole batch again, under the same ``Idempotency-Key``.

Two cases. In the first the endpoint answers 503 until the kill, so the killed run acknowledges
nothing while its batches are retried; before the restart, rows are appended to the input and
``max_events`` is lowered: only the committed batch boundaries (``sink_state``) make the restart send
each batch attempted before the kill again with the same records and key, rather than batches
re-formed with the new bound. In the second the endpoint answers 200 (slowly) and the run is killed
twice mid-delivery: a batch delivered twice is the same batch, and every record arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import yaml
from aiohttp import web

from tests.conftest import REPO, payload_spec
from tests.subprocesses import exits_zero, kill
from tests.waiting import eventually, exited

pytestmark = pytest.mark.integration


@dataclass
class Endpoint:
    """Records every POST as (key, body, run number); answers 503 until ``healed``, after ``delay`` s."""

    healed: bool = False
    delay: float = 0.0
    run: int = 0
    calls: list[tuple[str, bytes, int]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append((request.headers["Idempotency-Key"], await request.read(), self.run))
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=200 if self.healed else 503, text="ok")


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, str]]:
    found = Endpoint()
    app = web.Application()
    app.router.add_post("/bulk", found.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield found, f"http://127.0.0.1:{runner.addresses[0][1]}/bulk"
    await runner.cleanup()


def egress_run(spec: Path, dynamic: Path, state: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                             "--state-dir", str(state), "--quiet", *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def batching_spec(tmp_path: Path, url: str, payloads: list[str | None], **parameters: object) -> tuple[Path, Path]:
    """The payload spec of tests.conftest with the batching_http sink (JSON lines) and retries that
    go on for as long as the test needs."""
    spec, dynamic = payload_spec(tmp_path, url, payloads, partition_count=2,
                                 dynamic_parameters={"max_attempt_count": 100, "request_timeout": "10m"})
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"] = {
        "sink_class_name": "batching_http", "input_stream_ids": ["requests"],
        "parameters": {"url": url, "payload_column": "payload", **parameters}}
    spec.write_text(yaml.safe_dump(document))
    return spec, dynamic


def flights(start: int, stop: int) -> list[str | None]:
    return [json.dumps({"flight": i, "pad": "x" * 200}) for i in range(start, stop)]


async def run_to_the_end(spec: Path, dynamic: Path, state: Path) -> None:
    await exits_zero(egress_run(spec, dynamic, state, "--until-drained"), 120)


def bodies_by_key(endpoint: Endpoint) -> dict[str, bytes]:
    """Each key's body; fails if one key ever carried two different bodies."""
    seen: dict[str, set[bytes]] = defaultdict(set)
    for key, body, _ in endpoint.calls:
        seen[key].add(body)
    assert all(len(bodies) == 1 for bodies in seen.values()), "a key carried two different batches"
    return {key: next(iter(bodies)) for key, bodies in seen.items()}


def records_of(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n")
    return body[:-1].split(b"\n")


async def test_batches_attempted_before_a_sigkill_come_back_whole_under_their_keys(
        endpoint: tuple[Endpoint, str], tmp_path: Path) -> None:
    found, url = endpoint
    first = flights(0, 60)
    spec, dynamic = batching_spec(tmp_path, url, first, max_events=10, max_delay="10s")
    state = tmp_path / "state"
    process = egress_run(spec, dynamic, state)
    try:
        # Every batch of the first run attempted, and one of them retried.
        await eventually(lambda: len({k for k, _, _ in found.calls}) >= 6
                         and len(found.calls) > len({k for k, _, _ in found.calls}),
                         what="every batch attempted and one retried", timeout=90, interval=0.02,
                         unless=exited(process))
    finally:
        await kill(process)
    before = bodies_by_key(found)
    found.healed, found.run = True, 1
    more = flights(60, 75)
    with (tmp_path / "payloads.jsonl").open("ab") as file:  # more input, and smaller batches from now on
        file.writelines(orjson.dumps({"id": i, "payload": p}) + b"\n" for i, p in enumerate(more, start=60))
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["parameters"]["max_events"] = 4
    spec.write_text(yaml.safe_dump(document))
    await run_to_the_end(spec, dynamic, state)

    after = bodies_by_key(found)
    assert all(after[key] == body for key, body in before.items()), "a key came back with another batch"
    delivered = {key for key, _, run in found.calls if run == 1}
    assert set(before) <= delivered, "a batch attempted before the kill came back under another key"
    records = [record for key in delivered for record in records_of(after[key])]
    assert sorted(records) == sorted(p.encode() for p in first + more if p is not None), "lost or duplicated"
    assert all(len(records_of(after[key])) <= 4 for key in delivered - set(before)), "new batches use the new bound"


async def test_sigkills_mid_delivery_duplicate_only_whole_batches_under_the_same_key(
        endpoint: tuple[Endpoint, str], tmp_path: Path) -> None:
    found, url = endpoint
    found.healed, found.delay = True, 0.05
    payloads = flights(0, 400)
    spec, dynamic = batching_spec(tmp_path, url, payloads, max_events=7, max_in_flight=2)
    state = tmp_path / "state"
    for run in range(2):
        found.run = run
        process = egress_run(spec, dynamic, state)
        try:
            await eventually(lambda: sum(1 for _, _, r in found.calls if r == found.run) >= 5, what="delivering",
                             timeout=90, interval=0.02, unless=exited(process))
        finally:
            await kill(process)
    found.run = 2
    await run_to_the_end(spec, dynamic, state)

    by_key = bodies_by_key(found)
    records = [record for body in by_key.values() for record in records_of(body)]
    assert sorted(records) == sorted(p.encode() for p in payloads if p is not None), \
        "a record was lost, or sent in two different batches"
