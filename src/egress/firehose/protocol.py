"""The Amazon Data Firehose HTTP endpoint protocol: names, limits, models and the codec.

Source of every rule: the Firehose HTTP endpoint delivery spec ("Understand HTTP endpoint delivery
request and response specifications", seed 002) as made exact in ``docs/firehose.md``. Header and
field names are Firehose's own. Sizes are bytes unless named ``..._CHARS``; timestamps are integer
milliseconds since the Unix epoch.

Both sides use this module: the receiver (:mod:`egress.firehose.receiver`) decodes requests with
:func:`decode_request_body`, :func:`gunzip` and :func:`parse_common_attributes`, which raise
:class:`~egress.firehose.errors.RequestRejected` carrying the status and ``errorMessage`` of the
decision table; a sender encodes with :func:`encode_request_body` and :func:`request_headers` and
judges answers with :func:`check_response`.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from egress.firehose.errors import RequestRejected, ResponseNotAccepted

# Header names (request, "Request format").
HEADER_PROTOCOL_VERSION = "X-Amz-Firehose-Protocol-Version"
HEADER_REQUEST_ID = "X-Amz-Firehose-Request-Id"
HEADER_SOURCE_ARN = "X-Amz-Firehose-Source-Arn"
HEADER_ACCESS_KEY = "X-Amz-Firehose-Access-Key"
HEADER_COMMON_ATTRIBUTES = "X-Amz-Firehose-Common-Attributes"
PROTOCOL_VERSION = "1.0"
CONTENT_TYPE_JSON = "application/json"

# Limits ("Request format" and "Response format").
MAX_RECORDS_PER_REQUEST = 10_000
"""``records``: 1..10,000 items."""
MAX_RECORD_BYTES = 1_024_000
"""A record's data before base64 encoding; empty records are allowed."""
MAX_RECORD_BASE64_CHARS = 1_365_336
"""The longest ``records[].data`` string."""
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
"""The request body before compression (64 MiB)."""
MAX_RESPONSE_BODY_BYTES = 1024 * 1024
"""The response body (1 MiB)."""
MAX_ACCESS_KEY_BYTES = 4096
MAX_COMMON_ATTRIBUTES = 50
MAX_COMMON_ATTRIBUTE_KEY_CHARS = 256
MAX_COMMON_ATTRIBUTE_VALUE_CHARS = 1024
MAX_ERROR_MESSAGE_CHARS = 8192
PLAUSIBLE_TIMESTAMP_MS = (10**11, 10**14)
"""A response ``timestamp`` outside [1973-03-03, 5138-11-16] in ms is seconds (Telegraf, Alloy, moto and
LocalStack answer seconds) or micro/nanoseconds: not conforming (``docs/firehose.md``, "Sender: the
``firehose_http`` sink")."""
RESPONSE_TIMEOUT_SECONDS = 180.0
"""Firehose waits 3 minutes for a response before it counts the attempt as failed."""

# errorMessage texts of the receiver decision table (docs/firehose.md); tests compare against these.
MSG_METHOD_NOT_ALLOWED = "method not allowed"
MSG_NOT_FOUND = "not found"
MSG_PAYLOAD_TOO_LARGE = "payload too large"
MSG_REQUEST_TIMEOUT = "the body did not arrive whole within body_timeout"
MSG_MISSING_HEADER_REQUEST_ID = "missing request id in header"
MSG_INVALID_ACCESS_KEY = "invalid firehose access key"
MSG_UNSUPPORTED_PROTOCOL_VERSION = "unsupported protocol version"
MSG_UNSUPPORTED_CONTENT_TYPE = "unsupported content type, expected application/json"
MSG_UNSUPPORTED_CONTENT_ENCODING = "unsupported content encoding, expected gzip or none"
MSG_CORRUPT_GZIP = "unable to decompress the gzip body"
MSG_MISSING_BODY_REQUEST_ID = "missing request id in body"
MSG_DIFFERENT_BODY_REQUEST_ID = "different request id in body"

# Per record: '{"data":"' + base64 + '"}' plus the separating comma.
RECORD_JSON_OVERHEAD_BYTES = len(b'{"data":""},')


class FirehoseRecord(BaseModel):
    """One item of ``records``: ``data`` is the record's bytes in standard base64 (0..1,365,336 chars)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    data: Annotated[StrictStr, Field(max_length=MAX_RECORD_BASE64_CHARS)]


class FirehoseRequest(BaseModel):
    """The request body (``FirehoseCustomHttpsEndpointRequest``).

    ``requestId`` equals the ``X-Amz-Firehose-Request-Id`` header; ``timestamp`` is when the sender
    built the request, ms since the epoch (informative: receivers accept any integer); ``records``
    holds 1..10,000 items. The receiver does not use this model on its hot path (it decodes with
    :func:`decode_request_body` to give the decision table's messages); it is here for endpoint
    authors and for checking what a sender produced.
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    requestId: StrictStr
    timestamp: StrictInt | None = None
    records: Annotated[list[FirehoseRecord], Field(min_length=1, max_length=MAX_RECORDS_PER_REQUEST)]


class FirehoseResponse(BaseModel):
    """The response body (``FirehoseCustomHttpsEndpointResponse``).

    ``requestId`` must equal the request's; ``timestamp`` is an integer, ms since the epoch (a string
    or a float is not conforming); ``errorMessage`` (0..8192 chars) explains a failure.
    """

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)
    requestId: StrictStr
    timestamp: StrictInt
    errorMessage: Annotated[StrictStr, Field(max_length=MAX_ERROR_MESSAGE_CHARS)] | None = None


class CommonAttributes(BaseModel):
    """The ``X-Amz-Firehose-Common-Attributes`` header value: ``{"commonAttributes": {str: str}}``.

    0..50 attributes; a key has 1..256 characters and is not only white space; a value has 0..1024.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    commonAttributes: dict[StrictStr, StrictStr]

    @field_validator("commonAttributes")
    @classmethod
    def _limits(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_COMMON_ATTRIBUTES:
            raise ValueError(f"at most {MAX_COMMON_ATTRIBUTES} attributes, got {len(value)}")
        for key, item in value.items():
            if not 1 <= len(key) <= MAX_COMMON_ATTRIBUTE_KEY_CHARS or not key.strip():
                raise ValueError(f"attribute name {key[:40]!r} must have 1..256 characters, not only white space")
            if len(item) > MAX_COMMON_ATTRIBUTE_VALUE_CHARS:
                raise ValueError(f"attribute {key[:40]!r}: value longer than {MAX_COMMON_ATTRIBUTE_VALUE_CHARS}")
        return value


# ---------------------------------------------------------------------------------------------- records


def b64encode_record(data: bytes) -> str:
    """Standard base64 with padding, no line breaks (the encoding of ``records[].data``)."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def b64decode_record(data: str, index: int) -> bytes:
    """Decode one ``records[].data`` strictly: standard alphabet, padding only at the end, length a
    multiple of 4, no white space. Python's ``base64.b64decode`` accepts ``XXXXXaGVsbG8=`` (13 chars);
    this does not (docs/firehose.md, "the Python base64 trap").

    Raises :class:`RequestRejected` (400, ``unable to base64 decode the record at index N``).
    """
    if len(data) % 4 != 0 or not data.isascii():
        raise RequestRejected(400, f"unable to base64 decode the record at index {index}")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise RequestRejected(400, f"unable to base64 decode the record at index {index}") from None


def record_json_size(data_bytes: int) -> int:
    """Bytes one record of ``data_bytes`` adds to the request body: base64 length plus JSON framing."""
    return 4 * math.ceil(data_bytes / 3) + RECORD_JSON_OVERHEAD_BYTES


# -------------------------------------------------------------------------------------------- requests


def encode_request_body(request_id: str, timestamp_ms: int, records: Sequence[bytes]) -> bytes:
    """The request body JSON: ``{"requestId", "timestamp", "records": [{"data": base64}, ...]}``.

    Raises ``ValueError`` when there are no records, more than 10,000, or a record over 1,024,000
    bytes ("Request format", body schema). The 64 MiB body limit is the batcher's job
    (:func:`record_json_size` gives each record's share).
    """
    if not 1 <= len(records) <= MAX_RECORDS_PER_REQUEST:
        raise ValueError(f"a request holds 1..{MAX_RECORDS_PER_REQUEST} records, got {len(records)}")
    longest = max(map(len, records))
    if longest > MAX_RECORD_BYTES:
        raise ValueError(f"a record holds at most {MAX_RECORD_BYTES} bytes, got {longest}")
    b64 = functools.partial(binascii.b2a_base64, newline=False)
    return b"".join((
        b'{"requestId":', orjson.dumps(request_id), b',"timestamp":', str(int(timestamp_ms)).encode(),
        b',"records":[{"data":"', b'"},{"data":"'.join(map(b64, records)), b'"}]}',
    ))


def encode_common_attributes(attributes: Mapping[str, str]) -> str:
    """The ``X-Amz-Firehose-Common-Attributes`` header value for ``attributes``.

    Raises ``ValueError`` when the attributes break the header's schema limits (see
    :class:`CommonAttributes`).
    """
    try:
        model = CommonAttributes(commonAttributes=dict(attributes))
    except ValidationError as error:
        raise ValueError(f"invalid common attributes: {_first_error(error)}") from None
    return orjson.dumps({"commonAttributes": model.commonAttributes}).decode()


def request_headers(
    request_id: str,
    *,
    source_arn: str,
    access_key: str | None = None,
    common_attributes: str | None = None,
    gzip_body: bool = False,
) -> dict[str, str]:
    """The headers of one request ("Request format"); Content-Length is the HTTP client's job.

    ``common_attributes`` is the already encoded header value (:func:`encode_common_attributes`);
    ``access_key`` and ``common_attributes`` are sent only when not ``None``; Content-Encoding only
    with ``gzip_body``. Raises ``ValueError`` for an access key over 4096 bytes.
    """
    headers = {
        HEADER_PROTOCOL_VERSION: PROTOCOL_VERSION,
        HEADER_REQUEST_ID: request_id,
        HEADER_SOURCE_ARN: source_arn,
        "Content-Type": CONTENT_TYPE_JSON,
    }
    if access_key is not None:
        if len(access_key.encode()) > MAX_ACCESS_KEY_BYTES:
            raise ValueError(f"the access key must have at most {MAX_ACCESS_KEY_BYTES} bytes")
        headers[HEADER_ACCESS_KEY] = access_key
    if common_attributes is not None:
        headers[HEADER_COMMON_ATTRIBUTES] = common_attributes
    if gzip_body:
        headers["Content-Encoding"] = "gzip"
    return headers


def gzip_compress(body: bytes, level: int = 6) -> bytes:
    """gzip ``body`` (RFC 1952, mtime 0 so equal bodies compress to equal bytes)."""
    return gzip.compress(body, compresslevel=level, mtime=0)


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """Decompress a gzip body (one or more members) without ever producing more than ``max_bytes``.

    Raises :class:`RequestRejected` 413 (``payload too large``) as soon as the output would exceed
    ``max_bytes`` (a gzip bomb stops there), and 400 (``unable to decompress the gzip body``) for
    data that is not gzip, is truncated, or has trailing garbage.
    """
    out: list[bytes] = []
    produced = 0
    data = body
    if not data:
        raise RequestRejected(400, MSG_CORRUPT_GZIP)
    try:
        while data:
            decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            while True:
                chunk = decompressor.decompress(data, max(1, max_bytes - produced + 1))
                produced += len(chunk)
                if produced > max_bytes:
                    raise RequestRejected(413, MSG_PAYLOAD_TOO_LARGE)
                out.append(chunk)
                data = decompressor.unconsumed_tail
                if decompressor.eof or not data:
                    break
            if not decompressor.eof:
                raise RequestRejected(400, MSG_CORRUPT_GZIP)
            data = decompressor.unused_data
    except zlib.error:
        raise RequestRejected(400, MSG_CORRUPT_GZIP) from None
    return b"".join(out)


def decode_request_body(
    body: bytes,
    header_request_id: str,
    *,
    max_records: int = MAX_RECORDS_PER_REQUEST,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> list[bytes]:
    """Parse and check a (decompressed) request body; returns the decoded records in order.

    Rules in the order of the decision table (docs/firehose.md): the body is a JSON object whose
    ``records`` is a list (``null`` or absent counts as no records, as OTel's receiver does); the
    body ``requestId`` is a non-empty string equal to ``header_request_id``; every record is an
    object whose ``data`` is strict base64 (:func:`b64decode_record`). ``timestamp`` is not checked
    (informative; Telegraf's vector sends nanoseconds). egress adds the protocol's limits: more than
    ``max_records`` records or a record over ``max_record_bytes`` bytes is a 413.

    Raises :class:`RequestRejected` (400 or 413) naming the first rule that fails.
    """
    try:
        document: Any = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RequestRejected(400, f"invalid JSON body: {error}") from None
    if not isinstance(document, dict):
        raise RequestRejected(400, "invalid JSON body: not an object")
    records = document.get("records")
    if records is None:
        records = []
    elif not isinstance(records, list):
        raise RequestRejected(400, "invalid JSON body: records is not a list")
    body_request_id = document.get("requestId")
    if not isinstance(body_request_id, str) or not body_request_id:
        raise RequestRejected(400, MSG_MISSING_BODY_REQUEST_ID)
    if body_request_id != header_request_id:
        raise RequestRejected(400, MSG_DIFFERENT_BODY_REQUEST_ID)
    if len(records) > max_records:
        raise RequestRejected(413, f"too many records: {len(records)} > {max_records}")
    decoded: list[bytes] = []
    append = decoded.append
    for index, record in enumerate(records):
        data = record.get("data") if isinstance(record, dict) else None
        if not isinstance(data, str):
            raise RequestRejected(400, f"unable to base64 decode the record at index {index}")
        raw = b64decode_record(data, index)
        if len(raw) > max_record_bytes:
            raise RequestRejected(413, f"record at index {index} is larger than {max_record_bytes} bytes")
        append(raw)
    return decoded


def parse_common_attributes(value: str) -> dict[str, str]:
    """Parse the ``X-Amz-Firehose-Common-Attributes`` header (see :class:`CommonAttributes`).

    Raises :class:`RequestRejected` (400, ``invalid common attributes header: ...``) when it is not
    ``{"commonAttributes": {str: str}}`` within the schema's limits.
    """
    try:
        return CommonAttributes.model_validate_json(value).commonAttributes
    except ValidationError as error:
        raise RequestRejected(400, f"invalid common attributes header: {_first_error(error)}") from None


# ------------------------------------------------------------------------------------------- responses


def response_body(request_id: str, timestamp_ms: int, error_message: str | None = None) -> bytes:
    """The response JSON: ``{"requestId", "timestamp"}`` plus ``errorMessage`` on errors, cut to 8192
    characters ("Response format", body schema)."""
    if not _utf8_safe(request_id):  # a header that was not UTF-8 must still give valid JSON
        request_id = request_id.encode("utf-8", "replace").decode("utf-8")
    document: dict[str, Any] = {"requestId": request_id, "timestamp": int(timestamp_ms)}
    if error_message is not None:
        message = error_message[:MAX_ERROR_MESSAGE_CHARS]
        document["errorMessage"] = message if _utf8_safe(message) else message.encode("utf-8", "replace").decode()
    return orjson.dumps(document)


def check_response(
    status: int,
    body: bytes,
    request_id: str,
    *,
    content_type: str | None,
    content_encoding: str | None,
) -> FirehoseResponse:
    """Accept a response only if it is a conforming success; returns the parsed body.

    Success requires all of ("Response format"; reference "Response"): status 200; a Content-Type
    whose media type is ``application/json`` (case-insensitive; parameters such as ``charset``
    allowed; ``None`` = the header is absent, which fails); no Content-Encoding header at all
    (``content_encoding`` is ``None``; any value, ``identity`` or empty included, fails: "MUST NOT be
    used"); a body of at most 1 MiB that is a JSON object with ``requestId == request_id`` and an
    integer ``timestamp`` in milliseconds (within :data:`PLAUSIBLE_TIMESTAMP_MS`; a seconds value is
    refused). Content-Length is not required (a chunked answer from a proxy is accepted if all else
    conforms; the reference's success rule does not list it). Raises :class:`ResponseNotAccepted`
    naming the first rule that fails (Firehose treats all of these as a 500 without body, i.e.
    retryable, except a 413 which is permanent: that is the caller's call).
    """
    if status != 200:
        raise ResponseNotAccepted(status, f"status {status}", body[:MAX_RESPONSE_BODY_BYTES])
    if content_encoding is not None:
        raise ResponseNotAccepted(status, f"response has Content-Encoding {content_encoding!r}", b"")
    if content_type is None or content_type.split(";", 1)[0].strip(" \t").lower() != CONTENT_TYPE_JSON:
        raise ResponseNotAccepted(status, f"response Content-Type is {content_type!r}, not application/json",
                                  body[:MAX_RESPONSE_BODY_BYTES])
    if len(body) > MAX_RESPONSE_BODY_BYTES:
        raise ResponseNotAccepted(status, f"response body larger than {MAX_RESPONSE_BODY_BYTES} bytes", b"")
    try:
        parsed = FirehoseResponse.model_validate_json(body)
    except ValidationError as error:
        raise ResponseNotAccepted(status, f"response body does not conform: {_first_error(error)}", body) from None
    if parsed.requestId != request_id:
        raise ResponseNotAccepted(status, "response requestId differs from the request's", body)
    low, high = PLAUSIBLE_TIMESTAMP_MS
    if not low <= parsed.timestamp < high:
        raise ResponseNotAccepted(status, f"response timestamp {parsed.timestamp} is not in milliseconds", body)
    return parsed


def _utf8_safe(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_error(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    where = "/".join(str(part) for part in first.get("loc", ()))
    return f"{where}: {first['msg']}" if where else str(first["msg"])
