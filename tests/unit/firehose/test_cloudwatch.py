"""CloudWatch Logs subscription records, as Firehose delivers them (gzip'd JSON inside the base64 data)."""

from __future__ import annotations

import contextlib
import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.firehose import CloudWatchLogsDecodeError, PermanentError, decode_cloudwatch_logs

# The CWLog example of the Firehose HTTP endpoint spec ("Examples"), as the record's bytes.
EXAMPLE = {
    "messageType": "DATA_MESSAGE",
    "owner": "123456789012",
    "logGroup": "log_group_name",
    "logStream": "log_stream_name",
    "subscriptionFilters": ["subscription_filter_name"],
    "logEvents": [
        {"id": "0123456789012345678901234567890123456789012345", "timestamp": 1510109208016,
         "message": "log message 1"},
        {"id": "0123456789012345678901234567890123456789012345", "timestamp": 1510109208017,
         "message": "log message 2"},
    ],
}


def test_gzipped_example() -> None:
    data = decode_cloudwatch_logs(gzip.compress(json.dumps(EXAMPLE).encode()))
    assert data.logGroup == "log_group_name"
    assert [event.message for event in data.logEvents] == ["log message 1", "log message 2"]
    assert data.logEvents[1].timestamp == 1510109208017
    assert not data.is_control_message


def test_already_decompressed_example() -> None:
    assert decode_cloudwatch_logs(json.dumps(EXAMPLE).encode()).owner == "123456789012"


def test_control_message() -> None:
    event = {"id": "", "timestamp": 1432826855000, "message": "CWL CONTROL MESSAGE: Checking health of destination"}
    control = {"messageType": "CONTROL_MESSAGE", "owner": "CloudwatchLogs", "logGroup": "", "logStream": "",
               "subscriptionFilters": [], "logEvents": [event]}
    assert decode_cloudwatch_logs(gzip.compress(json.dumps(control).encode())).is_control_message


@pytest.mark.parametrize("record", [b"", b"\x1f", b"\x1f\x8b", b"\x1f\x8b\x08", b"{", b"[]", b"{}",
                                    gzip.compress(b"not json"), gzip.compress(json.dumps(EXAMPLE).encode())[:-4],
                                    json.dumps({"messageType": "DATA_MESSAGE", "logEvents": [{"id": 1}]}).encode()])
def test_bad_records_raise_the_documented_error(record: bytes) -> None:
    with pytest.raises(CloudWatchLogsDecodeError):
        decode_cloudwatch_logs(record)


def test_the_error_is_permanent_for_a_receiver_handler() -> None:
    assert issubclass(CloudWatchLogsDecodeError, PermanentError)


def test_decompression_is_capped() -> None:
    bomb = gzip.compress(json.dumps({"messageType": "DATA_MESSAGE", "pad": " " * 100_000}).encode())
    with pytest.raises(CloudWatchLogsDecodeError, match="too large"):
        decode_cloudwatch_logs(bomb, max_decompressed_bytes=50_000)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_raise_anything_else(record: bytes) -> None:
    with contextlib.suppress(CloudWatchLogsDecodeError):
        decode_cloudwatch_logs(record)
