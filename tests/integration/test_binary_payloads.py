"""Binary payloads through whole pipelines (one process, real loopback servers): Flow's ``string`` is
a byte string, so a process function may emit ``bytes`` for a string column, and both sinks must
send them byte for byte (all 256 byte values, NUL and invalid UTF-8 included), through the log
and the outbox, after a restart as well; a value no encoding can store fails its message with an
error naming where it came from."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
from pathlib import Path

import orjson
import pytest
import yaml
from aiohttp import web

import egress.connectors.sinks.firehose_http  # noqa: F401  (registers firehose_http)
from egress.engines.sqlite import read_outbox
from egress.errors import RowEncodingError
from egress.firehose import FirehoseReceiver
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from tests.conftest import ServerFactory, payload_key, payload_spec
from tests.pipelines import expected_body

pytestmark = pytest.mark.integration
MESSAGES = 300


class Bodies:
    """An HTTP endpoint that keeps every body it answers 2xx by idempotency key; answers 503
    (keeping nothing) while ``failing``."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        self.failing = False
        self.app = web.Application()
        self.app.router.add_post("/events", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.failing:
            return web.Response(status=503)
        self.bodies.setdefault(request.headers["Idempotency-Key"], []).append(body)
        return web.Response(text="ok")


async def run(spec: Path, dynamic: Path, state: Path) -> RunResult:
    return await Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True)).run()


def through_the_log(spec_path: Path) -> None:
    """Make the spec's pipeline two computations: ``encode`` emits the binary payloads to stream
    ``binary`` (stored in the log), ``deliver`` passes them on to its sink."""
    spec = yaml.safe_load(spec_path.read_text())
    spec["streams"]["binary"] = {"schema": [{"name": "payload", "type": "string"}]}
    spec["computations"]["encode"] = {"processing_function": "tests.pipelines:EmitsBinaryToLog",
                                      "input_stream_ids": ["events"], "output_stream_ids": ["binary"]}
    spec["computations"]["deliver"]["processing_function"] = "tests.pipelines:Passthrough"
    spec["computations"]["deliver"]["input_stream_ids"] = ["binary"]
    spec_path.write_text(yaml.safe_dump(spec))


@pytest.mark.parametrize("partition_count", [1, 3])
async def test_the_http_sink_posts_bytes_emitted_for_a_string_column_byte_for_byte(
        tmp_path: Path, serve_app: ServerFactory, partition_count: int) -> None:
    endpoint = Bodies()
    base = await serve_app(endpoint.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [None] * MESSAGES, partition_count=partition_count,
                                 processing_function="tests.pipelines:EmitsBinary")
    result = await run(spec, dynamic, tmp_path / "state")
    assert result.ok, result.error
    assert result.drained
    assert endpoint.bodies == {payload_key(tmp_path, i): [expected_body(i)] for i in range(MESSAGES)}


async def test_bytes_read_back_exactly_from_the_log_by_a_downstream_computation(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    endpoint = Bodies()
    base = await serve_app(endpoint.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [None] * MESSAGES, partition_count=2)
    through_the_log(spec)
    result = await run(spec, dynamic, tmp_path / "state")
    assert result.ok, result.error
    assert endpoint.bodies == {payload_key(tmp_path, i, depth=2): [expected_body(i)] for i in range(MESSAGES)}


async def test_the_committed_outbox_resent_after_a_restart_keeps_its_bytes(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    endpoint = Bodies()
    endpoint.failing = True
    base = await serve_app(endpoint.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [None] * 40,
                                 processing_function="tests.pipelines:EmitsBinary",
                                 dynamic_parameters={"max_attempt_count": 2})
    first = await run(spec, dynamic, tmp_path / "state")
    assert not first.drained  # every POST failed: the outbox holds all 40, committed
    endpoint.failing = False
    second = await run(spec, dynamic, tmp_path / "state")
    assert second.drained, second.error
    assert endpoint.bodies == {payload_key(tmp_path, i): [expected_body(i)] for i in range(40)}


async def test_a_directory_whose_outbox_holds_json_rows_still_delivers_them(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    """An earlier egress stored rows as JSON (layout version 1): its undelivered outbox must go out
    unchanged, under the same idempotency keys, from the new version, next to new MessagePack rows."""
    endpoint = Bodies()
    endpoint.failing = True
    base = await serve_app(endpoint.app)
    payloads = [f"text {i} \u00e9\u2603" for i in range(30)]
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", payloads, dynamic_parameters={"max_attempt_count": 1})
    state = tmp_path / "state"
    assert not (await run(spec, dynamic, state)).drained
    stored = read_outbox(state)
    assert len(stored) == 30
    database = sqlite3.connect(state / "egress.sqlite3")  # as layout version 1 wrote it: a JSON row per message
    with database:
        database.execute("DELETE FROM outbox_batches")
        database.execute(
            "CREATE TABLE outbox (consumer TEXT NOT NULL, partition INTEGER NOT NULL, seq INTEGER NOT NULL, "
            "stream TEXT NOT NULL, message_id BLOB NOT NULL, key BLOB NOT NULL, event_timestamp REAL, "
            "row BLOB NOT NULL, PRIMARY KEY (consumer, partition, seq)) WITHOUT ROWID")
        database.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             [(c, p, m.seq, m.stream, m.message_id, m.key, m.event_timestamp, orjson.dumps(m.row))
                              for c, p, m in stored])
        database.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    database.close()
    endpoint.failing = False
    more = [*payloads, *(f"new {i}" for i in range(10))]
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", more)
    result = await run(spec, dynamic, state)
    assert result.drained, result.error
    assert endpoint.bodies == {payload_key(tmp_path, i): [p.encode()] for i, p in enumerate(more)}
    database = sqlite3.connect(state / "egress.sqlite3")
    assert database.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
    database.close()


async def test_the_firehose_sink_sends_bytes_as_record_data_byte_for_byte(tmp_path: Path) -> None:
    records: list[bytes] = []

    async def keep(request_id: str, batch: list[bytes], attributes: dict[str, str]) -> None:
        records.extend(batch)

    runner = web.AppRunner(FirehoseReceiver(keep).app, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        spec_path, dynamic = payload_spec(tmp_path, url, [None] * MESSAGES,
                                          processing_function="tests.pipelines:EmitsBinary")
        spec = yaml.safe_load(spec_path.read_text())
        spec["computations"]["deliver"]["sinks"]["http"] = {
            "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
            "parameters": {"url": url, "payload_column": "payload", "stream_name": "binary",
                           "content_encoding": "gzip", "buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 0}}}
        spec_path.write_text(yaml.safe_dump(spec))
        dynamic.write_text("{}")
        result = await run(spec_path, dynamic, tmp_path / "state")
    finally:
        await runner.cleanup()
    assert result.ok, result.error
    assert result.drained
    assert records == [expected_body(i) for i in range(MESSAGES)]  # one partition: in input order
    assert hashlib.sha256(b"".join(records)).digest() == hashlib.sha256(
        b"".join(expected_body(i) for i in range(MESSAGES))).digest()


async def test_a_string_no_encoding_can_store_fails_the_run_naming_computation_stream_column_and_message(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    endpoint = Bodies()
    base = await serve_app(endpoint.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(10)],
                                 processing_function="tests.pipelines:EmitsSurrogates")
    result = await run(spec, dynamic, tmp_path / "state")
    assert isinstance(result.error, RowEncodingError)
    message = str(result.error)
    assert "computation 'deliver' partition 0" in message
    assert f"message {payload_key(tmp_path, 3)} to stream 'requests'" in message
    assert "column 'payload' cannot be stored" in message
    assert "surrogates" in message
    assert "nothing from this batch was committed" in message
    assert (result.error.stream, result.error.column) == ("requests", "payload")
    assert endpoint.bodies == {}  # the batch holding it was not committed, so nothing of it was sent


async def test_state_dump_prints_bytes_of_external_state_as_base64_under_a_marker(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    from typer.testing import CliRunner

    from egress.cli.state import app as state_app
    from tests.pipelines import binary_payload

    endpoint = Bodies()
    base = await serve_app(endpoint.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [None] * 20, partition_count=2,
                                 processing_function="tests.pipelines:RemembersBinary")
    result = await run(spec, dynamic, tmp_path / "state")
    assert result.drained, result.error
    dumped = CliRunner().invoke(state_app, ["dump", str(tmp_path / "state")])
    assert dumped.exit_code == 0, dumped.output
    lines = [orjson.loads(line) for line in dumped.output.splitlines()]
    assert {line["key"][0]: base64.b64decode(line["row"]["payload"]["$bytes"]) for line in lines} == {
        i: binary_payload(i) for i in range(20)}
    assert {(line["kind"], line["table"]) for line in lines} == {("external", "/payloads")}
