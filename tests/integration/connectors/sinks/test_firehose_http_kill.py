"""``egress run`` with the firehose_http sink, killed with SIGKILL while its batches are being retried,
then run again to the end: every record arrives, and every batch keeps its records and its request id
across the kill.

Two cases. Batches closed by size (300,000-byte records, a 1 MiB hint: three to a batch). And a batch
closed by a flush at the end of the input, where the restart finds more input (rows appended to the
file) and a smaller size hint: only the committed batch boundaries make it send the same batch again
rather than one re-formed from what it has now. The receiver refuses every request (503) until the
kill, so the killed run acknowledges nothing. Requests of the killed run still in the receiver's
socket may be handled after the kill: duplicates under the same request id, which is what it is for.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest
import yaml
from aiohttp import web

import egress.connectors.sinks.firehose_http  # noqa: F401  (registers firehose_http in the test process too)
from egress.firehose import FirehoseReceiver, TransientError
from tests.conftest import REPO, payload_spec
from tests.pipelines import Passthrough
from tests.subprocesses import exits_zero, kill
from tests.waiting import eventually, exited

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


def firehose_spec(tmp_path: Path, url: str, payloads: list[str | None], hints: dict[str, int]) -> tuple[Path, Path]:
    """The payload spec of tests.conftest with the firehose_http sink (``buffering_hints`` = ``hints``)."""
    spec, dynamic = payload_spec(tmp_path, url, payloads)
    document = yaml.safe_load(spec.read_text())
    computation = document["computations"]["deliver"]
    computation["processing_function"] = f"{__name__}:RegisteringPassthrough"
    parameters = {"url": url, "payload_column": "payload", "stream_name": "flights", "retry_duration": 7200,
                  "buffering_hints": hints}
    computation["sinks"]["http"] = {"sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
                                    "parameters": parameters}
    spec.write_text(yaml.safe_dump(document))
    dynamic.write_text(yaml.safe_dump({"computations": {"deliver": {"sinks": {"http": {"parameters": {
        "retry_initial_delay": "50ms", "retry_maximum_delay": "100ms"}}}}}}))
    return spec, dynamic


async def kill_and_rerun(endpoint: Endpoint, spec: Path, dynamic: Path, state: Path, *, batches: int,
                         between: Callable[[], None] = lambda: None) -> None:
    """Run until ``batches`` request ids reached the endpoint and one of them twice (a retry), SIGKILL,
    heal the endpoint, call ``between()``, and run again with ``--until-drained`` to the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        first = egress_run(spec, dynamic, state)
        started.append(first)
        await eventually(lambda: len({c[0] for c in endpoint.calls}) >= batches
                         and any(sum(1 for c in endpoint.calls if c[0] == rid) >= 2 for rid, _, _ in endpoint.calls),
                         what="the first run retrying at the endpoint", timeout=90, interval=0.05,
                         unless=exited(first))
        await kill(first)
        endpoint.healed = True
        between()
        second = egress_run(spec, dynamic, state, "--until-drained")
        started.append(second)
        await exits_zero(second, int(os.environ.get("FH_KILL_TIMEOUT", "120")))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait, 30)


def records_by_request_id(endpoint: Endpoint) -> dict[str, tuple[bytes, ...]]:
    """Each request id's records; fails if one id ever carried two different batches."""
    records_of: dict[str, set[tuple[bytes, ...]]] = defaultdict(set)
    for rid, records, _ in endpoint.calls:
        records_of[rid].add(records)
    assert all(len(variants) == 1 for variants in records_of.values()), "a request id carried two batches"
    return {rid: next(iter(variants)) for rid, variants in records_of.items()}


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Endpoint, str]]:
    endpoint = Endpoint()
    runner = web.AppRunner(FirehoseReceiver(endpoint).app, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield endpoint, f"http://127.0.0.1:{runner.addresses[0][1]}/"
    await runner.cleanup()


async def test_request_ids_of_size_closed_batches_survive_a_sigkill(
        receiver: tuple[Endpoint, str], tmp_path: Path) -> None:
    endpoint, url = receiver
    payloads: list[str | None] = [f"{i:06d}".ljust(RECORD_BYTES, "x") for i in range(RECORDS)]
    spec, dynamic = firehose_spec(tmp_path, url, payloads, {"size_in_mbs": 1, "interval_in_seconds": 3})
    await kill_and_rerun(endpoint, spec, dynamic, tmp_path / "state", batches=2)

    records_of = records_by_request_id(endpoint)
    before = {rid for rid, _, healed in endpoint.calls if not healed}
    after = {rid for rid, _, healed in endpoint.calls if healed}
    assert len(after) == RECORDS // 3
    delivered = sorted(r for rid in after for r in records_of[rid])
    assert delivered == sorted(p.encode() for p in payloads if p is not None)
    assert before <= after, "a batch attempted before the kill came back under another request id"


async def test_a_flushed_batch_keeps_its_records_and_id_across_a_sigkill_and_new_input(
        receiver: tuple[Endpoint, str], tmp_path: Path) -> None:
    endpoint, url = receiver
    payloads = [f"flight-{i:03d}" for i in range(30)]
    spec, dynamic = firehose_spec(tmp_path, url, payloads, {"size_in_mbs": 5, "interval_in_seconds": 900})
    more = [f"flight-{i:03d}" for i in range(30, 40)]

    def grow_input_and_shrink_batches() -> None:
        data = tmp_path / "payloads.jsonl"
        with data.open("ab") as file:
            file.writelines(orjson.dumps({"id": i, "payload": p}) + b"\n" for i, p in enumerate(more, start=30))
        document = yaml.safe_load(spec.read_text())
        hints = document["computations"]["deliver"]["sinks"]["http"]["parameters"]["buffering_hints"]
        hints["size_in_mbs"] = 1
        spec.write_text(yaml.safe_dump(document))

    await kill_and_rerun(endpoint, spec, dynamic, tmp_path / "state", batches=1, between=grow_input_and_shrink_batches)

    records_of = records_by_request_id(endpoint)
    before = {rid for rid, _, healed in endpoint.calls if not healed}
    assert len(before) == 1, "the first run formed one batch: all 30 records, flushed at the end of its input"
    (first_id,) = before
    assert records_of[first_id] == tuple(p.encode() for p in payloads)
    healed = [rid for rid, _, ok in endpoint.calls if ok]
    assert healed[0] == first_id, "the restart sent the committed batch first, under its request id"
    assert sorted(r for rid in set(healed) for r in records_of[rid]) == [p.encode() for p in payloads + more]
