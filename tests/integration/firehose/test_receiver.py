"""The Firehose receiver against every vector of docs/firehose.md, on a real loopback server.

Each server runs twice: with aiohttp's automatic request decompression off (what ``serve`` does,
the receiver gunzips itself) and on (aiohttp's default when the app is mounted elsewhere).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from egress.firehose import FirehoseReceiver, PermanentError, ReceiverOptions, TransientError
from egress.firehose import protocol as p
from tests.waiting import eventually

pytestmark = pytest.mark.integration

AWS_EXAMPLE = (b'{"requestId":"ed4acda5-034f-9f42-bba1-f29aea6d7d8f","timestamp":1578090901599,'
               b'"records":[{"data":"aGVsbG8="},{"data":"aGVsbG8gd29ybGQ="}]}')
AWS_ID = "ed4acda5-034f-9f42-bba1-f29aea6d7d8f"
OTEL_KEY = "firehose-access-key"
OTEL_ID = "test"
VECTOR_ID = "e17265d6-97af-4938-982e-90d5614c4242"
VECTOR_ARN = "arn:aws:firehose:us-east-1:111111111111:deliverystream/test"
VECTOR_ATTRIBUTES = '{"commonAttributes":{"environment":"testing","application_group":"tymur_test"}}'


@dataclass
class Recorder:
    """A handler that stores what it is given; ``fail_with`` makes it raise instead."""

    calls: list[tuple[str, list[bytes], dict[str, str]]] = field(default_factory=list)
    fail_with: Exception | None = None

    async def __call__(self, request_id: str, records: list[bytes], common_attributes: dict[str, str]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append((request_id, records, common_attributes))


@dataclass
class Answer:
    status: int
    headers: Any
    raw: bytes

    @property
    def json(self) -> dict[str, Any]:
        document = json.loads(self.raw)
        assert isinstance(document, dict)
        return document


Post = Callable[..., Awaitable[Answer]]


@dataclass
class Endpoint:
    url: str
    recorder: Recorder
    receiver: FirehoseReceiver
    session: aiohttp.ClientSession
    aiohttp_gunzips: bool

    async def request(self, method: str, path: str = "/", body: bytes = b"",
                      headers: dict[str, str] | None = None) -> Answer:
        async with self.session.request(method, self.url + path, data=body, headers=headers or {},
                                        skip_auto_headers=("Content-Type",)) as response:
            raw = await response.read()
            return Answer(response.status, response.headers, raw)

    async def post(self, body: bytes, *, request_id: str | None = AWS_ID, path: str = "/",
                   content_type: str | None = "application/json", **headers: str) -> Answer:
        all_headers = {"X-Amz-Firehose-Protocol-Version": "1.0"}
        if request_id is not None:
            all_headers[p.HEADER_REQUEST_ID] = request_id
        if content_type is not None:
            all_headers["Content-Type"] = content_type
        all_headers.update({name.replace("_", "-"): value for name, value in headers.items()})
        return await self.request("POST", path, body, all_headers)


EndpointFactory = Callable[..., Awaitable[Endpoint]]


@pytest.fixture(params=[False, True], ids=["receiver-gunzips", "aiohttp-gunzips"])
async def endpoint(request: pytest.FixtureRequest) -> AsyncIterator[EndpointFactory]:
    auto_decompress: bool = request.param
    runners: list[web.AppRunner] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def start(options: ReceiverOptions | None = None) -> Endpoint:
        recorder = Recorder()
        receiver = FirehoseReceiver(recorder, options)
        runner = web.AppRunner(receiver.app, access_log=None, auto_decompress=auto_decompress)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return Endpoint(f"http://127.0.0.1:{port}", recorder, receiver, session, auto_decompress)

    yield start
    await session.close()
    for runner in runners:
        await runner.cleanup()


def body(request_id: str, *datas: str, timestamp: int = 1578090901599) -> bytes:
    return json.dumps({"requestId": request_id, "timestamp": timestamp,
                       "records": [{"data": d} for d in datas]}).encode()


def assert_answer(answer: Answer, status: int, request_id: str, message: str | None = None) -> None:
    """The response shape every answer must have (docs/firehose.md, decision table footer)."""
    assert answer.status == status, answer.raw
    assert answer.headers["Content-Type"] == "application/json"
    assert int(answer.headers["Content-Length"]) == len(answer.raw)
    assert "Content-Encoding" not in answer.headers
    document = answer.json
    assert document["requestId"] == request_id
    assert isinstance(document["timestamp"], int)
    assert not isinstance(document["timestamp"], bool)
    assert document["timestamp"] > 1_600_000_000_000, "milliseconds, not seconds"
    if status == 200:
        assert set(document) == {"requestId", "timestamp"}
    else:
        assert isinstance(document["errorMessage"], str)
        if message is not None:
            assert document["errorMessage"] == message


# ------------------------------------------------------------------------------------------ AWS example


async def test_aws_example_delivers_both_records(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    answer = await ep.post(AWS_EXAMPLE)
    assert_answer(answer, 200, AWS_ID)
    assert ep.recorder.calls == [(AWS_ID, [b"hello", b"hello world"], {})]


async def test_aws_example_gzipped(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    answer = await ep.post(gzip.compress(AWS_EXAMPLE), Content_Encoding="gzip")
    assert_answer(answer, 200, AWS_ID)
    assert ep.recorder.calls == [(AWS_ID, [b"hello", b"hello world"], {})]


# ------------------------------------------------------------------------------------------- OTel table


async def otel(ep: Endpoint, *, header_id: str = OTEL_ID, key: str | None = OTEL_KEY, body_id: str = OTEL_ID,
               records: Any = (), raw: bytes | None = None, attributes: str | None = None) -> Answer:
    document = {"requestId": body_id, "timestamp": 1578090901599,
                "records": records if records is None else [{"data": d} for d in records]}
    headers: dict[str, str] = {}
    if key is not None:
        headers["X-Amz-Firehose-Access-Key"] = key
    if attributes is not None:
        headers["X-Amz-Firehose-Common-Attributes"] = attributes
    return await ep.post(raw if raw is not None else json.dumps(document).encode(), request_id=header_id, **{
        name.replace("-", "_"): value for name, value in headers.items()})


async def test_otel_empty_header_request_id(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    assert_answer(await otel(ep, header_id=""), 400, "", "missing request id in header")


@pytest.mark.parametrize("key", ["test", "", None])
async def test_otel_wrong_or_missing_key(endpoint: EndpointFactory, key: str | None) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    assert_answer(await otel(ep, key=key), 401, OTEL_ID, "invalid firehose access key")
    assert ep.recorder.calls == []


@pytest.mark.parametrize(("body_id", "message"), [("", "missing request id in body"),
                                                  ("otherId", "different request id in body")])
async def test_otel_body_request_id(endpoint: EndpointFactory, body_id: str, message: str) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    assert_answer(await otel(ep, body_id=body_id), 400, OTEL_ID, message)


async def test_otel_null_records_is_success(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    assert_answer(await otel(ep, records=None), 200, OTEL_ID)
    assert ep.recorder.calls == [(OTEL_ID, [], {})]


async def test_otel_python_base64_trap(endpoint: EndpointFactory) -> None:
    """``base64.b64decode("XXXXXaGVsbG8=")`` succeeds in Python; the receiver must not."""
    assert base64.b64decode("XXXXXaGVsbG8=")  # the trap is real
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    answer = await otel(ep, records=["aGVsbG8=", "XXXXXaGVsbG8="])
    assert_answer(answer, 400, OTEL_ID, "unable to base64 decode the record at index 1")
    assert ep.recorder.calls == []


@pytest.mark.parametrize("attributes", [None, '{"commonAttributes":{"TestAttribute":"common"}}'])
async def test_otel_valid_record(endpoint: EndpointFactory, attributes: str | None) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    answer = await otel(ep, records=[base64.b64encode(b"test").decode()], attributes=attributes)
    assert_answer(answer, 200, OTEL_ID)
    expected_attributes = {"TestAttribute": "common"} if attributes else {}
    assert ep.recorder.calls == [(OTEL_ID, [b"test"], expected_attributes)]


async def test_otel_invalid_json(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=(OTEL_KEY,)))
    answer = await otel(ep, raw=b"{ test: ")
    assert_answer(answer, 400, OTEL_ID)
    assert answer.json["errorMessage"].startswith("invalid JSON body")


# ------------------------------------------------------------------------- advisory CVE-2024-45043


@pytest.mark.parametrize(("key", "status"), [("1234", 200), ("5678", 401), (None, 401)])
async def test_advisory_keys(endpoint: EndpointFactory, key: str | None, status: int) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=("1234",)))
    headers = {} if key is None else {"X_Amz_Firehose_Access_Key": key}
    answer = await ep.post(AWS_EXAMPLE, **headers)
    assert_answer(answer, status, AWS_ID)
    assert len(ep.recorder.calls) == (1 if status == 200 else 0)


async def test_rotation_accepts_every_configured_key(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=("old-key", "new-key")))
    for key, status in [("old-key", 200), ("new-key", 200), ("new-keyX", 401), ("NEW-KEY", 401), ("old", 401)]:
        assert_answer(await ep.post(AWS_EXAMPLE, X_Amz_Firehose_Access_Key=key), status, AWS_ID)


async def test_key_sent_twice_is_refused(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=("1234",)))
    async with ep.session.post(ep.url + "/", data=AWS_EXAMPLE, headers=[
        ("X-Amz-Firehose-Request-Id", AWS_ID), ("Content-Type", "application/json"),
        ("X-Amz-Firehose-Access-Key", "1234"), ("X-Amz-Firehose-Access-Key", "1234")]) as response:
        assert response.status == 401


# ------------------------------------------------------------------------------- Vector and Telegraf


async def test_vector_gzip_request_with_attributes(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    document = body(VECTOR_ID, base64.b64encode(b'{"message":"some_message"}').decode(), timestamp=1644358245000)
    answer = await ep.post(gzip.compress(document), request_id=VECTOR_ID, Content_Encoding="gzip",
                           X_Amz_Firehose_Source_Arn=VECTOR_ARN, X_Amz_Firehose_Common_Attributes=VECTOR_ATTRIBUTES)
    assert_answer(answer, 200, VECTOR_ID)
    assert ep.recorder.calls == [(VECTOR_ID, [b'{"message":"some_message"}'],
                                  {"environment": "testing", "application_group": "tymur_test"})]


async def test_vector_get_is_405_not_500(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    answer = await ep.request("GET", "/", headers={p.HEADER_REQUEST_ID: VECTOR_ID})
    assert_answer(answer, 405, VECTOR_ID, "method not allowed")
    assert answer.headers["Allow"] == "POST"


@pytest.mark.parametrize("timestamp", [1578090901599, 1734625715000000000])
async def test_telegraf_request(endpoint: EndpointFactory, timestamp: int) -> None:
    """Telegraf's vector; a nanosecond body timestamp is still accepted (it is informative)."""
    ep = await endpoint()
    answer = await ep.post(body("test-id", "dGVzdA==", timestamp=timestamp), request_id="test-id")
    assert_answer(answer, 200, "test-id")
    assert ep.recorder.calls == [("test-id", [b"test"], {})]


# ------------------------------------------------------------------------ the rest of the decision table


async def test_health_and_head(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    assert_answer(await ep.request("GET", "/health"), 200, "")
    head = await ep.request("HEAD", "/health")
    assert head.status == 200
    assert_answer(await ep.request("PUT", "/health"), 405, "")
    assert_answer(await ep.request("GET", "/anything-else"), 405, "")


async def test_path_not_served_is_404_after_method(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(path="/ingest"))
    assert_answer(await ep.post(AWS_EXAMPLE, path="/other"), 404, AWS_ID)
    assert_answer(await ep.request("GET", "/other"), 405, "")
    assert_answer(await ep.post(AWS_EXAMPLE, path="/ingest"), 200, AWS_ID)


async def test_mounted_as_sub_application() -> None:
    recorder = Recorder()
    parent = web.Application()
    parent.add_subapp("/firehose", FirehoseReceiver(recorder, ReceiverOptions(path="/in")).app)
    runner = web.AppRunner(parent, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        headers = {p.HEADER_REQUEST_ID: AWS_ID, "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/firehose/in", data=AWS_EXAMPLE, headers=headers) as response:
                assert response.status == 200
            async with session.get(url + "/firehose/health") as response:
                assert response.status == 200
    finally:
        await runner.cleanup()
    assert recorder.calls == [(AWS_ID, [b"hello", b"hello world"], {})]


async def test_content_length_over_cap_is_413_before_other_checks(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(max_body_bytes=100, access_keys=("k",)))
    answer = await ep.post(b"x" * 101, request_id=None, content_type=None)
    assert_answer(answer, 413, "", "payload too large")


async def test_chunked_body_over_cap_is_413(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(max_body_bytes=1000))

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(50):
            yield b" " * 100

    async with ep.session.post(ep.url + "/", data=chunks(), headers={
            p.HEADER_REQUEST_ID: AWS_ID, "Content-Type": "application/json"}) as response:
        assert response.status == 413
        assert (await response.json())["errorMessage"] == "payload too large"


async def test_gzip_bomb_stops_at_the_decompressed_cap(endpoint: EndpointFactory) -> None:
    bomb = gzip.compress(b" " * (8 * 1024 * 1024))  # 8 MiB of spaces, about 8 KiB compressed
    assert len(bomb) < 64 * 1024
    ep = await endpoint(ReceiverOptions(max_body_bytes=64 * 1024, max_decompressed_bytes=1024 * 1024))
    answer = await ep.post(bomb, Content_Encoding="gzip")
    assert_answer(answer, 413, AWS_ID, "payload too large")
    assert ep.recorder.calls == []


@pytest.mark.parametrize("corrupt", [b"not gzip at all", gzip.compress(AWS_EXAMPLE)[:-9],
                                     gzip.compress(AWS_EXAMPLE)[:20]])
async def test_corrupt_gzip_is_400(endpoint: EndpointFactory, corrupt: bytes) -> None:
    ep = await endpoint()
    if ep.aiohttp_gunzips and not corrupt.startswith(b"not"):
        pytest.skip("aiohttp's automatic decompression does not check the gzip trailer (see below)")
    answer = await ep.post(corrupt, Content_Encoding="gzip")
    assert_answer(answer, 400, AWS_ID)


async def test_empty_gzip_body_is_400(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    assert_answer(await ep.post(b"", Content_Encoding="gzip"), 400, AWS_ID)


async def test_multi_member_gzip(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    half = len(AWS_EXAMPLE) // 2
    answer = await ep.post(gzip.compress(AWS_EXAMPLE[:half]) + gzip.compress(AWS_EXAMPLE[half:]),
                           Content_Encoding="gzip")
    assert_answer(answer, 200, AWS_ID)


async def test_limits_of_aiohttp_automatic_decompression(endpoint: EndpointFactory) -> None:
    """Why ``serve`` turns aiohttp's decompression off (docs/firehose.md, "Mounting"): with it on,
    a truncated gzip body (no CRC32/length trailer) passes, and an encoding aiohttp cannot decode
    (br, zstd without their packages) is answered by aiohttp itself in plain text, before the app."""
    ep = await endpoint()
    truncated = await ep.post(gzip.compress(AWS_EXAMPLE)[:-8], Content_Encoding="gzip")
    brotli = await ep.post(AWS_EXAMPLE, Content_Encoding="br")
    if ep.aiohttp_gunzips:
        assert truncated.status == 200
        assert brotli.status == 400
        assert brotli.headers["Content-Type"].startswith("text/plain")
    else:
        assert_answer(truncated, 400, AWS_ID, p.MSG_CORRUPT_GZIP)
        assert_answer(brotli, 415, AWS_ID, p.MSG_UNSUPPORTED_CONTENT_ENCODING)


@pytest.mark.parametrize(("headers", "status", "message"), [
    ({"X_Amz_Firehose_Protocol_Version": "2.0"}, 400, "unsupported protocol version"),
    ({"Content_Encoding": "deflate"}, 415, None),
    ({"Content_Encoding": "compress"}, 415, None),
    ({"Content_Encoding": "identity"}, 415, None),
])
async def test_header_rules(endpoint: EndpointFactory, headers: dict[str, str], status: int,
                            message: str | None) -> None:
    ep = await endpoint()
    assert_answer(await ep.post(AWS_EXAMPLE, **headers), status, AWS_ID, message)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/jsonx", "application/x-amz-json-1.1"])
async def test_content_type_must_be_json(endpoint: EndpointFactory, content_type: str | None) -> None:
    ep = await endpoint()
    assert_answer(await ep.post(AWS_EXAMPLE, content_type=content_type), 415, AWS_ID)


async def test_content_type_with_charset_is_json(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    assert_answer(await ep.post(AWS_EXAMPLE, content_type="application/json; charset=utf-8"), 200, AWS_ID)


async def test_rule_order_key_before_version_before_content_type(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(access_keys=("k",)))
    everything_wrong = {"X_Amz_Firehose_Protocol_Version": "9", "Content_Encoding": "compress"}
    assert_answer(await ep.post(b"{", content_type="text/plain", **everything_wrong), 401, AWS_ID)
    assert_answer(await ep.post(b"{", content_type="text/plain", X_Amz_Firehose_Access_Key="k",
                                **everything_wrong), 400, AWS_ID, "unsupported protocol version")
    assert_answer(await ep.post(b"{", content_type="text/plain", X_Amz_Firehose_Access_Key="k",
                                Content_Encoding="compress"), 415, AWS_ID)


@pytest.mark.parametrize(("raw", "message"), [
    (b"[]", "invalid JSON body: not an object"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":{}}', "invalid JSON body: records is not a list"),
    (b'{"requestId":5,"records":[]}', "missing request id in body"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":[5]}', "unable to base64 decode the record at index 0"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":[{"data":null}]}',
     "unable to base64 decode the record at index 0"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":[{"data":"aGVs\\nbG8="}]}',
     "unable to base64 decode the record at index 0"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":[{"data":"aGVsbG8-"}]}',
     "unable to base64 decode the record at index 0"),
])
async def test_body_rules(endpoint: EndpointFactory, raw: bytes, message: str) -> None:
    ep = await endpoint()
    assert_answer(await ep.post(raw), 400, AWS_ID, message)


async def test_base64_checked_before_common_attributes(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    answer = await ep.post(body(AWS_ID, "!!!!"), X_Amz_Firehose_Common_Attributes="nonsense")
    assert_answer(answer, 400, AWS_ID, "unable to base64 decode the record at index 0")


@pytest.mark.parametrize("attributes", [
    "nonsense", "{}", '{"commonAttributes":[]}', '{"commonAttributes":{"a":1}}',
    '{"commonAttributes":{"a":"b"},"extra":1}', '{"commonAttributes":{"   ":"b"}}',
    json.dumps({"commonAttributes": {f"k{i}": "v" for i in range(51)}}),
    json.dumps({"commonAttributes": {"k": "v" * 1025}}),
])
async def test_bad_common_attributes_is_400(endpoint: EndpointFactory, attributes: str) -> None:
    ep = await endpoint()
    answer = await ep.post(AWS_EXAMPLE, X_Amz_Firehose_Common_Attributes=attributes)
    assert_answer(answer, 400, AWS_ID)
    assert answer.json["errorMessage"].startswith("invalid common attributes header")
    assert ep.recorder.calls == []


async def test_record_limits_are_413(endpoint: EndpointFactory) -> None:
    ep = await endpoint(ReceiverOptions(max_records=2, max_record_bytes=5))
    assert_answer(await ep.post(body(AWS_ID, "", "", "")), 413, AWS_ID, "too many records: 3 > 2")
    answer = await ep.post(body(AWS_ID, "aGVsbG8=", "aGVsbG8gd29ybGQ="))
    assert_answer(answer, 413, AWS_ID, "record at index 1 is larger than 5 bytes")
    assert_answer(await ep.post(body(AWS_ID, "", "aGVsbG8=")), 200, AWS_ID)
    assert ep.recorder.calls == [(AWS_ID, [b"", b"hello"], {})]


@pytest.mark.parametrize(("error", "status"), [(PermanentError("cannot parse the log line"), 400),
                                               (TransientError("database is down"), 503),
                                               (RuntimeError("a bug"), 500)])
async def test_handler_errors(endpoint: EndpointFactory, error: Exception, status: int) -> None:
    ep = await endpoint()
    ep.recorder.fail_with = error
    answer = await ep.post(AWS_EXAMPLE)
    expected = str(error) if status != 500 else "internal error while handling the records"
    assert_answer(answer, status, AWS_ID, expected)


async def test_long_handler_message_is_cut_to_8192(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    ep.recorder.fail_with = TransientError("x" * 10_000)
    answer = await ep.post(AWS_EXAMPLE)
    assert answer.json["errorMessage"] == "x" * 8192


async def test_stats_count_accepted_records(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    await ep.post(AWS_EXAMPLE)
    await ep.post(b"{")
    assert ep.receiver.stats.as_json() == {"requests": 2, "by_status": {"200": 1, "400": 1},
                                           "records_accepted": 2, "bytes_accepted": len(AWS_EXAMPLE)}


def test_options_never_show_keys() -> None:
    options = ReceiverOptions(access_keys=("s3cr3t-key",))
    assert "s3cr3t" not in repr(options)
    with pytest.raises(TypeError):
        ReceiverOptions(access_keys="s3cr3t-key")  # type: ignore[arg-type]


async def test_bodies_above_aiohttps_default_one_mebibyte_are_accepted(endpoint: EndpointFactory) -> None:
    ep = await endpoint()
    records = [bytes([i % 251]) * 1_000_000 for i in range(3)]
    raw = p.encode_request_body(AWS_ID, 1578090901599, records)
    assert len(raw) > 3 * 1024 * 1024
    assert_answer(await ep.post(raw), 200, AWS_ID)
    assert_answer(await ep.post(gzip.compress(raw), Content_Encoding="gzip"), 200, AWS_ID)
    assert [call[1] for call in ep.recorder.calls] == [records, records]


async def test_a_client_leaving_mid_body_is_counted_as_499_not_an_internal_error(
        endpoint: EndpointFactory, caplog: pytest.LogCaptureFixture) -> None:
    started = await endpoint()
    host, port = started.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST / HTTP/1.1\r\nHost: {host}\r\nX-Amz-Firehose-Request-Id: gone\r\n"
                 "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"requestId\":".encode())
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    stats = started.receiver.stats
    await eventually(lambda: stats.requests >= 1, what="the receiver finishing the request")
    assert stats.by_status == {499: 1}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
