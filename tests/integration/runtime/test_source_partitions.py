"""Sources read by several readers, run whole: a followed glob shared by three readers in one
embedded run and again after new files came; a partitioned JetStream stream read by two readers on
two NATS workers. ``--until-drained`` ends each run once every reader has read its share, and
every record arrives once, under the key of its file number or stream sequence; each reader appends
to its own lane (``egress.runtime.lanes``), so no commit loses a race to another reader's."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import replace
from pathlib import Path

import nats
import orjson
import pytest
import yaml
from nats.js.api import StreamConfig, SubjectTransform

from egress.engines import Engine
from egress.engines.nats import NatsEngine
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.runtime.pipeline import nats_engine_factory
from tests.conftest import ServerFactory, pass_through_spec

pytestmark = pytest.mark.integration

OPTIONS = RunOptions(until_drained=True, lease_ttl=2.0, heartbeat_period=0.5, remote_poll_period=0.5,
                     drained_check_period=0.2)
ROWS_PER_FILE = 50
COUNT = 600


def write_files(folder: Path, first: int, count: int) -> None:
    for index in range(first, first + count):
        rows = range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE)
        (folder / f"f{index:02}.jsonl").write_bytes(
            b"".join(orjson.dumps({"id": i, "payload": f"row {i}"}) + b"\n" for i in rows))


async def test_three_readers_of_a_followed_glob_deliver_every_row_once_across_two_runs(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_files(logs, 0, 8)
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    spec = pass_through_spec(tmp_path / "spec.yaml", "shared_glob", {
        "source_class_name": "jsonl", "parameters": {"path": "logs/*.jsonl", "follow": True, "readers": 3}}, url)
    first = await asyncio.wait_for(Pipeline(load_plan(spec), tmp_path / "state", options=OPTIONS).run(), 60)
    assert first.ok, first
    assert first.drained, first
    write_files(logs, 8, 4)  # new files while egress is down: each reader takes its own
    second = Pipeline(load_plan(spec), tmp_path / "state", options=OPTIONS)
    result = await asyncio.wait_for(second.run(), 60)
    assert result.ok, result
    assert result.drained, result

    assert second.metrics.total("egress_source_rows_total") == 4 * ROWS_PER_FILE  # the new files only
    delivered = receiver.stats.delivered_keys
    assert len(delivered) == 12 * ROWS_PER_FILE  # one key per row
    assert set(delivered.values()) == {1}  # each delivered once
    # Each key is (file number, record number) of one reader's numbering: k, k+3, k+6, ...
    scope = source_scope("shared_glob", "input", "logs/*.jsonl")
    numbers = {number for number in range(40)
               if idempotency_key(derived_message_id(source_message_id(scope, number, 0), 0)) in delivered}
    assert len(numbers) == 12
    # Reader 0 dealt the files: 4 to each reader (8 in the first run, 4 while it was down).
    assert sorted(sum(1 for number in numbers if number % 3 == k) for k in range(3)) == [4, 4, 4]


async def test_two_workers_read_a_partitioned_stream_with_two_readers_once_and_drain(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str) -> None:
    stream = f"parts_{uuid.uuid4().hex[:10]}"
    client = await nats.connect(nats_server)
    js = client.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"], subject_transform=SubjectTransform(
        src=f"{stream}.*", dest=f"{stream}.{{{{partition(2,1)}}}}.{{{{wildcard(1)}}}}")))
    for i in range(COUNT):
        await js.publish(f"{stream}.k{i % 30}", orjson.dumps({"id": i, "payload": f"nats {i}"}))
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    pipeline = f"parts_{hashlib.blake2b(str(tmp_path).encode(), digest_size=6).hexdigest()}"
    spec = pass_through_spec(tmp_path / "spec.yaml", pipeline, {"source_class_name": "nats", "parameters": {
        "url": nats_server, "stream": stream, "subject": f"{stream}.{{partition}}.*", "readers": 2}}, url)
    assert yaml.safe_load(spec.read_text())["sources"]["input"]["parameters"]["readers"] == 2
    engines: list[NatsEngine] = []

    def factory(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
        engine = nats_engine_factory([nats_server])(state_dir, pipeline, options)
        assert isinstance(engine, NatsEngine)
        engines.append(engine)
        return engine

    options = replace(OPTIONS, source_chunk=10)  # many small commits, each appending to every partition
    workers = [Pipeline(load_plan(spec), tmp_path / f"state-{name}", options=options, engine_factory=factory,
                        worker_id=f"worker-{name}") for name in "ab"]
    results = await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), 120)
    await js.delete_stream(stream)
    await client.close()

    assert all(r.ok and r.drained for r in results), results
    scope = source_scope(pipeline, "input", stream)
    expected = {idempotency_key(derived_message_id(source_message_id(scope, 0, i + 1), 0)) for i in range(COUNT)}
    assert set(receiver.stats.delivered_keys) == expected
    assert sum(w.metrics.total("egress_source_rows_total") for w in workers) == COUNT  # each read once
    assert [engine.races_lost for engine in engines] == [0, 0]  # each reader appends to its own lane
