"""A source's unread records in a real run: a large file source read into a pipeline whose sink
stalls. ``/status`` → ``sources.input.unread_records`` is above 0 while the file is being read, and
0 once it is read to its end, while the partitions still hold the messages the sink has not taken
(a source's unread records are in no partition yet); ``/metrics`` says the same."""

from __future__ import annotations

import asyncio
import csv
import gzip
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, pass_through_spec
from tests.integration.connectors.sources.test_http import StallingReceiver
from tests.integration.observe.test_observability import sample
from tests.waiting import eventually

pytestmark = pytest.mark.integration

RECORDS = 20_000


def write_records(path: Path) -> None:
    rows = [{"id": i, "payload": f"payload number {i}"} for i in range(RECORDS)]
    if path.name.endswith(".csv"):
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, ["id", "payload"])
            writer.writeheader()
            writer.writerows(rows)
        return
    data = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.mark.parametrize("name", ["input.jsonl", "input.jsonl.gz", "input.csv"])
async def test_a_file_sources_unread_records_are_counted_until_it_is_read_and_not_as_partition_lag(
        tmp_path: Path, serve_app: ServerFactory, name: str) -> None:
    data = tmp_path / name
    write_records(data)
    receiver = StallingReceiver()
    kind = "csv" if name.endswith(".csv") else "jsonl"
    spec = pass_through_spec(tmp_path / "spec.yaml", "unread", {"source_class_name": kind,
                                                                 "parameters": {"path": str(data)}},
                             f"{await serve_app(receiver.app)}/events")
    # small chunks: the file takes many commits to read, each a moment the status is asked between
    pipeline = Pipeline(load_plan(spec), tmp_path / "state", options=RunOptions(source_chunk=200), http_port=0)
    run = asyncio.create_task(pipeline.run())
    seen: list[int | None] = []

    async def unread() -> int | None:
        source = (await pipeline.status_document())["sources"]["input"]
        seen.append(source["unread_records"])
        return None if seen[-1] == 0 and not source["finished"] else seen[-1]  # the last chunk's commit

    try:
        await eventually(lambda: _above_zero(unread()), timeout=30)
        first = next(n for n in seen if n)
        assert first < 1.5 * RECORDS  # an estimate from the bytes left (later records are longer here)
        await eventually(lambda: _is_zero(unread()), timeout=30)
        document = await pipeline.status_document()
        assert document["sources"]["input"]["finished"]
        assert all(n is None or n > 0 for n in seen[:seen.index(0)])  # 0 only once the whole file is read
        held = sum(p["input_lag"] + sum(p["unacknowledged"].values()) for p in document["partitions"])
        assert held > 0  # the stalled sink holds the messages: they are partition lag, not unread records
        assert pipeline.server is not None
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://{pipeline.server.address}/metrics") as response:
            text = await response.text()
        assert sample(text, "egress_source_unread_records", source_id="input") == 0
    finally:
        receiver.recover()
        pipeline.request_stop()
        assert (await run).ok


async def _above_zero(value: Any) -> bool:
    return bool(await value)


async def _is_zero(value: Any) -> bool:
    return await value == 0


async def test_the_http_sources_unread_records_are_the_events_received_and_not_yet_committed(
        tmp_path: Path) -> None:
    from egress.connectors.sources.http import HttpSource, HttpSourceParameters
    from tests.integration.connectors.sources.test_http import STREAM
    from tests.ports import free_port

    port = free_port()
    source = HttpSource("in", HttpSourceParameters(port=port, format="jsonl"), STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=False)
    try:
        assert source.unread_records() == 0
        async with aiohttp.ClientSession() as session:
            body = b'{"id": 1, "payload": "a"}\n{"id": 2, "payload": "b"}\n'
            posted = asyncio.create_task(session.post(f"http://127.0.0.1:{port}/events", data=body))
            await eventually(lambda: source.unread_records() == 2)
            assert len(await source.take(100, 1.0) or []) == 2
            assert source.unread_records() == 2  # taken into the batch being committed: not yet in the log
            source.committed()
            assert source.unread_records() == 0
            async with await posted as response:
                assert response.status == 200
    finally:
        await source.close()
