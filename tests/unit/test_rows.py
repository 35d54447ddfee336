"""The stored form of rows (egress.rows): MessagePack keeps bytes and text apart and exact; rows an
earlier version stored as JSON still read; a value that cannot be stored is named."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.errors import ProcessFunctionError, RowEncodingError
from egress.rows import (
    BYTES_MARKER,
    bytes_as_json,
    decode_row,
    encode_row,
    unstorable_column,
    unstorable_row_error,
)

EVERY_BYTE = bytes(range(256))

values = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() \
    | st.binary()
rows = st.dictionaries(st.text(), values)


def test_a_row_with_every_byte_value_reads_back_with_the_same_bytes_and_types() -> None:
    row = {"payload": EVERY_BYTE, "nul": b"\x00", "invalid_utf8": b"\xc3\x28\xff\xfe\x80", "text": "caf\u00e9 \u2603",
           "none": None, "int": -(2**63), "uint": 2**64 - 1, "double": 0.1, "flag": True, "empty": b""}
    decoded = decode_row(encode_row(row))
    assert decoded == row
    assert [type(v) for v in decoded.values()] == [type(v) for v in row.values()]


def test_nan_and_infinities_survive_where_json_would_write_null() -> None:
    decoded = decode_row(encode_row({"nan": math.nan, "inf": math.inf}))
    assert math.isnan(decoded["nan"])
    assert decoded["inf"] == math.inf


@given(rows)
def test_any_row_round_trips_and_its_stored_form_never_starts_like_json(row: dict[str, object]) -> None:
    stored = encode_row(row)
    assert stored[0] != ord("{")  # the per-row marker that tells JSON rows of layout version 1 apart
    assert decode_row(stored) == row


def test_a_row_stored_as_json_by_an_earlier_version_reads_as_json() -> None:
    old = orjson.dumps({"payload": "p1", "n": 1, "none": None})
    assert decode_row(old) == {"payload": "p1", "n": 1, "none": None}
    assert decode_row(b"{}") == {}
    assert [decode_row(r) for r in (old, encode_row({"payload": b"\xff"}), b"{}")] == [
        {"payload": "p1", "n": 1, "none": None}, {"payload": b"\xff"}, {}]


def test_the_column_that_cannot_be_stored_is_named_with_the_reason() -> None:
    surrogate = b"\xff".decode("utf-8", "surrogateescape")
    column, reason = unstorable_column({"ok": b"\xff", "payload": surrogate})
    assert column == "payload"
    assert "surrogates" in reason
    assert "emit bytes for binary data" in reason
    assert unstorable_column({"n": 2**64})[0] == "n"
    assert unstorable_column({"x": object()}) == (
        "x", "Type is not msgpack serializable: object (value of type object)")
    assert unstorable_column({1: "not a str column name"})[0] == ""  # type: ignore[dict-item]


def test_the_unstorable_row_error_names_where_stream_column_and_message_id() -> None:
    error = unstorable_row_error("computation 'c' partition 2", "requests", b"\x01\xab",
                                 {"payload": "\udcff"})
    assert isinstance(error, RowEncodingError)
    assert isinstance(error, ProcessFunctionError)
    assert str(error).startswith("computation 'c' partition 2 emitted message 01AB to stream 'requests' whose "
                                 "column 'payload' cannot be stored (")
    assert (error.stream, error.column, error.message_id) == ("requests", "payload", b"\x01\xab")
    with pytest.raises(TypeError):
        encode_row({"payload": "\udcff"})


def test_json_output_shows_bytes_as_base64_under_a_marker_and_text_as_text() -> None:
    line = orjson.dumps({"row": {"b": b"\x00\xff", "t": "\u00e9", "k": [b"a"]}}, default=bytes_as_json)
    assert orjson.loads(line) == {"row": {"b": {BYTES_MARKER: "AP8="}, "t": "\u00e9", "k": [{BYTES_MARKER: "YQ=="}]}}
    with pytest.raises(TypeError):
        orjson.dumps({"x": object()}, default=bytes_as_json)
