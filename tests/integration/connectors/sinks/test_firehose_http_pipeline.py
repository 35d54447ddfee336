"""Whole pipelines with the firehose_http sink: source → process function → sink → the egress receiver."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

import egress.connectors.sinks.firehose_http  # noqa: F401  (registers firehose_http until sinks/__init__ imports it)
from egress.firehose import FirehoseReceiver, TransientError
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from tests.conftest import payload_spec

pytestmark = pytest.mark.integration


class Store:
    """A receiver handler: stores records per request id; ``fail_first`` requests get a transient error."""

    def __init__(self, fail_first: int = 0) -> None:
        self.records: list[bytes] = []
        self.request_ids: Counter[str] = Counter()
        self.fail_first = fail_first
        self.calls = 0

    async def __call__(self, request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise TransientError("not yet")
        self.request_ids[request_id] += 1
        self.records.extend(records)


async def start(store: Store) -> tuple[str, web.AppRunner]:
    runner = web.AppRunner(FirehoseReceiver(store).app, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}/", runner


def firehose_spec(tmp_path: Path, url: str, payloads: list[str | None], **parameters: Any) -> tuple[Path, Path]:
    spec_path, dynamic_path = payload_spec(tmp_path, url, payloads, partition_count=2)
    spec = yaml.safe_load(spec_path.read_text())
    spec["computations"]["deliver"]["sinks"]["http"] = {
        "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
        "parameters": {"url": url, "payload_column": "payload", "stream_name": "flights",
                       "content_encoding": "gzip",
                       "buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 0}, **parameters}}
    spec_path.write_text(yaml.safe_dump(spec))
    dynamic_path.write_text(yaml.safe_dump({"computations": {"deliver": {"sinks": {"http": {"parameters": {
        "retry_initial_delay": "10ms", "retry_maximum_delay": "40ms"}}}}}}))
    return spec_path, dynamic_path


async def run(spec: Path, dynamic: Path, state: Path) -> RunResult:
    return await Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True)).run()


async def test_every_record_arrives_and_a_second_run_sends_nothing(tmp_path: Path) -> None:
    store = Store(fail_first=3)
    url, runner = await start(store)
    try:
        payloads = [None if i % 7 == 0 else f'{{"n":{i}}}' for i in range(3000)]
        spec, dynamic = firehose_spec(tmp_path, url, payloads)
        first = await run(spec, dynamic, tmp_path / "state")
        assert first.ok, first
        assert first.drained
        assert Counter(store.records) == Counter(p.encode() for p in payloads if p is not None)
        calls = store.calls
        second = await run(spec, dynamic, tmp_path / "state")
        assert second.drained
        assert store.calls == calls
    finally:
        await runner.cleanup()


async def test_until_drained_does_not_stop_while_batches_wait_at_the_reading_limit(tmp_path: Path) -> None:
    """Small records with a 5 MiB size hint: a batch cannot fill within the job's 8,192 unacknowledged
    messages, so it closes by the interval while the job is held back. When it is acknowledged the job
    must read on: with a count that only ``progress()`` shrank, it used to find every sink drained, go
    idle with input unread, and the run ended "drained" after 2 × 8,192 of 20,000 records."""
    store = Store()
    url, runner = await start(store)
    try:
        payloads: list[str | None] = [f'{{"n":{i}}}' for i in range(20_000)]
        spec, dynamic = firehose_spec(tmp_path, url, payloads,
                                      buffering_hints={"size_in_mbs": 5, "interval_in_seconds": 1})
        result = await run(spec, dynamic, tmp_path / "state")
        assert result.drained, result
        assert Counter(store.records) == Counter(p.encode() for p in payloads if p is not None)
    finally:
        await runner.cleanup()
