"""The byte-chunk path end to end (``docs/architecture.md``, "Byte chunks"): ``egress run`` of the
``lines`` source, ``egress:IdentityMap`` and the batching HTTP sink stores each chunk of lines as one
log row and the outbox as references to it; killed with SIGKILL mid-delivery and run again, it
loses no record, a key never carries two bodies, and a batch the endpoint refuses for good is
dead-lettered one line per record. The same input through a plain ``MapFunction`` (the row path)
gives the same keys and bodies."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from egress.line_chunks import CHUNK_MARK
from tests.conftest import REPO
from tests.subprocesses import exits_zero, kill
from tests.waiting import eventually, exited

pytestmark = pytest.mark.integration

POISON = "POISON"
RECORDS = 6_000  # about 2 MiB of lines: the source reads 1 MiB at a time, so several chunks
SCHEMA = [{"name": "line", "type": "string", "required": True}]
ROW_MAP = '''from egress import MapFunction


class Same(MapFunction):
    """The identity, as a plain map: the row path."""

    def map(self, row, ctx):
        return row
'''


@dataclass
class Endpoint:
    """Records every POST as (key, body, status); answers 500 to a body holding ``POISON``, 200 to the
    rest; once ``hold_after`` requests were answered, holds every further one until ``release``."""

    hold_after: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0
    calls: list[tuple[str, bytes, int]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.hold_after is not None and len(self.calls) >= self.hold_after:
            self.held += 1
            await self.release.wait()
        status = 500 if POISON.encode() in body else 200
        self.calls.append((request.headers["Idempotency-Key"], body, status))
        return web.Response(status=status, text="ok")

    def delivered(self) -> dict[str, bytes]:
        """Each key answered 2xx and its body; fails if one key ever carried two different bodies."""
        seen: dict[str, set[bytes]] = defaultdict(set)
        for key, body, _ in self.calls:
            seen[key].add(body)
        assert all(len(bodies) == 1 for bodies in seen.values()), "a key carried two different batches"
        return {key: body for key, body, status in self.calls if status == 200}


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, str]]:
    found = Endpoint()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/bulk", found.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield found, f"http://127.0.0.1:{runner.addresses[0][1]}/bulk"
    found.release.set()
    await runner.cleanup()


def lines() -> list[str]:
    return [POISON if i == RECORDS // 2 else json.dumps({"event": i, "pad": "é" * (i % 50) + "x" * 300})
            for i in range(RECORDS)]


def write_spec(folder: Path, url: str, function: str, dead_letters: Path) -> tuple[Path, Path]:
    """The byte-chunk pipeline's Spec (``function`` its processing function) and a DynamicSpec whose
    retries end soon (a refused batch is dead-lettered), over ``folder``'s ``input.txt``."""
    spec = {
        "pipeline": "byte_chunks",
        "partition_count": 2,
        "streams": {"lines": {"schema": SCHEMA}, "requests": {"schema": SCHEMA}},
        "sources": {"input": {"source_class_name": "lines", "output_stream_id": "lines",
                              "parameters": {"path": str(folder.parent / "input.txt")}}},
        "computations": {"deliver": {
            "computation_class_name": "NYT::NFlow::TProcessFunctionComputation",
            "processing_function": function,
            "input_stream_ids": ["lines"],
            "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "batching_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": url, "payload_column": "line", "max_bytes": "64KiB",
                                              "max_events": 400, "dead_letter_path": str(dead_letters)}}}}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    (folder / "dynamic.yaml").write_text(yaml.safe_dump({"computations": {"deliver": {"sinks": {"http": {
        "parameters": {"max_attempt_count": 2, "retry_initial_delay": "10ms", "retry_minimum_delay": "10ms"}}}}}}))
    (folder / "rowmap.py").write_text(ROW_MAP)
    return folder / "spec.yaml", folder / "dynamic.yaml"


def egress_run(folder: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "egress", "run", str(folder / "spec.yaml"), "--dynamic-spec",
                             str(folder / "dynamic.yaml"), "--state-dir", str(folder / "state"), "--quiet", *extra],
                            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{folder}"})


async def run_to_the_end(folder: Path) -> None:
    await exits_zero(egress_run(folder, "--until-drained"), 240)


def stored_kinds(folder: Path) -> set[str]:
    """How the state directory stored its log batches: ``chunk`` (one row per chunk of lines) or ``rows``."""
    with sqlite3.connect(folder / "state" / "egress.sqlite3") as db:
        blobs = db.execute("SELECT messages FROM log_batches").fetchall()
    return {"chunk" if blob[0] == CHUNK_MARK else "rows" for (blob,) in blobs}


def records_of(bodies: dict[str, bytes]) -> list[str]:
    return sorted(line for body in bodies.values() for line in body.decode().split("\n")[:-1])


async def test_a_sigkill_mid_run_loses_nothing_and_a_refused_batch_is_dead_lettered_per_record(
        endpoint: tuple[Endpoint, str], tmp_path: Path) -> None:
    found, url = endpoint
    expected = lines()
    (tmp_path / "input.txt").write_text("".join(line + "\n" for line in expected))
    folder, dead_letters = tmp_path / "chunks", tmp_path / "dead.jsonl"
    write_spec(folder, url, "egress:IdentityMap", dead_letters)
    found.hold_after = 5
    process = egress_run(folder)
    try:  # the kill comes once the endpoint holds a request: mid-run, whatever the machine's speed
        await eventually(lambda: found.held > 0, what="a request held", timeout=120, unless=exited(process))
    finally:
        await kill(process)
    assert stored_kinds(folder) == {"chunk"}, "the byte-chunk path was not taken"
    before = dict(found.delivered())
    assert 0 < len(before) <= 5, "the kill came mid-run: some batches answered, the rest held"
    found.hold_after = None
    found.release.set()
    await run_to_the_end(folder)

    delivered = found.delivered()
    assert all(delivered.get(key, body) == body for key, body in before.items())
    letters = [json.loads(line) for line in dead_letters.read_text().splitlines()]
    refused = {letter["idempotency_key"] for letter in letters}
    assert len(refused) == 1
    assert POISON in [letter["payload"] for letter in letters]
    [refused_body] = {body for key, body, status in found.calls if status == 500}
    assert [letter["payload"] for letter in letters] == refused_body.decode().split("\n")[:-1]  # one per record
    assert sorted([*records_of(delivered), *(letter["payload"] for letter in letters)]) == sorted(expected)


async def test_the_row_path_gives_the_same_keys_and_bodies(endpoint: tuple[Endpoint, str], tmp_path: Path) -> None:
    found, url = endpoint
    (tmp_path / "input.txt").write_text("".join(line + "\n" for line in lines()))
    sent = {}
    for name, function in (("chunks", "egress:IdentityMap"), ("rows", "rowmap:Same")):
        folder = tmp_path / name
        write_spec(folder, url, function, tmp_path / f"{name}-dead.jsonl")
        found.calls.clear()
        await run_to_the_end(folder)
        sent[name] = {key: body for key, body, _ in found.calls}
    assert stored_kinds(tmp_path / "rows") == {"chunk"}  # the source stores chunks either way
    assert sent["chunks"] == sent["rows"]
