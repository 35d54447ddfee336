"""Shared fixtures: real HTTP servers on loopback and small pipelines written to disk."""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.nats_server import NatsCluster, NatsServer, nats_url, stop_nats_server
from tests.waiting import eventually, eventually_sync, exited

__all__ = ["eventually", "eventually_sync", "exited"]  # every wait of the tests (tests/waiting.py)

REPO = Path(__file__).resolve().parents[1]
JANUARY = REPO / "examples" / "http_delivery" / "data" / "flights-2013-01.csv.gz"

ServerFactory = Callable[[web.Application], Awaitable[str]]


@pytest.fixture(scope="session", autouse=True)
def _nats_server_stops_at_the_end() -> Iterator[None]:
    """The tests' nats-server (tests/nats_server.py) starts on first use; it is stopped here, by pid."""
    yield
    stop_nats_server()


@pytest.fixture(scope="session")
def nats_server() -> str:
    """The URL of a real nats-server with JetStream on loopback, shared by the session."""
    return nats_url()


@pytest.fixture
def own_nats_server() -> Iterator[NatsServer]:
    """A nats-server of this test alone (it may be SIGKILLed and restarted on its store), stopped by pid."""
    started = NatsServer().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster on loopback of this test alone, stopped by pid at the end."""
    started = NatsCluster(3).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def egress_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The ``egress run`` processes a test starts; any still running at the end is killed (a
    stopped one too: SIGKILL ends a SIGSTOPped process)."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
async def serve_app() -> AsyncIterator[ServerFactory]:
    """Start aiohttp applications on 127.0.0.1 (free ports); yields a function returning the base URL."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]  # its one site's bound (host, port)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def state_contents(state: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the state directory ``state``, read only (to prove a refused
    run changed nothing)."""
    db = sqlite3.connect(f"{(state / 'egress.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: sorted(db.execute(f"SELECT * FROM {table}").fetchall()) for table in tables}
    finally:
        db.close()


def january_rows(limit: int) -> str:
    """The header and the first ``limit`` January flights, as CSV text."""
    with gzip.open(JANUARY, "rt", newline="") as text:
        lines = [next(text) for _ in range(limit + 1)]
    return "".join(lines)


def payload_spec(
    tmp_path: Path,
    url: str,
    payloads: list[str | None],
    *,
    partition_count: int = 1,
    sink_parameters: dict[str, Any] | None = None,
    dynamic_parameters: dict[str, Any] | None = None,
    processing_function: str = "tests.pipelines:Passthrough",
) -> tuple[Path, Path]:
    """Write a JSONL source of ``payloads`` and a spec delivering them to ``url``, by default
    unchanged (``processing_function`` tests.pipelines:Passthrough).

    Returns ``(spec path, dynamic spec path)``.
    """
    import orjson

    data = tmp_path / "payloads.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": i, "payload": p}) + b"\n" for i, p in enumerate(payloads)))
    spec = {
        "pipeline": "test_pipeline",
        "partition_count": partition_count,
        "streams": {
            "events": {"schema": [{"name": "id", "type": "int64", "required": True},
                                  {"name": "payload", "type": "string"}], "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string"}]},
        },
        "sources": {"events_jsonl": {"source_class_name": "jsonl", "output_stream_id": "events",
                                     "parameters": {"path": str(data)}}},
        "computations": {"deliver": {
            "processing_function": processing_function,
            "input_stream_ids": ["events"],
            "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": url, "payload_column": "payload", **(sink_parameters or {})}}},
        }},
    }
    dynamic = {"computations": {"deliver": {"sinks": {"http": {"parameters": {
        "retry_initial_delay": "10ms", "retry_minimum_delay": "10ms", "retry_maximum_delay": "50ms",
        **(dynamic_parameters or {})}}}}}}
    spec_path = tmp_path / "spec.yaml"
    dynamic_path = tmp_path / "dynamic.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    dynamic_path.write_text(yaml.safe_dump(dynamic))
    return spec_path, dynamic_path


def pass_through_spec(path: Path, pipeline: str, source: dict[str, Any], url: str, *,
                      extra_columns: tuple[str, ...] = (), headers: dict[str, str] | None = None) -> Path:
    """Write to ``path`` a Spec reading ``source`` (``source_class_name`` and ``parameters``) into
    ``events`` (``id`` int64, ``payload`` string and the ``extra_columns``, strings; keyed by ``id``)
    and POSTing each ``payload`` unchanged to ``url`` (with ``headers``); returns ``path``."""
    columns = [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"},
               *({"name": name, "type": "string"} for name in extra_columns)]
    sink = {"url": url, "payload_column": "payload", **({"headers": headers} if headers else {})}
    spec = {
        "pipeline": pipeline,
        "partition_count": 2,
        "streams": {"events": {"schema": columns, "group_by": ["id"]},
                    "requests": {"schema": [{"name": "payload", "type": "string"}]}},
        "sources": {"input": {"output_stream_id": "events", **source}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough",
            "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"], "parameters": sink}},
        }},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def payload_key(tmp_path: Path, position: int, depth: int = 1) -> str:
    """The idempotency key of the message that ``depth`` computations derive, one output each, from
    record ``position`` of :func:`payload_spec`'s source (written in ``tmp_path``)."""
    from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope

    message_id = source_message_id(source_scope("test_pipeline", "events_jsonl", str(tmp_path / "payloads.jsonl")),
                                   0, position)
    for _ in range(depth):
        message_id = derived_message_id(message_id, 0)
    return idempotency_key(message_id)
