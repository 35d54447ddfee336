"""The Firehose codec without sockets: records, bodies, gzip, common attributes, response acceptance."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.firehose import FirehoseRequest, RequestRejected, ResponseNotAccepted
from egress.firehose import protocol as p

AWS_ID = "ed4acda5-034f-9f42-bba1-f29aea6d7d8f"


# --------------------------------------------------------------------------------------------- records


@given(st.binary(max_size=2000))
def test_record_base64_round_trip_matches_the_standard_library(data: bytes) -> None:
    encoded = p.b64encode_record(data)
    assert encoded == base64.b64encode(data).decode()
    assert p.b64decode_record(encoded, 0) == data


@pytest.mark.parametrize("bad", ["XXXXXaGVsbG8=", "aGVsbG8", "aGVs\nbG8=", "aGVs bG8=", "aGVsbG8-", "aGVs_G8=",
                                 "=aGV", "aGVsbG8=aGVs", "aGVsbG8===", "aGVsbG8é", "\u0430GVsbG8="])
def test_strict_base64_rejects(bad: str) -> None:
    with pytest.raises(RequestRejected) as raised:
        p.b64decode_record(bad, 7)
    assert raised.value.status == 400
    assert raised.value.message == "unable to base64 decode the record at index 7"


def test_python_accepts_the_trap_but_the_codec_does_not() -> None:
    assert base64.b64decode("XXXXXaGVsbG8=") == b"]u\xd7]\xa1\x95\xb1\xb1\xbc"
    with pytest.raises(RequestRejected):
        p.b64decode_record("XXXXXaGVsbG8=", 0)


def test_empty_record_is_allowed() -> None:
    assert p.b64decode_record("", 0) == b""


@given(st.integers(0, 3000))
def test_record_json_size_is_exact(size: int) -> None:
    body = p.encode_request_body("r", 0, [b"x" * size, b"y"])
    single = p.encode_request_body("r", 0, [b"y"])
    assert len(body) - len(single) == p.record_json_size(size)


def test_limits_are_the_protocols() -> None:
    assert len(p.b64encode_record(b"\0" * p.MAX_RECORD_BYTES)) == p.MAX_RECORD_BASE64_CHARS
    assert p.MAX_RECORDS_PER_REQUEST == 10_000
    assert p.MAX_REQUEST_BODY_BYTES == 64 * 1024 * 1024
    assert p.MAX_RESPONSE_BODY_BYTES == 1024 * 1024


# ------------------------------------------------------------------------------------------ the request


def test_encode_request_body_is_the_aws_example() -> None:
    body = p.encode_request_body(AWS_ID, 1578090901599, [b"hello", b"hello world"])
    assert json.loads(body) == {"requestId": AWS_ID, "timestamp": 1578090901599,
                                "records": [{"data": "aGVsbG8="}, {"data": "aGVsbG8gd29ybGQ="}]}
    model = FirehoseRequest.model_validate_json(body)
    assert model.records[1].data == "aGVsbG8gd29ybGQ="


@settings(max_examples=200)
@given(request_id=st.text(min_size=1, max_size=40), timestamp=st.integers(0, 2**63 - 1),
       records=st.lists(st.binary(max_size=200), min_size=1, max_size=30))
def test_encode_then_decode_round_trip(request_id: str, timestamp: int, records: list[bytes]) -> None:
    try:
        request_id.encode()
    except UnicodeEncodeError:
        return
    body = p.encode_request_body(request_id, timestamp, records)
    assert p.decode_request_body(body, request_id) == records
    assert FirehoseRequest.model_validate_json(body).timestamp == timestamp


@pytest.mark.parametrize("records", [[], [b"x"] * 10_001, [b"x" * 1_024_001]])
def test_encode_refuses_what_the_protocol_forbids(records: list[bytes]) -> None:
    with pytest.raises(ValueError, match=r"records|bytes"):
        p.encode_request_body("r", 0, records)


def test_request_headers() -> None:
    headers = p.request_headers("id-1", source_arn="arn:aws:firehose:us-east-1:1:deliverystream/s")
    assert headers == {"X-Amz-Firehose-Protocol-Version": "1.0", "X-Amz-Firehose-Request-Id": "id-1",
                       "X-Amz-Firehose-Source-Arn": "arn:aws:firehose:us-east-1:1:deliverystream/s",
                       "Content-Type": "application/json"}
    full = p.request_headers("id-1", source_arn="a", access_key="k", common_attributes='{"commonAttributes":{}}',
                             gzip_body=True)
    assert full["X-Amz-Firehose-Access-Key"] == "k"
    assert full["Content-Encoding"] == "gzip"
    assert full["X-Amz-Firehose-Common-Attributes"] == '{"commonAttributes":{}}'
    with pytest.raises(ValueError, match="4096"):
        p.request_headers("id", source_arn="a", access_key="k" * 4097)


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"{ test: ", 400, None),
    (b"[]", 400, "invalid JSON body: not an object"),
    (b'{"requestId":"' + AWS_ID.encode() + b'","records":"x"}', 400, "invalid JSON body: records is not a list"),
    (b'{"records":[]}', 400, "missing request id in body"),
    (b'{"requestId":"","records":[]}', 400, "missing request id in body"),
    (b'{"requestId":"other","records":[]}', 400, "different request id in body"),
    (b'{"requestId":"other","records":5}', 400, "invalid JSON body: records is not a list"),
])
def test_decode_request_body_rules(body: bytes, status: int, message: str | None) -> None:
    with pytest.raises(RequestRejected) as raised:
        p.decode_request_body(body, AWS_ID)
    assert raised.value.status == status
    if message is not None:
        assert raised.value.message == message
    else:
        assert raised.value.message.startswith("invalid JSON body: ")


def test_decode_null_or_absent_records_is_empty() -> None:
    assert p.decode_request_body(b'{"requestId":"a","records":null}', "a") == []
    assert p.decode_request_body(b'{"requestId":"a"}', "a") == []


def test_decode_ignores_the_timestamp() -> None:
    for timestamp in (b"1734625715000000000", b'"1578090903599"', b"null", b"1.5"):
        body = b'{"requestId":"a","timestamp":' + timestamp + b',"records":[{"data":"dGVzdA=="}]}'
        assert p.decode_request_body(body, "a") == [b"test"]


# --------------------------------------------------------------------------------------------------- gzip


def test_gunzip_members_and_limits() -> None:
    data = b"0123456789" * 1000
    assert p.gunzip(gzip.compress(data), len(data)) == data
    assert p.gunzip(gzip.compress(data[:10]) + gzip.compress(data[10:]), len(data)) == data
    with pytest.raises(RequestRejected) as raised:
        p.gunzip(gzip.compress(data), len(data) - 1)
    assert (raised.value.status, raised.value.message) == (413, "payload too large")


def gzip_of_zeros(mebibytes: int) -> bytes:
    """One gzip member of ``mebibytes`` MiB of zeros, built without compressing them all: each MiB
    is deflated after a full flush (which resets the window), so every middle MiB deflates to the
    same bytes and is repeated; the trailer's CRC-32 and size are those of all the zeros."""
    zeros = b"\0" * (1024 * 1024)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    middle = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    last = compressor.compress(zeros) + compressor.flush()
    crc = 0
    for _ in range(mebibytes):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, no time, best compression
    return header + first + middle * (mebibytes - 2) + last + struct.pack("<II", crc, (mebibytes << 20) & 0xFFFFFFFF)


def test_a_gzip_of_zeros_built_by_repetition_inflates_to_the_zeros() -> None:
    assert gzip.decompress(gzip_of_zeros(5)) == b"\0" * (5 * 1024 * 1024)


def test_gunzip_bomb_never_materialises() -> None:
    """A 1 GiB bomb is refused after producing at most the cap, not after inflating it all."""
    bomb = gzip_of_zeros(1024)
    assert len(bomb) < 2 * 1024 * 1024
    with pytest.raises(RequestRejected) as raised:
        p.gunzip(bomb, 1024 * 1024)
    assert raised.value.status == 413


@pytest.mark.parametrize("corrupt", [b"", b"plain", gzip.compress(b"abc")[:-1], gzip.compress(b"abc") + b"junk",
                                     gzip.compress(b"abc")[:10]])
def test_gunzip_corrupt(corrupt: bytes) -> None:
    with pytest.raises(RequestRejected) as raised:
        p.gunzip(corrupt, 1000)
    assert (raised.value.status, raised.value.message) == (400, "unable to decompress the gzip body")


def test_gzip_compress_is_deterministic() -> None:
    assert p.gzip_compress(b"abc") == p.gzip_compress(b"abc")
    assert gzip.decompress(p.gzip_compress(b"abc")) == b"abc"


# ------------------------------------------------------------------------------------ common attributes


def test_common_attributes_round_trip() -> None:
    header = p.encode_common_attributes({"deployment -context": "pre-prod-gamma", "device-types": ""})
    assert json.loads(header) == {"commonAttributes": {"deployment -context": "pre-prod-gamma", "device-types": ""}}
    assert p.parse_common_attributes(header) == {"deployment -context": "pre-prod-gamma", "device-types": ""}
    assert p.parse_common_attributes('{"commonAttributes":{}}') == {}


@pytest.mark.parametrize("attributes", [{"": "v"}, {" ": "v"}, {"k" * 257: "v"}, {"k": "v" * 1025},
                                        {f"k{i}": "v" for i in range(51)}])
def test_common_attributes_limits(attributes: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="invalid common attributes"):
        p.encode_common_attributes(attributes)
    with pytest.raises(RequestRejected):
        p.parse_common_attributes(json.dumps({"commonAttributes": attributes}))


def test_common_attributes_at_the_limits() -> None:
    attributes = {f"{i:0256d}": "v" * 1024 for i in range(50)}
    assert p.parse_common_attributes(p.encode_common_attributes(attributes)) == attributes


# --------------------------------------------------------------------------------------------- responses


def test_response_body() -> None:
    assert json.loads(p.response_body("r", 1578090903599)) == {"requestId": "r", "timestamp": 1578090903599}
    error = json.loads(p.response_body("r", 1, "x" * 9000))
    assert error["errorMessage"] == "x" * 8192
    # a header that was not UTF-8 (aiohttp gives surrogates) must still produce valid JSON
    assert json.loads(p.response_body("a\udcff", 1))["requestId"] == "a?"


def accept(status: int = 200, body: bytes = b'{"requestId":"r","timestamp":1578090903599}', *,
           content_type: str | None = "application/json", content_encoding: str | None = None) -> None:
    p.check_response(status, body, "r", content_type=content_type, content_encoding=content_encoding)


def test_conforming_success_is_accepted() -> None:
    accept()
    accept(content_type="application/json; charset=utf-8")
    accept(content_type="Application/JSON ;charset=utf-8")
    accept(body=b'{"requestId":"r","timestamp":1578090903599,"errorMessage":"","extra":[]}')


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"status": 201}, "status 201"),
    ({"status": 413}, "status 413"),
    ({"status": 302}, "status 302"),
    ({"body": b'{"code":200,"status":[{"name":"default","successful":1}]}'}, "does not conform"),
    ({"body": b'{"requestId":"other","timestamp":1578090903599}'}, "requestId differs"),
    ({"body": b'{"requestId":"r","timestamp":"1578090903599"}'}, "does not conform"),
    ({"body": b'{"requestId":"r","timestamp":1578090903.599}'}, "does not conform"),
    ({"body": b'{"requestId":"r"}'}, "does not conform"),
    ({"body": b""}, "does not conform"),
    ({"body": b"ok"}, "does not conform"),
    ({"content_encoding": "gzip"}, "Content-Encoding"),
    ({"content_encoding": "identity"}, "Content-Encoding"),
    ({"content_encoding": ""}, "Content-Encoding"),
    ({"content_type": "application/jsonx"}, "Content-Type"),
    ({"content_type": "text/plain"}, "Content-Type"),
    ({"content_type": None}, "Content-Type"),
    ({"body": b'{"requestId":"r","timestamp":1578090903599,"pad":"' + b"x" * (1024 * 1024) + b'"}'}, "larger than"),
])
def test_non_conforming_responses_are_failures(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(ResponseNotAccepted, match=reason):
        accept(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("timestamp", [b"1578090903", b"0", b"-1", b"1578090903599000", b"1734625715000000000"])
def test_timestamps_not_in_milliseconds_are_failures(timestamp: bytes) -> None:
    with pytest.raises(ResponseNotAccepted, match="not in milliseconds"):
        accept(body=b'{"requestId":"r","timestamp":' + timestamp + b"}")
