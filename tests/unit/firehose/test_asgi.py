"""The Firehose receiver's ASGI adapter, driven through the ASGI interface itself."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest

from egress.firehose import FirehoseReceiver, ReceiverOptions
from egress.firehose.asgi import FirehoseASGI

AWS_ID = "ed4acda5-034f-9f42-bba1-f29aea6d7d8f"
AWS_EXAMPLE = (b'{"requestId":"ed4acda5-034f-9f42-bba1-f29aea6d7d8f","timestamp":1578090901599,'
               b'"records":[{"data":"aGVsbG8="},{"data":"aGVsbG8gd29ybGQ="}]}')


class Store:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes], dict[str, str]]] = []

    async def __call__(self, request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        self.calls.append((request_id, records, attributes))


async def call(app: FirehoseASGI, method: str, path: str, headers: dict[str, str], chunks: list[bytes],
               *, root_path: str = "", disconnect: bool = False,
               stall: bool = False) -> tuple[int, dict[str, str], bytes]:
    scope = {"type": "http", "method": method, "path": path, "root_path": root_path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks or [b""])]
    if disconnect:
        messages = [{**messages[0], "more_body": True}, {"type": "http.disconnect"}]
    if stall:  # the first chunk, then nothing: the client went silent mid-body
        messages = [{**messages[0], "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not messages:
            await asyncio.Event().wait()
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, body = sent
    assert start["type"] == "http.response.start"
    response_headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert response_headers["content-type"] == "application/json"
    return start["status"], response_headers, body["body"]


def headers(**extra: str) -> dict[str, str]:
    return {"X-Amz-Firehose-Request-Id": AWS_ID, "Content-Type": "application/json", **extra}


async def test_aws_example_in_chunks_and_gzipped() -> None:
    store = Store()
    app = FirehoseASGI(FirehoseReceiver(store))
    status, response_headers, body = await call(app, "POST", "/", headers(), [AWS_EXAMPLE[:10], AWS_EXAMPLE[10:]])
    assert status == 200
    assert int(response_headers["content-length"]) == len(body)
    assert json.loads(body)["requestId"] == AWS_ID
    status, _, _ = await call(app, "POST", "/", headers(**{"Content-Encoding": "gzip"}), [gzip.compress(AWS_EXAMPLE)])
    assert status == 200
    assert store.calls == [(AWS_ID, [b"hello", b"hello world"], {})] * 2


async def test_a_body_stalling_mid_way_is_408_after_body_timeout() -> None:
    store = Store()
    app = FirehoseASGI(FirehoseReceiver(store, ReceiverOptions(body_timeout=0.05)))
    status, _, body = await call(app, "POST", "/", headers(), [AWS_EXAMPLE[:10]], stall=True)
    assert (status, json.loads(body)["errorMessage"]) == (408, "the body did not arrive whole within body_timeout")
    assert store.calls == []


async def test_keys_paths_and_methods() -> None:
    app = FirehoseASGI(FirehoseReceiver(Store(), ReceiverOptions(access_keys=("1234",), path="/in")))
    assert (await call(app, "POST", "/firehose/in", headers(**{"X-Amz-Firehose-Access-Key": "1234"}),
                       [AWS_EXAMPLE], root_path="/firehose"))[0] == 200
    status, _, body = await call(app, "POST", "/in", headers(**{"X-Amz-Firehose-Access-Key": "5678"}), [AWS_EXAMPLE])
    assert (status, json.loads(body)["errorMessage"]) == (401, "invalid firehose access key")
    assert (await call(app, "POST", "/other", headers(), [AWS_EXAMPLE]))[0] == 404
    status, response_headers, _ = await call(app, "GET", "/in", {}, [])
    assert (status, response_headers["allow"]) == (405, "POST")
    status, _, body = await call(app, "HEAD", "/health", {}, [])
    assert (status, body) == (200, b"")


async def test_caps_hold_without_a_content_length() -> None:
    app = FirehoseASGI(FirehoseReceiver(Store(), ReceiverOptions(max_body_bytes=1000)))
    status, _, body = await call(app, "POST", "/", headers(), [b" " * 600, b" " * 600])
    assert (status, json.loads(body)["errorMessage"]) == (413, "payload too large")
    status, _, _ = await call(app, "POST", "/", headers(**{"Content-Length": "5000"}), [b"{}"])
    assert status == 413


async def test_a_disconnect_mid_body_is_answered_not_raised() -> None:
    app = FirehoseASGI(FirehoseReceiver(Store()))
    status, _, _ = await call(app, "POST", "/", headers(), [AWS_EXAMPLE[:10]], disconnect=True)
    assert status == 400


async def test_lifespan_is_acknowledged() -> None:
    app = FirehoseASGI(FirehoseReceiver(Store()))
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


@pytest.mark.parametrize("value", ["", "abc", "-1"])
async def test_a_bad_content_length_is_not_trusted(value: str) -> None:
    app = FirehoseASGI(FirehoseReceiver(Store()))
    status, _, _ = await call(app, "POST", "/", headers(**{"Content-Length": value}), [AWS_EXAMPLE])
    assert status == 200
