"""Bad input on the Firehose receiver, fuzzed with hypothesis against a real server on loopback.

The receiver runs as ``egress.firehose.serve`` runs it, in a thread with its own event loop; the
client is ``http.client`` on a fresh connection per example. Whatever the method, path, headers,
body, encoding and size, the answer is one of the decision table's statuses, a 503 only when the
handler raised a transient error, always a JSON body of the response schema, and the receiver
never logs an unexpected error. Well-formed requests among the examples must be accepted.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from egress.firehose import FirehoseReceiver, PermanentError, ReceiverOptions, RequestRejected, TransientError, serve
from egress.firehose import protocol as p

pytestmark = pytest.mark.integration

KEYS = ("key-one", "key-two")
MAX_BODY = 64 * 1024
MAX_DECOMPRESSED = 256 * 1024
ALLOWED = {200, 400, 401, 404, 405, 413, 415, 503}


@dataclass
class Handler:
    """Stores records; a record ``TRANSIENT`` or ``PERMANENT`` makes it raise that error instead."""

    calls: list[tuple[str, list[bytes], dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, request_id: str, records: list[bytes], attributes: dict[str, str]) -> None:
        if b"TRANSIENT" in records:
            raise TransientError("try again")
        if b"PERMANENT" in records:
            raise PermanentError("never")
        with self.lock:
            self.calls.append((request_id, records, attributes))


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Server:
    port: int
    handler: Handler
    errors: Errors


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    handler = Handler()
    receiver = FirehoseReceiver(handler, ReceiverOptions(
        access_keys=KEYS, path="/ingest", max_body_bytes=MAX_BODY, max_decompressed_bytes=MAX_DECOMPRESSED))
    errors = Errors()
    logging.getLogger("egress.firehose").addHandler(errors)
    logging.getLogger("aiohttp").addHandler(errors)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    bound = threading.Event()
    port: list[int] = []

    def ready(number: int) -> None:
        port.append(number)
        bound.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(receiver, "127.0.0.1", 0, ready=ready,
                                                                          stop=stop),), daemon=True)
    thread.start()
    assert bound.wait(30), "the receiver did not start"
    yield Server(port[0], handler, errors)
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    loop.close()
    logging.getLogger("egress.firehose").removeHandler(errors)
    logging.getLogger("aiohttp").removeHandler(errors)


# ------------------------------------------------------------------------------------------- strategies

header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60)
token = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~"),
                min_size=1, max_size=20)
request_ids = st.one_of(st.none(), st.just(""), st.uuids().map(str), header_text)
records = st.lists(st.binary(max_size=100), max_size=8)
records_for_handler_errors = st.lists(st.one_of(st.binary(max_size=20), st.sampled_from([b"TRANSIENT", b"PERMANENT"])),
                                      min_size=1, max_size=4)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)


@dataclass
class Case:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    request_id: str | None
    records: list[bytes] | None  # set when the body is a well-formed request for these records
    well_formed: bool  # every header and the body are as a conforming sender makes them
    encoding_ok: bool
    chunked: bool = False  # sent with Transfer-Encoding: chunked instead of a Content-Length


FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
ASPECTS = ("method", "path", "request_id", "key", "version", "content_type", "encoding", "attributes", "extra",
           "body", "gzip", "handler", "size")


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A conforming request with a few aspects (often none) drawn from anything instead."""
    some = st.frozensets(st.sampled_from(ASPECTS), min_size=1, max_size=4)
    broken = draw(st.one_of(st.just(frozenset[str]()), some, some))

    def pick(aspect: str, good: st.SearchStrategy[Any], anything: st.SearchStrategy[Any]) -> Any:
        return draw(anything if aspect in broken else good)

    method = pick("method", st.just("POST"), st.sampled_from(["POST", "GET", "HEAD", "PUT", "DELETE", "OPTIONS"]))
    path = pick("path", st.just("/ingest"), st.sampled_from(["/ingest", "/", "/health", "/ingest/", "/other"]))
    well_formed = method == "POST" and path == "/ingest"
    request_id = pick("request_id", st.uuids().map(str), request_ids)
    well_formed &= request_id is not None and request_id != "" and request_id.isascii() \
        and request_id == request_id.strip()
    headers: list[tuple[str, str]] = []
    if request_id is not None:
        headers.append((p.HEADER_REQUEST_ID, request_id))
    key = pick("key", st.sampled_from(KEYS), st.one_of(st.sampled_from([*KEYS, None]), header_text))
    well_formed &= key in KEYS
    if key is not None:
        headers.append((p.HEADER_ACCESS_KEY, key))
    version = pick("version", st.sampled_from(["1.0", None]), st.one_of(st.sampled_from(["1.0", None]), header_text))
    well_formed &= version in ("1.0", None)
    if version is not None:
        headers.append((p.HEADER_PROTOCOL_VERSION, version))
    content_type = pick("content_type", st.sampled_from(["application/json", "application/json; charset=utf-8"]),
                        st.one_of(st.sampled_from(["application/json", None]), header_text))
    well_formed &= content_type in ("application/json", "application/json; charset=utf-8")
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    encodings = st.sampled_from([None, "gzip", "GZIP", "deflate", "br", "zstd", "identity"])
    encoding = pick("encoding", st.sampled_from([None, "gzip"]), st.one_of(encodings, header_text))
    encoding_ok = encoding is None or encoding.lower() == "gzip"
    well_formed &= encoding_ok
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
    good_attributes = st.dictionaries(
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=10),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=10), max_size=5,
    ).map(lambda d: json.dumps({"commonAttributes": d}))
    attributes = pick("attributes", st.one_of(st.none(), good_attributes),
                      st.one_of(good_attributes, header_text, json_values.map(json.dumps)))
    if attributes is not None:
        try:
            p.parse_common_attributes(attributes)
        except RequestRejected:
            well_formed = False
        headers.append((p.HEADER_COMMON_ATTRIBUTES, attributes))
    if "extra" in broken:
        # Not a second Host or a framing header: the HTTP layer answers those 400 itself, before the
        # application (RFC 9112 §3.2, §6.3), and http.client always sends Host and the framing.
        extra_names = token.filter(lambda name: name.lower() not in FRAMING_HEADERS)
        for _ in range(draw(st.integers(1, 3))):
            headers.append((draw(extra_names), draw(header_text)))

    kind = pick("body", st.just("valid"), st.sampled_from(["random", "json", "mismatch", "bad-base64"]))
    if "size" in broken:
        kind = "big"
    chosen: list[bytes] | None = None
    if kind == "valid":
        chosen = draw(records_for_handler_errors if "handler" in broken else records)
        body = p.encode_request_body(request_id or "", draw(st.integers(0, 2**63)), chosen) if chosen else \
            json.dumps({"requestId": request_id or "", "records": []}).encode()
        well_formed &= b"TRANSIENT" not in chosen and b"PERMANENT" not in chosen
    else:
        well_formed = False
        if kind == "random":
            body = draw(st.binary(max_size=500))
        elif kind == "json":
            body = json.dumps(draw(json_values)).encode()
        elif kind == "mismatch":
            body = p.encode_request_body(draw(st.uuids()).hex, 0, [b"x"])
        elif kind == "big":
            body = b'{"requestId":' + json.dumps(request_id or "").encode() + b',"records":[{"data":"' + \
                b"A" * draw(st.sampled_from([MAX_BODY - 100, MAX_BODY, MAX_BODY + 1, 8 * MAX_BODY, 64 * MAX_BODY])) + \
                b'"}]}'
        else:
            data = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30))
            body = json.dumps({"requestId": request_id or "", "records": [{"data": data}]}).encode()
    if encoding is not None and encoding.lower() == "gzip":
        body = gzip.compress(body, compresslevel=1)
        mutation = pick("gzip", st.just("none"), st.sampled_from(["none", "truncate", "flip", "append", "double"]))
        if mutation != "none":
            well_formed = False
        if mutation == "truncate":
            body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
        elif mutation == "flip" and body:
            at = draw(st.integers(0, len(body) - 1))
            body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]
        elif mutation == "append":
            body += draw(st.binary(min_size=1, max_size=20))
        elif mutation == "double":
            body = gzip.compress(body)
    if len(body) > MAX_BODY:
        well_formed = False
    chunked = draw(st.booleans())
    return Case(method, path, headers, body, request_id, chosen, well_formed, encoding_ok, chunked)


def expected_status(case: Case) -> int | None:
    """The header-level rules of the decision table (and the size cap), restated independently: the
    status the receiver must answer when one of them fails (first failing rule wins), else ``None``.
    Header values arrive without surrounding spaces and tabs (HTTP's optional white space)."""
    def values(name: str) -> list[str]:
        return [v.strip(" \t") for n, v in case.headers if n.lower() == name.lower()]

    if case.method != "POST":
        return 200 if case.method in ("GET", "HEAD") and case.path == "/health" else 405
    if case.path != "/ingest":
        return 404
    if len(case.body) > MAX_BODY and not case.chunked:
        return 413
    if not (values(p.HEADER_REQUEST_ID) or [""])[0]:
        return 400
    keys = values(p.HEADER_ACCESS_KEY)
    if len(keys) != 1 or keys[0] not in KEYS:
        return 401
    if any(v != "1.0" for v in values(p.HEADER_PROTOCOL_VERSION)[:1]):
        return 400
    content_types = values("Content-Type")
    if not content_types or content_types[0].split(";")[0].strip(" \t").lower() != "application/json":
        return 415
    encodings = values("Content-Encoding")
    if len(encodings) > 1 or (encodings and encodings[0].lower() != "gzip"):
        return 415
    if len(case.body) > MAX_BODY:  # chunked: no Content-Length to check first, the cap holds while reading
        return 413
    return None


def send(port: int, case: Case) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest(case.method, case.path, skip_accept_encoding=True)
        for name, value in case.headers:
            connection.putheader(name, value.encode("latin-1"))
        if case.chunked:
            connection.putheader("Transfer-Encoding", "chunked")
            connection.endheaders()
            for at in range(0, len(case.body), 4096):
                piece = case.body[at:at + 4096]
                connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            connection.send(b"0\r\n\r\n")
        else:
            connection.putheader("Content-Length", str(len(case.body)))
            connection.endheaders(case.body if case.body else None)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                     HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_bad_input_never_breaks_the_receiver(server: Server, case: Case) -> None:
    calls_before = len(server.handler.calls)
    status, headers, raw = send(server.port, case)
    event(f"status {status}")

    assert status in ALLOWED, (status, raw)
    assert headers["content-type"] == "application/json"
    assert "content-encoding" not in headers
    if case.method == "HEAD":
        assert raw == b""
        assert status == expected_status(case)
        return
    assert int(headers["content-length"]) == len(raw)
    document: Any = json.loads(raw)
    assert isinstance(document, dict)
    assert isinstance(document["timestamp"], int)
    assert document["timestamp"] > 1_600_000_000_000
    assert isinstance(document["requestId"], str)
    sent_id = case.request_id or ""
    if sent_id.isascii():
        assert document["requestId"] == sent_id.strip()
    if status == 200:
        assert "errorMessage" not in document
    else:
        assert isinstance(document["errorMessage"], str)
    if status == 503:
        assert case.records is not None
        assert b"TRANSIENT" in case.records
    stored = len(server.handler.calls) - calls_before
    assert stored == (1 if status == 200 and case.method == "POST" else 0)
    if status == 200 and case.method == "POST" and case.records is not None:
        assert server.handler.calls[-1][1] == case.records
    expected = expected_status(case)
    if expected is not None:
        assert status == expected, document
    elif case.well_formed:
        assert status == 200, document
    assert not server.errors.records, server.errors.records[0].getMessage()


def test_receiver_still_healthy_after_fuzzing(server: Server) -> None:
    status, _, raw = send(server.port, Case("GET", "/health", [], b"", None, None, False, True))
    assert status == 200
    assert json.loads(raw)["requestId"] == ""


def test_valid_examples_do_occur() -> None:
    """Guard against a strategy that never produces an acceptable request (the oracle above would be vacuous)."""
    seen: list[bool] = []

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def collect(case: Case) -> None:
        seen.append(case.well_formed)

    collect()
    assert any(seen)
    assert not all(seen)
