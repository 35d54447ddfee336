"""The firehose_http sink against the egress receiver and a scripted strict endpoint, on loopback
(real sockets, real libcurl). Backoff timing runs on the virtual clock."""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from egress.clock import Clock, RealClock, VirtualClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.batches import decode_batch_ends, encode_batch_ends
from egress.connectors.sinks.firehose_http import FirehoseHttpSink, batch_request_id, curl_transport
from egress.connectors.sinks.firehose_parameters import FirehoseHttpSinkDynamicParameters, FirehoseHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.firehose import FirehoseReceiver, FirehoseRequest, ReceiverOptions
from egress.firehose import protocol as p
from egress.firehose.retry import INITIAL_BACKOFF_SECONDS, JITTER_RATIO, MAX_BACKOFF_SECONDS
from egress.httpclient import Request, Response
from egress.httpclient.backoff import DoublingBackoff
from egress.observe import Metrics, StatusTree
from tests.conftest import ServerFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAST = {"retry_initial_delay": "10ms", "retry_maximum_delay": "40ms"}
ARN = "arn:aws:firehose:local:000000000000:deliverystream/flights"


@dataclass
class Seen:
    """One request as the strict endpoint saw it."""

    headers: dict[str, str]
    document: dict[str, Any]
    records: list[bytes]


Script = Callable[[int, str], Awaitable[web.Response]]


@dataclass
class StrictEndpoint:
    """Checks every request against the protocol, records it, and answers ``script(attempt, request_id)``."""

    script: Script | None = None
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = gzip.decompress(raw) if request.headers.get("Content-Encoding") == "gzip" else raw
        FirehoseRequest.model_validate_json(body)  # the body conforms to the request schema
        document = json.loads(body)
        records = [base64.b64decode(r["data"], validate=True) for r in document["records"]]
        self.seen.append(Seen(dict(request.headers), document, records))
        request_id = request.headers["X-Amz-Firehose-Request-Id"]
        if self.script is not None:
            return await self.script(len(self.seen), request_id)
        return conforming(request_id)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=p.MAX_REQUEST_BODY_BYTES)
        app.router.add_post("/ingest", self.handle)
        return app


def conforming(request_id: str) -> web.Response:
    return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000})


def make_sink(url: str, *, static: dict[str, Any] | None = None, dynamic: dict[str, Any] | None = None,
              clock: Clock | None = None, progress: SinkProgress | None = None, seed: int = 1,
              transport: Any = curl_transport, commits: bool = True) -> tuple[FirehoseHttpSink, Metrics, StatusTree]:
    metrics = Metrics()
    status = StatusTree()
    sinks: list[FirehoseHttpSink] = []

    def commit_at_once(progress: SinkProgress) -> None:
        """A partition job that commits the sink's progress (and batch ends) the moment it is reported."""
        if sinks:
            asyncio.get_running_loop().call_soon(lambda: sinks[0].committed(progress))

    context = SinkContext("deliver", "firehose", 0, clock or RealClock(), metrics, status,
                          commit_at_once if commits else lambda _progress: None)
    parameters = FirehoseHttpSinkParameters.model_validate({
        "url": url, "payload_column": "payload", "stream_name": "flights",
        "buffering_hints": {"size_in_mbs": 5, "interval_in_seconds": 0}, **(static or {})})
    dynamic_parameters = FirehoseHttpSinkDynamicParameters.model_validate({**FAST, **(dynamic or {})})
    sink = FirehoseHttpSink(context, parameters, dynamic_parameters, progress or SinkProgress(),
                            transport_factory=transport, rng=random.Random(seed))
    sinks.append(sink)
    return sink, metrics, status


def messages(payloads: list[Any], first_seq: int = 1) -> list[OutboxMessage]:
    return [OutboxMessage(first_seq + i, "requests", f"message-{first_seq + i:08d}".encode(), b"[]", None,
                          {"payload": value}) for i, value in enumerate(payloads)]


# --------------------------------------------------------------------------------- against the receiver


async def test_delivers_to_the_egress_receiver_with_gzip_key_and_attributes(
        serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FH_SINK_KEY", "k-123")
    stored: list[tuple[str, list[bytes], dict[str, str]]] = []

    async def handle(request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        stored.append((request_id, records, attributes))

    receiver = FirehoseReceiver(handle, ReceiverOptions(access_keys=("k-123",)))
    runner = web.AppRunner(receiver.app, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        payloads: list[Any] = [f'{{"n":{i}}}' for i in range(50)]
        payloads[7] = None
        payloads[8] = ""
        sink, metrics, _ = make_sink(url, static={
            "content_encoding": "gzip", "access_key": {"env": "FH_SINK_KEY"},
            "common_attributes": {"pipeline": "flights"}})
        sink.distribute(messages(payloads[:30]))
        sink.distribute(messages(payloads[30:], first_seq=31))
        await eventually(lambda: sink.progress().max_persisted_seq_no == 50)
        await sink.close()
    finally:
        await runner.cleanup()
    assert all(attributes == {"pipeline": "flights"} for _, _, attributes in stored)
    assert len(stored) == 2  # interval 0: one batch per distribute call; they may arrive in either order
    by_id = {request_id: records for request_id, records, _ in stored}
    first = by_id[batch_request_id("deliver/firehose", b"message-00000001", b"message-00000030")]
    assert first == [v.encode() for v in payloads[:30] if v is not None]
    (second,) = [records for request_id, records in by_id.items() if records is not first]
    assert second == [v.encode() for v in payloads[30:]]
    assert metrics.value("egress_sink_records_delivered_total", sink_id="firehose") == 49
    assert metrics.value("egress_sink_responses_total", sink_id="firehose", status_code="200") == 2
    assert receiver.stats.by_status == {200: 2}


# ---------------------------------------------------------------------------------- the request shape


async def test_exact_headers_and_body(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["hello", "hello world"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 2)
    await sink.close()
    (seen,) = endpoint.seen
    assert seen.records == [b"hello", b"hello world"]
    headers = seen.headers
    assert headers["X-Amz-Firehose-Protocol-Version"] == "1.0"
    assert headers["X-Amz-Firehose-Source-Arn"] == ARN
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) > 0
    for absent in ("Content-Encoding", "X-Amz-Firehose-Access-Key", "X-Amz-Firehose-Common-Attributes", "Expect"):
        assert absent not in headers
    assert seen.document["requestId"] == headers["X-Amz-Firehose-Request-Id"]
    assert isinstance(seen.document["timestamp"], int)
    assert seen.document["timestamp"] > 1_600_000_000_000


async def test_batches_respect_the_record_limit_and_the_size_hint(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["x"] * 25_000))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 25_000)
    assert sorted(len(s.records) for s in endpoint.seen) == [5_000, 10_000, 10_000]
    await sink.close()

    sized = StrictEndpoint()
    base = await serve_app(sized.app())
    big = "y" * 300_000
    sink, _, _ = make_sink(f"{base}/ingest", static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 0}})
    sink.distribute(messages([big] * 10))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 10)
    await sink.close()
    assert all(sum(map(len, s.records)) <= 1024 * 1024 for s in sized.seen)
    assert sum(len(s.records) for s in sized.seen) == 10
    assert len(sized.seen) == 4  # 3 records (900,000 bytes) fit in 1 MiB, a fourth does not


async def test_interval_closes_a_partial_batch(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    clock = VirtualClock(start=1_700_000_000.0)
    async with clock.autojumping():
        sink, _, _ = make_sink(f"{base}/ingest", clock=clock,
                               static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 60}})
        sink.distribute(messages(["a", "b"]))
        sink.distribute(messages(["c"], first_seq=3))
        assert endpoint.seen == []
        assert sink.oldest_undelivered_age() == 0.0
        await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
        assert clock.monotonic() >= 1_700_000_060.0
        await sink.close()
    assert [s.records for s in endpoint.seen] == [[b"a", b"b", b"c"]]


# --------------------------------------------------------------------------------------- acceptance


async def test_request_id_is_stable_across_retries_and_instances(serve_app: ServerFactory) -> None:
    async def fail_twice(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1}, status=503) if attempt <= 2 \
            else conforming(request_id)

    endpoint = StrictEndpoint(fail_twice)
    base = await serve_app(endpoint.app())
    sink, metrics, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["a", "b", "c"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    await sink.close()
    ids = {s.headers["X-Amz-Firehose-Request-Id"] for s in endpoint.seen}
    assert len(endpoint.seen) == 3
    assert ids == {batch_request_id("deliver/firehose", b"message-00000001", b"message-00000003")}
    assert metrics.value("egress_sink_retries_total", sink_id="firehose") == 2

    # a new instance (a restart before progress was committed) sends the same batch with the same id
    again = StrictEndpoint()
    base = await serve_app(again.app())
    sink, _, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["a", "b", "c"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    await sink.close()
    assert {s.headers["X-Amz-Firehose-Request-Id"] for s in again.seen} == ids


def wrong_answer(wrong: str, request_id: str) -> web.Response:
    """A 200 (or other answer) that breaks one rule of the protocol's success response."""
    good = json.dumps({"requestId": request_id, "timestamp": 1_700_000_000_000}).encode()
    if wrong == "openobserve":  # openobserve #1831
        return web.json_response({"code": 200, "status": [{"name": "default", "successful": 1, "failed": 0}]})
    if wrong == "mismatch":
        return web.json_response({"requestId": "otherId", "timestamp": 1_700_000_000_000})
    if wrong == "seconds":  # Telegraf, Alloy, moto and LocalStack answer seconds
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000})
    if wrong == "string-timestamp":
        return web.json_response({"requestId": request_id, "timestamp": "1700000000000"})
    if wrong == "gzip":  # a correct body, gzip'd and labelled so
        return web.Response(body=gzip.compress(good), content_type="application/json",
                            headers={"Content-Encoding": "gzip"})
    if wrong == "gzip-label":  # a correct plain body: only the Content-Encoding header is wrong
        return web.Response(body=good, content_type="application/json", headers={"Content-Encoding": "gzip"})
    if wrong == "identity":  # "MUST NOT be used": not even identity
        return web.Response(body=good, content_type="application/json", headers={"Content-Encoding": "identity"})
    if wrong == "text-plain":  # a correct body under the wrong Content-Type
        return web.Response(body=good, content_type="text/plain")
    if wrong == "201":
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000}, status=201)
    assert wrong == "302"
    return web.Response(status=302, headers={"Location": "/elsewhere"})


WRONG = ["openobserve", "mismatch", "seconds", "string-timestamp", "gzip", "gzip-label", "identity", "text-plain",
         "201", "302"]


async def one_attempt_to_the_error_output(serve_app: ServerFactory, tmp_path: Path,
                                          script: Script) -> tuple[dict[str, Any], Metrics]:
    """One record through a sink with ``retry_duration: 0`` and an error output, against an endpoint
    answering ``script``: asserts exactly one request was made and returns the one error line."""
    endpoint = StrictEndpoint(script)
    base = await serve_app(endpoint.app())
    errors = tmp_path / "errors.jsonl"
    sink, metrics, _ = make_sink(f"{base}/ingest", static={"retry_duration": 0, "error_output": str(errors)})
    sink.distribute(messages(["only"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()
    assert len(endpoint.seen) == 1
    (line,) = [json.loads(text) for text in errors.read_text().splitlines()]
    return line, metrics


@pytest.mark.parametrize("wrong", WRONG)
async def test_non_conforming_success_is_retried(serve_app: ServerFactory, wrong: str) -> None:
    async def first_wrong(attempt: int, request_id: str) -> web.Response:
        return conforming(request_id) if attempt > 1 else wrong_answer(wrong, request_id)

    endpoint = StrictEndpoint(first_wrong)
    base = await serve_app(endpoint.app())
    sink, metrics, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["a"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()
    assert len(endpoint.seen) == 2
    assert len({s.headers["X-Amz-Firehose-Request-Id"] for s in endpoint.seen}) == 1
    assert metrics.value("egress_sink_retries_total", sink_id="firehose") == 1
    assert metrics.value("egress_sink_records_delivered_total", sink_id="firehose") == 1


@pytest.mark.parametrize(("wrong", "code", "message"), [
    ("openobserve", "HttpEndpoint.InvalidResponseFromDestination", '{"code": 200'),
    ("mismatch", "HttpEndpoint.InvalidResponseFromDestination", "otherId"),
    ("seconds", "HttpEndpoint.InvalidResponseFromDestination", "1700000000}"),
    ("gzip", "HttpEndpoint.InvalidResponseFromDestination", "response has Content-Encoding 'gzip'"),
    ("gzip-label", "HttpEndpoint.InvalidResponseFromDestination", "response has Content-Encoding 'gzip'"),
    ("text-plain", "HttpEndpoint.InvalidResponseFromDestination", "requestId"),
    ("201", "HttpEndpoint.DestinationException", "requestId"),
])
async def test_a_non_conforming_answer_is_a_failure_in_the_error_output(
        serve_app: ServerFactory, tmp_path: Path, wrong: str, code: str, message: str) -> None:
    """With ``retry_duration: 0`` the one failed attempt ends in the error output, naming why."""
    async def always_wrong(attempt: int, request_id: str) -> web.Response:
        return wrong_answer(wrong, request_id)

    line, metrics = await one_attempt_to_the_error_output(serve_app, tmp_path, always_wrong)
    assert line["errorCode"] == code
    assert message in line["errorMessage"]
    assert metrics.value("egress_sink_records_delivered_total", sink_id="firehose") == 0


RAW_HEAD = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n"


async def serve_raw(answer: Callable[[str], bytes]) -> tuple[str, asyncio.Server, list[str]]:
    """A loopback HTTP/1.1 server that writes ``answer(request_id)`` byte for byte (headers aiohttp
    would add or fix, e.g. a missing Content-Type, cannot be produced with it)."""
    seen: list[str] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                await reader.readexactly(int(headers["content-length"]))
                seen.append(headers["x-amz-firehose-request-id"])
                writer.write(answer(headers["x-amz-firehose-request-id"]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}/ingest", server, seen


def raw_json(request_id: str, head: str) -> bytes:
    body = json.dumps({"requestId": request_id, "timestamp": 1_700_000_000_000}).encode()
    return (RAW_HEAD + head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@pytest.mark.parametrize(("head", "accepted"), [
    ("Content-Type: application/json\r\n", True),
    ("content-type: Application/JSON; charset=utf-8\r\n", True),
    ("", False),                                                        # no Content-Type at all
    ("Content-Type: application/jsonx\r\n", False),
    ("Content-Type: application/json\r\nContent-Encoding:\r\n", False),  # present, even empty
    ("Content-Type: application/json\r\nContent-Encoding: GZIP\r\n", False),
])
async def test_response_headers_as_sent(head: str, accepted: bool) -> None:
    """The Content-Type and Content-Encoding rules on exact bytes: accepted at the first attempt or
    retried (the second attempt answers conforming)."""
    def answer(request_id: str) -> bytes:
        return raw_json(request_id, head if len(seen) == 1 else "Content-Type: application/json\r\n")

    url, server, seen = await serve_raw(answer)
    try:
        sink, metrics, _ = make_sink(url)
        sink.distribute(messages(["a"]))
        await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
        await sink.close()
    finally:
        server.close()
        await server.wait_closed()
    assert len(seen) == (1 if accepted else 2)
    assert metrics.value("egress_sink_retries_total", sink_id="firehose") == (0 if accepted else 1)


async def test_a_chunked_conforming_answer_is_accepted() -> None:
    """Content-Length is not part of the success rule: a chunked 200 (a proxy's) that conforms is accepted."""
    def answer(request_id: str) -> bytes:
        body = json.dumps({"requestId": request_id, "timestamp": 1_700_000_000_000}).encode()
        return (RAW_HEAD + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode() \
            + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"

    url, server, seen = await serve_raw(answer)
    try:
        sink, _, _ = make_sink(url)
        sink.distribute(messages(["a"]))
        await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
        await sink.close()
    finally:
        server.close()
        await server.wait_closed()
    assert len(seen) == 1


async def test_413_goes_to_the_error_output_once(serve_app: ServerFactory, tmp_path: Path) -> None:
    async def too_large(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000,
                                  "errorMessage": 'too "large"'}, status=413)

    endpoint = StrictEndpoint(too_large)
    base = await serve_app(endpoint.app())
    errors = tmp_path / "errors.jsonl"
    sink, metrics, _ = make_sink(f"{base}/ingest", static={"error_output": str(errors)})
    sink.distribute(messages(["first", None, "second"]))
    # the batch is handled: its task has ended
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    await sink.close()
    assert len(endpoint.seen) == 1
    assert metrics.value("egress_sink_requests_total", sink_id="firehose") == 1
    assert metrics.value("egress_sink_retries_total", sink_id="firehose") == 0
    lines = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [base64.b64decode(line["rawData"]) for line in lines] == [b"first", b"second"]
    for line in lines:
        assert set(line) == {"attemptsMade", "arrivalTimestamp", "errorCode", "errorMessage",
                             "attemptEndingTimestamp", "rawData"}
        assert line["attemptsMade"] == 1
        assert line["errorCode"] == "HttpEndpoint.DestinationException"
        assert json.loads(line["errorMessage"])["errorMessage"] == 'too "large"'
        assert line["attemptEndingTimestamp"] >= line["arrivalTimestamp"] > 1_600_000_000_000
    assert metrics.value("egress_sink_error_output_records_total", sink_id="firehose") == 2


async def test_retry_duration_zero_means_one_attempt(serve_app: ServerFactory, tmp_path: Path) -> None:
    async def unavailable(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000}, status=503)

    line, _ = await one_attempt_to_the_error_output(serve_app, tmp_path, unavailable)
    assert line["attemptsMade"] == 1


async def test_without_error_output_an_exhausted_batch_stops_the_sink(serve_app: ServerFactory) -> None:
    async def unavailable(attempt: int, request_id: str) -> web.Response:
        return web.Response(status=500, text="boom")

    endpoint = StrictEndpoint(unavailable)
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest", static={"retry_duration": 0})
    sink.distribute(messages(["a"]))
    sink.distribute(messages(["b"], first_seq=2))
    await eventually(lambda: sink.terminal_error is not None)
    await sink.close()
    assert "HttpEndpoint.DestinationException: HTTP 500: boom" in (sink.terminal_error or "")
    assert sink.progress().max_persisted_seq_no == 0


class TimedTransport:
    """The real libcurl client, noting the virtual time at which each attempt starts."""

    def __init__(self, clock: Clock, parameters: FirehoseHttpSinkParameters) -> None:
        self.clock = clock
        self.inner = curl_transport("http", parameters)
        self.starts: list[float] = []

    def submit(self, request: Request) -> asyncio.Future[Response]:
        self.starts.append(self.clock.monotonic())
        return self.inner.submit(request)

    def close(self) -> None:
        self.inner.close()


async def test_backoff_sequence_on_the_virtual_clock(serve_app: ServerFactory, tmp_path: Path) -> None:
    async def unavailable(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000}, status=503)

    endpoint = StrictEndpoint(unavailable)
    base = await serve_app(endpoint.app())
    clock = VirtualClock(start=1_700_000_000.0)
    transports: list[TimedTransport] = []

    def factory(scheme: str, parameters: FirehoseHttpSinkParameters) -> TimedTransport:
        transports.append(TimedTransport(clock, parameters))
        return transports[-1]

    async with clock.autojumping():
        sink, _, _ = make_sink(f"{base}/ingest", clock=clock, seed=42, transport=factory,
                               dynamic={"retry_initial_delay": "1s", "retry_maximum_delay": "120s"},
                               static={"retry_duration": 600, "error_output": str(tmp_path / "e.jsonl")})
        sink.distribute(messages(["a"]))
        await eventually(lambda: sink.progress().max_persisted_seq_no == 1, timeout=60)
        await sink.close()
    starts = transports[0].starts
    waits = [later - earlier for earlier, later in itertools.pairwise(starts)]
    rng = random.Random(42)
    backoff = DoublingBackoff(INITIAL_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, JITTER_RATIO)
    expected = [backoff.seconds(n, rng.uniform(-1.0, 1.0)) for n in range(len(waits) + 1)]
    assert waits == pytest.approx(expected[:len(waits)], abs=1e-6)
    for n, wait in enumerate(waits):
        assert 0.85 * min(120, 2 ** n) <= wait <= 1.15 * min(120, 2 ** n)
    assert sum(waits) <= 600 < sum(waits) + expected[len(waits)]  # the next retry would start after 600 s
    assert len(endpoint.seen) == len(starts) >= 10
    # Given up at the instant the last attempt failed (responses take no virtual time), not a wait later.
    line = json.loads((tmp_path / "e.jsonl").read_text())
    assert (line["attemptsMade"], line["attemptEndingTimestamp"]) == (len(starts), int(starts[-1] * 1000))


async def test_url_and_key_change_between_attempts(serve_app: ServerFactory, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("old-key\n")
    attempts: list[tuple[str, str]] = []

    async def old_fails(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1}, status=503)

    old = StrictEndpoint(old_fails)
    new = StrictEndpoint()
    old_base = await serve_app(old.app())
    new_base = await serve_app(new.app())
    sink, _, status = make_sink(f"{old_base}/ingest", static={"access_key": {"file": str(key_file)}},
                                dynamic={"retry_initial_delay": "200ms", "retry_maximum_delay": "200ms"})
    sink.distribute(messages(["a"]))
    await eventually(lambda: status.error("/sinks/firehose/firehose_http_sink") is not None)
    assert "old-key" not in str(status.error("/sinks/firehose/firehose_http_sink"))
    monkeypatch.setenv("FH_NEXT_KEY", "new-key")
    sink.reconfigure(FirehoseHttpSinkDynamicParameters.model_validate(
        {**FAST, "url": f"{new_base}/ingest", "access_key": {"env": "FH_NEXT_KEY"}}))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()
    for seen, url in [(s, "old") for s in old.seen] + [(s, "new") for s in new.seen]:
        attempts.append((url, seen.headers["X-Amz-Firehose-Access-Key"]))
    assert attempts[0] == ("old", "old-key")
    assert attempts[-1] == ("new", "new-key")
    request_ids = {s.headers["X-Amz-Firehose-Request-Id"] for s in old.seen + new.seen}
    assert len(request_ids) == 1


async def test_null_payloads_only_need_no_request(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages([None, None]))
    assert sink.progress().max_persisted_seq_no == 2  # handled at once
    assert sink.unacknowledged == 0
    await sink.close()
    assert endpoint.seen == []


async def test_progress_is_a_contiguous_prefix_when_a_later_batch_finishes_first(serve_app: ServerFactory) -> None:
    release = asyncio.Event()

    async def first_batch_waits(attempt: int, request_id: str) -> web.Response:
        if request_id == batch_request_id("deliver/firehose", b"message-00000001", b"message-00000001"):
            await release.wait()
        return conforming(request_id)

    endpoint = StrictEndpoint(first_batch_waits)
    base = await serve_app(endpoint.app())
    sink, metrics, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["first"]))
    sink.distribute(messages(["second"], first_seq=2))
    await eventually(
        lambda: metrics.value("egress_sink_records_delivered_total", sink_id="firehose") == 1)
    assert sink.progress().max_persisted_seq_no == 0
    assert sink.unacknowledged == 2  # the second batch is handled, but held until the first one is
    release.set()
    await eventually(lambda: sink.progress().max_persisted_seq_no == 2)
    await sink.close()


async def test_a_record_over_the_protocol_limit_goes_to_the_error_output_unsent(
        serve_app: ServerFactory, tmp_path: Path) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    errors = tmp_path / "errors.jsonl"
    sink, _, _ = make_sink(f"{base}/ingest", static={"error_output": str(errors)})
    sink.distribute(messages(["before", "z" * (p.MAX_RECORD_BYTES + 1), "after"]))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    await sink.close()
    assert sorted(r for s in endpoint.seen for r in s.records) == [b"after", b"before"]
    (line,) = [json.loads(text) for text in errors.read_text().splitlines()]
    assert line["errorCode"] == "HttpEndpoint.RecordTooLarge"
    assert line["attemptsMade"] == 0


async def test_a_payload_of_the_wrong_type_stops_the_sink(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest")
    sink.distribute(messages(["ok", 5, "later"]))
    await eventually(lambda: sink.terminal_error is not None)
    await eventually(lambda: sink.progress().max_persisted_seq_no == 1)
    await sink.close()  # cancels anything still running: nothing after the bad payload may have been sent
    assert [s.records for s in endpoint.seen] == [[b"ok"]]
    assert sink.progress().max_persisted_seq_no == 1
    assert "must contain a String or null" in (sink.terminal_error or "")


async def test_close_during_backoff_returns_promptly(serve_app: ServerFactory) -> None:
    async def unavailable(attempt: int, request_id: str) -> web.Response:
        return web.Response(status=503)

    endpoint = StrictEndpoint(unavailable)
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest", dynamic={"retry_initial_delay": "60s", "retry_maximum_delay": "60s"})
    sink.distribute(messages(["a"]))
    await eventually(lambda: len(endpoint.seen) == 1)
    await asyncio.wait_for(sink.close(), timeout=10)
    assert sink.progress().max_persisted_seq_no == 0


async def test_freshness_gauge_and_nulls_not_held_by_the_interval(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    clock = VirtualClock(start=1_700_000_000.0)
    sink, metrics, _ = make_sink(f"{base}/ingest", clock=clock,
                                 static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 60}})
    age = "egress_sink_oldest_undelivered_record_age_seconds"
    sink.distribute(messages([None]))
    assert sink.progress().max_persisted_seq_no == 1  # nothing buffered before it: no wait for the interval
    sink.distribute(messages(["a"], first_seq=2))
    await clock.advance(30)
    assert metrics.value(age, sink_id="firehose", partition="0") == 30.0
    await clock.advance(30)  # the interval closes the batch
    await eventually(lambda: sink.progress().max_persisted_seq_no == 2)
    assert metrics.value(age, sink_id="firehose", partition="0") == 0.0
    await sink.close()
    assert [s.records for s in endpoint.seen] == [[b"a"]]


async def test_flush_sends_the_open_batch_without_waiting_for_the_interval(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    clock = VirtualClock(start=1_700_000_000.0)  # never advanced: only flush() can close the batch
    sink, _, _ = make_sink(f"{base}/ingest", clock=clock,
                           static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 900}})
    sink.flush()  # nothing open: nothing happens
    sink.distribute(messages(["a", None, "b"]))
    sink.distribute(messages(["c"], first_seq=4))
    sink.flush()
    sink.distribute(messages(["d"], first_seq=5))
    await eventually(lambda: sink.progress().max_persisted_seq_no == 4)
    assert clock.monotonic() == 1_700_000_000.0
    assert sink.unacknowledged == 1  # "d" waits in a new open batch
    sink.flush()
    await eventually(lambda: sink.progress().max_persisted_seq_no == 5)
    await sink.close()
    assert [s.records for s in endpoint.seen] == [[b"a", b"b", b"c"], [b"d"]]


# ------------------------------------------------------------------- batch boundaries are committed state


async def test_a_closed_batch_waits_for_its_boundary_to_be_committed(serve_app: ServerFactory) -> None:
    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    sink, _, _ = make_sink(f"{base}/ingest", commits=False,
                           static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 900}})
    sink.distribute(messages(["a", None, "b"]))
    sink.flush()
    progress = sink.progress()
    assert (progress.max_persisted_seq_no, progress.sink_state) == (0, b"[3]")
    sink.committed(SinkProgress())  # an older commit, without this boundary: still nothing may go out
    # A batch is started synchronously (a task at once), so this holds now or never, without waiting.
    assert sink.in_flight == 0, "a batch went out before its boundary was committed"
    for _ in range(10):  # turns of the loop, not time
        await asyncio.sleep(0)
    assert endpoint.seen == [], "a batch went out before its boundary was committed"
    sink.committed(progress)
    await eventually(lambda: sink.progress().max_persisted_seq_no == 3)
    assert sink.progress().sink_state == b"", "an acknowledged batch leaves the committed state"
    await sink.close()
    assert [s.records for s in endpoint.seen] == [[b"a", b"b"]]


async def test_a_new_instance_reforms_the_committed_batches_whatever_the_hints_are_now(
        serve_app: ServerFactory) -> None:
    async def refuse(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1}, status=503)

    record = "x" * 300_000
    first = [f"{i}{record}" for i in range(6)]  # 1.8 MB: one batch under a 5 MiB hint, flushed
    refusing = StrictEndpoint(refuse)
    base = await serve_app(refusing.app())
    sink, _, _ = make_sink(f"{base}/ingest", static={"buffering_hints": {"size_in_mbs": 5, "interval_in_seconds": 900}})
    sink.distribute(messages([*first[:3], None, *first[3:]]))
    sink.flush()
    await eventually(lambda: len(refusing.seen) >= 2)
    state = sink.progress()
    await sink.close()  # the process dies here: nothing acknowledged, the boundary committed
    assert state.max_persisted_seq_no == 0
    assert state.sink_state == b"[7]"
    (refused_id,) = {s.headers["X-Amz-Firehose-Request-Id"] for s in refusing.seen}

    endpoint = StrictEndpoint()
    base = await serve_app(endpoint.app())
    later = [f"{i}{record}" for i in range(6, 10)]
    sink, _, _ = make_sink(f"{base}/ingest", progress=state,
                           static={"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 900}})
    sink.distribute(messages([*first[:3], None, *first[3:], *later]))  # the restored outbox and new messages
    sink.flush()
    await eventually(lambda: sink.progress().max_persisted_seq_no == 11)
    await sink.close()
    sent = {s.headers["X-Amz-Firehose-Request-Id"]: s.records for s in endpoint.seen}
    assert sent[refused_id] == [r.encode() for r in first], "the committed batch, over today's 1 MiB hint"
    assert sorted(map(len, sent.values())) == [1, 3, 6]  # the new records batched by the new hint: 3 + 1


def test_batch_ends_round_trip_and_foreign_state_is_refused() -> None:
    assert encode_batch_ends(()) == b""
    assert decode_batch_ends(b"") == []
    assert decode_batch_ends(encode_batch_ends((3, 7, 12))) == [3, 7, 12]
    for foreign in (b'{"a": 1}', b"[3, 2]", b'["3"]'):
        with pytest.raises(ValueError, match="ascending list of batch ends"):
            decode_batch_ends(foreign)


async def test_a_refused_key_names_the_status_and_the_fix(serve_app: ServerFactory) -> None:
    async def refuse_key(attempt: int, request_id: str) -> web.Response:
        return web.json_response({"requestId": request_id, "timestamp": 1_700_000_000_000,
                                  "errorMessage": "invalid firehose access key"}, status=401)

    endpoint = StrictEndpoint(refuse_key)
    base = await serve_app(endpoint.app())
    sink, _, status = make_sink(f"{base}/ingest", static={"retry_duration": 0})
    sink.distribute(messages(["a"]))
    await eventually(lambda: sink.terminal_error is not None)
    await sink.close()
    shown = str(status.error("/sinks/firehose/firehose_http_sink"))
    assert "HTTP 401: " in shown
    assert "invalid firehose access key" in shown
    assert "check the sink's access_key" in shown
