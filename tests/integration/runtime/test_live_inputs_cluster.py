"""Live inputs in cluster mode: two workers on the NATS engine run one pipeline fed by a ``nats``
source and a followed file; each source reader is a unit one worker owns, and ``--until-drained``
ends both workers once both inputs are read to their end at the start and everything is delivered."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path

import nats
import orjson
import pytest
import yaml

from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.runtime.pipeline import nats_engine_factory
from tests.conftest import ServerFactory, pass_through_spec

pytestmark = pytest.mark.integration

OPTIONS = RunOptions(until_drained=True, lease_ttl=2.0, heartbeat_period=0.5, remote_poll_period=0.5,
                     drained_check_period=0.2)
COUNT = 500


async def test_two_workers_read_a_stream_and_a_followed_file_once_and_drain(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str) -> None:
    stream = f"cluster_{uuid.uuid4().hex[:10]}"
    client = await nats.connect(nats_server)
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    for i in range(COUNT):
        await js.publish(f"{stream}.x", orjson.dumps({"id": i, "payload": f"nats {i}"}))
    log = tmp_path / "app.jsonl"
    log.write_bytes(b"".join(orjson.dumps({"id": i, "payload": f"file {i}"}) + b"\n" for i in range(COUNT)))

    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    pipeline = f"live_{hashlib.blake2b(str(tmp_path).encode(), digest_size=6).hexdigest()}"
    spec = pass_through_spec(tmp_path / "spec.yaml", pipeline,
                             {"source_class_name": "nats", "parameters": {"url": nats_server, "stream": stream}}, url)
    document = yaml.safe_load(spec.read_text())
    document["sources"]["log"] = {"source_class_name": "jsonl", "output_stream_id": "events",
                                  "parameters": {"path": str(log), "follow": True}}
    spec.write_text(yaml.safe_dump(document))
    factory = nats_engine_factory([nats_server])
    workers = [Pipeline(load_plan(spec), tmp_path / "state", options=OPTIONS, engine_factory=factory,
                        worker_id=f"worker-{name}") for name in "ab"]
    results = await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), 120)
    await js.delete_stream(stream)
    await client.close()

    assert all(r.ok and r.drained for r in results), results
    nats_scope = source_scope(pipeline, "input", stream)
    file_scope = source_scope(pipeline, "log", str(log))
    expected = {idempotency_key(derived_message_id(source_message_id(nats_scope, 0, i + 1), 0)) for i in range(COUNT)}
    expected |= {idempotency_key(derived_message_id(source_message_id(file_scope, 0, i), 0)) for i in range(COUNT)}
    assert set(receiver.stats.delivered_keys) == expected
    assert sum(w.metrics.total("egress_source_rows_total") for w in workers) == 2 * COUNT  # each read once
