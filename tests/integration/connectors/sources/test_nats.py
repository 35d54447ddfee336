"""The ``nats`` source on a real nats-server: a JetStream stream other applications publish into is
read live, from the committed stream sequence, with ids derived from (stream, sequence)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from aiohttp import web
from nats.js import JetStreamContext

from egress.connectors.sources.nats import NatsSourceError
from egress.errors import SourceDataError, SpecErrors
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from tests.conftest import ServerFactory, eventually, pass_through_spec

pytestmark = pytest.mark.integration


class Collector:
    """An HTTP endpoint that keeps every request's ``(Idempotency-Key, body)`` and answers 200."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.arrived = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/events", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        self.received.append((request.headers.get("Idempotency-Key", ""), await request.read()))
        self.arrived.set()
        return web.Response(status=200)

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(20.0):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()

    def bodies(self) -> list[bytes]:
        return [body for _, body in self.received]


@pytest.fixture
async def jetstream(nats_server: str) -> AsyncIterator[tuple[JetStreamContext, str]]:
    """A JetStream context on the test server and a fresh stream (subjects ``<stream>.>``)."""
    client = await nats.connect(nats_server)
    js = client.jetstream()
    stream = f"orders_{uuid.uuid4().hex[:12]}"
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    yield js, stream
    await js.delete_stream(stream)
    await client.close()


def nats_spec(tmp_path: Path, url: str, stream: str, **parameters: Any) -> Path:
    """A Spec reading ``stream`` (json by default) and POSTing each ``payload`` to ``url``."""
    source = {"source_class_name": "nats",
              "parameters": {"url": parameters.pop("nats_url"), "stream": stream, **parameters}}
    return pass_through_spec(tmp_path / "spec.yaml", "nats_test", source, url, extra_columns=("subject", "tenant"))


async def publish(js: JetStreamContext, stream: str, start: int, count: int) -> None:
    for i in range(start, start + count):
        await js.publish(f"{stream}.eu", orjson.dumps({"id": i, "payload": f"order {i}"}))


async def drain(spec: Path, state: Path) -> RunResult:
    return await Pipeline(load_plan(spec), state, options=RunOptions(until_drained=True)).run()


def expected_key(stream: str, sequence: int) -> str:
    scope = source_scope("nats_test", "input", stream)
    return idempotency_key(derived_message_id(source_message_id(scope, 0, sequence), 0))


async def test_messages_published_while_the_pipeline_runs_are_delivered_once_with_keys_from_stream_and_sequence(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    collector = Collector()
    base = await serve_app(collector.app)
    spec = nats_spec(tmp_path, f"{base}/events", stream, nats_url=nats_server)
    await publish(js, stream, 0, 5)
    pipeline = Pipeline(load_plan(spec), tmp_path / "state")
    running = asyncio.create_task(pipeline.run())
    await collector.wait_for(5)
    await publish(js, stream, 5, 5)  # live: published after the start, read by the same run
    await collector.wait_for(10)
    # Stopped once every response is back: a stop does not wait for deliveries in flight, whose
    # acknowledgements it cannot commit (they would be sent again: at least once, not this test's point).
    await eventually(lambda: pipeline.metrics.total("egress_sink_responses_total") >= 10,
                     what="the sink received the 10 responses")
    pipeline.request_stop()
    assert (await running).ok

    await publish(js, stream, 10, 3)  # while nothing runs: the next run resumes after sequence 10
    result = await drain(spec, tmp_path / "state")
    assert result.ok
    assert result.drained
    assert sorted(collector.bodies()) == sorted(f"order {i}".encode() for i in range(13))
    assert {key for key, _ in collector.received} == {expected_key(stream, sequence) for sequence in range(1, 14)}


async def test_until_drained_ends_once_caught_up_with_the_stream_as_it_was_at_the_start(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    collector = Collector()
    base = await serve_app(collector.app)
    spec = nats_spec(tmp_path, f"{base}/events", stream, nats_url=nats_server, subject=f"{stream}.eu")
    await publish(js, stream, 0, 4)
    await js.publish(f"{stream}.us", orjson.dumps({"id": 99, "payload": "filtered out"}))  # the last sequence
    result = await drain(spec, tmp_path / "state")
    assert result.ok
    assert result.drained
    assert sorted(collector.bodies()) == [f"order {i}".encode() for i in range(4)]
    empty = await drain(spec, tmp_path / "state")  # nothing new: drained at once, nothing resent
    assert empty.drained
    assert len(collector.received) == 4


async def test_raw_payloads_subject_and_headers_fill_the_columns_the_spec_names(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    collector = Collector()
    base = await serve_app(collector.app)
    spec = nats_spec(tmp_path, f"{base}/events", stream, nats_url=nats_server, format="raw",
                              payload_column="payload", subject_column="subject", header_columns={"tenant": "Tenant"})
    raw = bytes(range(256))  # not UTF-8: delivered byte for byte
    await js.publish(f"{stream}.eu", raw, headers={"Tenant": "acme"})
    plan = load_plan(spec)
    source = plan.sources["input"].source_class.create("input", plan.sources["input"].parameters,
                                                       plan.sources["input"].stream, tmp_path)
    await source.start(0, b"", until_caught_up=True)
    try:
        records = await source.take(10, 5.0)
    finally:
        await source.close()
    assert records is not None
    assert [(r.position, r.row) for r in records] == [
        (1, {"id": None, "payload": raw, "subject": f"{stream}.eu", "tenant": "acme"})]
    assert (await drain(spec, tmp_path / "state")).ok
    assert collector.bodies() == [raw]


async def test_a_bad_json_message_stops_the_run_naming_stream_and_sequence_once_those_before_are_delivered(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    collector = Collector()
    base = await serve_app(collector.app)
    spec = nats_spec(tmp_path, f"{base}/events", stream, nats_url=nats_server)
    await publish(js, stream, 0, 2)
    await js.publish(f"{stream}.eu", b"{not json")
    await publish(js, stream, 3, 1)
    for _run in range(2):  # the second run resumes at the bad message: nothing more, the same error
        result = await drain(spec, tmp_path / "state")
        assert isinstance(result.error, SourceDataError)
        assert f"nats stream {stream} sequence 3: not valid JSON" in str(result.error)
        # Fetched in one batch with the bad one, the two before it are committed and delivered.
        assert sorted(key for key, _ in collector.received) == sorted(expected_key(stream, s) for s in (1, 2))


async def test_a_missing_stream_is_one_error_naming_it_and_the_fix(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str) -> None:
    spec = nats_spec(tmp_path, "http://127.0.0.1:9/events", "no_such_stream", nats_url=nats_server)
    result = await drain(spec, tmp_path / "state")
    assert isinstance(result.error, NatsSourceError)
    assert "no JetStream stream 'no_such_stream'" in str(result.error)
    assert "fix parameters/stream" in str(result.error)
    assert "js.add_stream" in str(result.error)  # the nats CLI may not be installed; nats-py always is


def test_credentials_in_the_url_are_refused_and_referenced_ones_must_exist(tmp_path: Path) -> None:
    spec = nats_spec(tmp_path, "http://127.0.0.1:9/events", "s", nats_url="nats://user:secret@127.0.0.1:4222",
                              credentials_file="missing.creds", format="raw")
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec)
    message = str(raised.value)
    assert "the URL holds credentials: reference them instead" in message
    assert "missing.creds" in message
    assert "format raw needs payload_column" in message


async def test_a_bad_message_is_skipped_with_on_bad_record_skip_and_its_sequence_is_passed(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    collector = Collector()
    base = await serve_app(collector.app)
    spec = nats_spec(tmp_path, f"{base}/events", stream, nats_url=nats_server, on_bad_record="skip")
    await publish(js, stream, 0, 1)
    await js.publish(f"{stream}.eu", b"{not json")
    await publish(js, stream, 2, 1)
    pipeline = Pipeline(load_plan(spec), tmp_path / "state", options=RunOptions(until_drained=True))
    result = await pipeline.run()
    assert result.ok
    assert sorted(collector.bodies()) == [b"order 0", b"order 2"]
    assert {key for key, _ in collector.received} == {expected_key(stream, 1), expected_key(stream, 3)}
    assert pipeline.metrics.total("egress_source_bad_records_total") == 1


async def test_the_unread_records_are_the_consumers_pending_messages_after_each_fetch(
        tmp_path: Path, nats_server: str, jetstream: tuple[JetStreamContext, str]) -> None:
    js, stream = jetstream
    await publish(js, stream, 0, 10)
    plan = load_plan(nats_spec(tmp_path, "http://127.0.0.1:9/events", stream, nats_url=nats_server))
    source = plan.sources["input"].source_class.create("input", plan.sources["input"].parameters,
                                                       plan.sources["input"].stream, tmp_path)
    await source.start(0, b"", until_caught_up=False)
    try:
        assert source.unread_records() is None  # nothing fetched yet: unknown
        assert len(await source.take(4, 5.0) or []) == 4
        assert source.unread_records() == 6
        assert len(await source.take(100, 5.0) or []) == 6
        assert source.unread_records() == 0
    finally:
        await source.close()
