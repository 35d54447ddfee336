"""Dead letters and redrive in one process, against real servers on loopback: pipelines whose
exhausted deliveries go to a dead-letter file and go on, then ``egress.runtime.redrive`` re-sending
them through the sink (async HTTP and Firehose) with their original keys, once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from egress.connectors.dead_letters import (
    Attempt,
    DeadLetter,
    encode_dead_letter,
    read_dead_letters,
    redrive_record_path,
)
from egress.firehose import FirehoseReceiver, TransientError
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.runtime.redrive import load_redrive_target, redrive
from tests.conftest import ServerFactory, payload_spec

pytestmark = pytest.mark.integration
ONE_ATTEMPT = {"max_attempt_count": 1}


def pointed_at(spec: Path, url: str, **sink_parameters: Any) -> Path:
    """A copy of ``spec`` whose sink ``deliver/http`` posts to ``url`` (with more parameters)."""
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["parameters"].update(url=url, **sink_parameters)
    path = spec.with_name(f"{spec.stem}-{len(list(spec.parent.glob('*.yaml')))}.yaml")
    path.write_text(yaml.safe_dump(document))
    return path


async def run_pipeline(spec: Path, dynamic: Path, state: Path) -> Pipeline:
    pipeline = Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True))
    result = await pipeline.run()
    assert result.ok, result
    assert result.drained
    return pipeline


async def test_three_partitions_share_a_dead_letter_file_and_every_message_is_delivered_or_in_it_once(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver(ReceiverConfig(fail_rate=0.4, seed=7))
    base = await serve_app(receiver.app)
    dead = tmp_path / "dead.jsonl"
    payloads = [f"p{i}" for i in range(300)]
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", payloads, partition_count=3,
                                 sink_parameters={"dead_letter_path": str(dead)}, dynamic_parameters=ONE_ATTEMPT)
    pipeline = await run_pipeline(spec, dynamic, tmp_path / "state")
    letters, torn = read_dead_letters(dead)
    assert torn == 0
    keys = Counter(letter.idempotency_key for letter in letters)
    assert max(keys.values()) == 1
    assert set(keys).isdisjoint(receiver.stats.delivered_keys)
    assert len(keys) + len(receiver.stats.delivered_keys) == len(payloads)
    assert {letter.partition for letter in letters} == {0, 1, 2}
    assert all(letter.attempts[0].status == 503 and len(letter.attempts) == 1 for letter in letters)
    assert pipeline.metrics.total("egress_sink_dead_letters_total") == len(letters)
    status = await pipeline.status_document()
    latest = status["dead_letters"]["latest"]
    assert status["dead_letters"]["written"] == len(letters)
    assert latest["path"] == str(dead)
    assert latest["idempotency_key"] in keys
    assert latest["error"] == "Async HTTP POST retry policy exhausted after 1 attempt(s); last error: HTTP status 503"
    assert status["status"] == {}  # nothing blocked, nothing failing


async def test_redrive_delivers_each_letter_with_its_original_key_once_however_often_it_runs(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    failing = Receiver(ReceiverConfig(fail_rate=1.0, fail_status=500))
    dead = tmp_path / "dead.jsonl"
    payloads = ["plain text", '{"n": 1}', "ünïcödé", "last"]
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(failing.app)}/events", payloads,
                                 sink_parameters={"dead_letter_path": str(dead)}, dynamic_parameters=ONE_ATTEMPT)
    await run_pipeline(spec, dynamic, tmp_path / "state")
    letters, _ = read_dead_letters(dead)
    assert len(letters) == 4

    healthy = Receiver()
    healthy_spec = pointed_at(spec, f"{await serve_app(healthy.app)}/events")
    first = await redrive(load_redrive_target(healthy_spec, dynamic, "deliver/http", dead), dead)
    assert first.ok
    assert (len(first.delivered), first.already_redriven, len(first.failed)) == (4, 0, 0)
    assert Counter(healthy.stats.delivered_keys) == Counter({letter.idempotency_key: 1 for letter in letters})
    assert len(redrive_record_path(dead).read_text().splitlines()) == 4

    second = await redrive(load_redrive_target(healthy_spec, dynamic, "deliver/http", dead), dead)
    assert (len(second.delivered), second.already_redriven, len(second.failed)) == (0, 4, 0)
    assert healthy.stats.requests == 4


async def test_redrive_sends_through_the_sink_as_configured_now(tmp_path: Path, serve_app: ServerFactory) -> None:
    """Its current headers and idempotency header name, and its retries (two 503s, then 200)."""
    dead = tmp_path / "dead.jsonl"
    dead.write_bytes(b"".join(encode_dead_letter(letter("deliver", "http", n)) for n in range(3)))
    record = tmp_path / "received.jsonl"
    healthy = Receiver(ReceiverConfig(fail_first=2, idempotency_header="X-Key", record=record))
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(healthy.app)}/events", [],
                                 sink_parameters={"idempotency_header": "X-Key", "headers": {"X-Run": "redrive"}},
                                 dynamic_parameters={"max_attempt_count": 3})
    report = await redrive(load_redrive_target(spec, dynamic, "deliver/http", dead), dead)
    assert len(report.delivered) == 3
    assert set(healthy.stats.delivered_keys) == {b"m0".hex().upper(), b"m1".hex().upper(), b"m2".hex().upper()}
    assert healthy.stats.requests == 9
    assert {json.loads(line)["headers"]["X-Run"] for line in record.read_text().splitlines()} == {"redrive"}


async def test_a_letter_that_fails_again_stays_for_the_next_redrive(tmp_path: Path, serve_app: ServerFactory) -> None:
    dead = tmp_path / "dead.jsonl"
    dead.write_bytes(b"".join(encode_dead_letter(letter("deliver", "http", n)) for n in range(5)))
    refused = b"m2".hex().upper()
    delivered: list[str] = []

    async def picky(request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        if key == refused:
            return web.Response(status=500)
        delivered.append(key)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/events", picky)
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(app)}/events", [], dynamic_parameters=ONE_ATTEMPT)
    report = await redrive(load_redrive_target(spec, dynamic, "deliver/http", dead), dead)
    assert [failed.idempotency_key for failed, _ in report.failed] == [refused]
    assert "HTTP status 500" in report.failed[0][1]
    assert len(report.delivered) == 4
    refused = ""  # the endpoint is fixed
    again = await redrive(load_redrive_target(spec, dynamic, "deliver/http", dead), dead)
    assert (len(again.delivered), again.already_redriven) == (1, 4)
    assert Counter(delivered) == Counter({(b"m%d" % n).hex().upper(): 1 for n in range(5)})


async def test_redrive_leaves_the_letters_of_other_sinks_alone(tmp_path: Path, serve_app: ServerFactory) -> None:
    dead = tmp_path / "dead.jsonl"
    dead.write_bytes(encode_dead_letter(letter("deliver", "http", 1)) + encode_dead_letter(letter("other", "http", 2))
                     + encode_dead_letter(letter("deliver", "audit", 3)))
    healthy = Receiver()
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(healthy.app)}/events", [])
    report = await redrive(load_redrive_target(spec, dynamic, "deliver/http", dead), dead)
    assert [d.seq for d in report.delivered] == [1]
    assert report.other_sinks == Counter({"other/http": 1, "deliver/audit": 1})
    assert healthy.stats.requests == 1


def letter(computation: str, sink: str, n: int) -> DeadLetter:
    message_id = f"m{n}".encode()
    return DeadLetter(computation, sink, 0, n, message_id, message_id.hex().upper(), f"payload {n}".encode(),
                      (Attempt(1.0, 503),), "exhausted", 2.0)


# -------------------------------------------------------------------------------------- Firehose


class Store:
    """A Firehose receiver handler: records per request id, or a transient error while ``failing``."""

    def __init__(self, *, failing: bool) -> None:
        self.failing = failing
        self.batches: list[tuple[str, list[bytes]]] = []

    async def __call__(self, request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        if self.failing:
            raise TransientError("down for maintenance")
        self.batches.append((request_id, records))


async def test_firehose_letters_are_redriven_as_their_batches_under_the_same_request_ids(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    down = Store(failing=True)
    dead, errors = tmp_path / "dead.jsonl", tmp_path / "errors.jsonl"
    payloads = [None if i % 9 == 0 else f'{{"flight":{i}}}' for i in range(120)]
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(FirehoseReceiver(down).app)}/", payloads)
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"] = {
        "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
        "parameters": {"url": document["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"],
                       "payload_column": "payload", "stream_name": "flights", "retry_duration": 0,
                       "buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 0},
                       "error_output": str(errors), "dead_letter_path": str(dead)}}
    spec.write_text(yaml.safe_dump(document))
    dynamic.write_text(yaml.safe_dump({}))
    pipeline = await run_pipeline(spec, dynamic, tmp_path / "state")
    letters, _ = read_dead_letters(dead)
    records = [p.encode() for p in payloads if p is not None]
    assert [letter.payload for letter in letters] == records
    assert len(errors.read_text().splitlines()) == len(records)  # the Firehose-format error output too
    assert pipeline.metrics.total("egress_sink_dead_letters_total") == len(records)
    assert letters[0].attempts[0].status == 503
    assert (letters[0].attempts[0].error or "").startswith("HttpEndpoint.DestinationException: ")
    batches = Counter(letter.idempotency_key for letter in letters)

    up = Store(failing=False)
    healthy = pointed_at(spec, f"{await serve_app(FirehoseReceiver(up).app)}/",
                         buffering_hints={"size_in_mbs": 64, "interval_in_seconds": 300})
    report = await redrive(load_redrive_target(healthy, dynamic, "deliver/http", dead), dead)
    assert len(report.delivered) == len(records)
    assert Counter({request_id: len(batch) for request_id, batch in up.batches}) == batches
    assert [record for _, batch in up.batches for record in batch] == records
    assert len((await redrive(load_redrive_target(healthy, dynamic, "deliver/http", dead), dead)).delivered) == 0
    assert len(up.batches) == len(batches)


class BulkEndpoint:
    """Answers every POST with ``status``; records (Idempotency-Key, JSON lines) of each."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.batches: list[tuple[str, list[bytes]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.batches.append((request.headers["Idempotency-Key"], (await request.read()).splitlines()))
        return web.Response(status=self.status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/bulk", self.handle)
        return app


async def test_batching_letters_are_redriven_as_their_batches_under_the_same_keys(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    down = BulkEndpoint(500)
    dead = tmp_path / "dead.jsonl"
    payloads = [None if i % 9 == 0 else f'{{"flight":{i}}}' for i in range(120)]
    spec, dynamic = payload_spec(tmp_path, f"{await serve_app(down.app())}/bulk", payloads,
                                 dynamic_parameters=ONE_ATTEMPT)
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"] = {
        "sink_class_name": "batching_http", "input_stream_ids": ["requests"],
        "parameters": {"url": document["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"],
                       "payload_column": "payload", "max_events": 25, "dead_letter_path": str(dead)}}
    spec.write_text(yaml.safe_dump(document))
    pipeline = await run_pipeline(spec, dynamic, tmp_path / "state")
    letters, _ = read_dead_letters(dead)
    records = [p.encode() for p in payloads if p is not None]
    assert [letter.payload for letter in letters] == records
    assert pipeline.metrics.total("egress_sink_dead_letters_total") == len(records)
    assert letters[0].attempts[0].status == 500
    batches = Counter(letter.idempotency_key for letter in letters)
    assert batches == Counter({key: len(lines) for key, lines in down.batches})

    up = BulkEndpoint(200)
    healthy = pointed_at(spec, f"{await serve_app(up.app())}/bulk", max_events=1000)
    report = await redrive(load_redrive_target(healthy, dynamic, "deliver/http", dead), dead)
    assert len(report.delivered) == len(records)
    assert Counter({key: len(lines) for key, lines in up.batches}) == batches, "re-formed under the same keys"
    assert sorted(line for _, lines in up.batches for line in lines) == sorted(records)  # batches run concurrently
    assert len((await redrive(load_redrive_target(healthy, dynamic, "deliver/http", dead), dead)).delivered) == 0


async def test_webhook_letters_are_redriven_to_their_own_urls_signed_with_their_webhook_ids(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    """A url_column webhook sink against endpoints answering 429 (Retry-After ignored): 5 letters;
    redrive, once the endpoints answer 200, sends each to its own URL, signed, under its webhook-id, once."""
    import base64

    import orjson
    from standardwebhooks.webhooks import Webhook

    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    (tmp_path / "secret").write_text(secret + "\n")
    got: list[tuple[str, str, str]] = []  # (path, webhook-id, body)
    healthy = False

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        Webhook(secret).verify(body, dict(request.headers), json_parse=False)
        if not healthy:
            return web.Response(status=429, headers={"Retry-After": "3600"})
        got.append((request.path, request.headers["webhook-id"], body.decode()))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hooks/{name}", handle)
    base = await serve_app(app)
    urls = [f"{base}/hooks/a", f"{base}/hooks/b"]
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": i, "url": urls[i % 2], "payload": f"p{i}"}) + b"\n"
                             for i in range(5)))
    row = [{"name": "url", "type": "string"}, {"name": "payload", "type": "string"}]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "pipeline": "webhooks", "partition_count": 1,
        "streams": {"events": {"schema": [{"name": "id", "type": "int64", "required": True}, *row],
                               "group_by": ["id"]},
                    "requests": {"schema": row}},
        "sources": {"rows": {"source_class_name": "jsonl", "output_stream_id": "events",
                             "parameters": {"path": str(data)}}},
        "computations": {"c": {"processing_function": "tests.pipelines:PassthroughUrl",
                               "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
                               "sinks": {"hooks": {"sink_class_name": "webhook_http", "input_stream_ids": ["requests"],
                                                   "parameters": {"url_column": "url", "payload_column": "payload",
                                                                  "dead_letter_path": "whdl.jsonl"}}}}}}))
    dynamic = tmp_path / "dyn.yaml"
    dynamic.write_text(yaml.safe_dump({"computations": {"c": {"sinks": {"hooks": {"parameters": {
        "max_attempt_count": 2, "respect_retry_after": False, "retry_initial_delay": "10ms",
        "retry_minimum_delay": "10ms", "retry_maximum_delay": "20ms",
        "breaker": {"minimum_requests": 1000},  # no pause: each delivery exhausts its attempts
        "defaults": {"secret_file": str(tmp_path / "secret")}}}}}}}))
    dead = tmp_path / "whdl.jsonl"
    await run_pipeline(spec, dynamic, tmp_path / "state")
    letters, _ = read_dead_letters(dead)
    assert sorted(letter.endpoint or "" for letter in letters) == sorted(urls[i % 2] for i in range(5))

    healthy = True
    first = await redrive(load_redrive_target(spec, dynamic, "c/hooks", dead), dead)
    assert first.ok, first.failed
    assert sorted(got) == sorted((f"/hooks/{'ab'[i % 2]}", letter.idempotency_key, f"p{i}")
                                 for letter in letters for i in [int(letter.payload.decode()[1:])])
    assert len(redrive_record_path(dead).read_text().splitlines()) == 5
    second = await redrive(load_redrive_target(spec, dynamic, "c/hooks", dead), dead)
    assert (len(second.delivered), second.already_redriven) == (0, 5)
    assert len(got) == 5
