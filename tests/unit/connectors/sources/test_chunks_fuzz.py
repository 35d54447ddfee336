"""A ``jsonl`` source read a chunk at a time gives what reading it one record at a time gives (the
records, their positions, rows and timestamps, the bad records' errors naming file, line and column,
each at the same point), and the one-schema row check agrees with the column-by-column one."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from egress.connectors.sources import JsonlSource
from egress.connectors.sources.chunks import RecordChunk
from egress.connectors.sources.files import FileSourceParameters
from egress.connectors.sources.schema import JsonRows, document_row, json_row, timestamp_of
from egress.errors import SourceDataError
from egress.spec import StreamSpec
from tests.fuzzing import fuzz

STREAM = StreamSpec.model_validate({"schema": [
    {"name": "id", "type": "int64", "required": True}, {"name": "name", "type": "string"},
    {"name": "score", "type": "double"}, {"name": "flag", "type": "boolean"}, {"name": "at", "type": "string"}]})
NAMES = [column.name for column in STREAM.columns]

values = (st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.sampled_from([2**63 - 1, 2**63, -2**63 - 1])
          | st.floats(allow_nan=False, allow_infinity=False)
          | st.sampled_from(["", "x", "2013-01-01T10:00:00Z", "not a time"]) | st.lists(st.integers(), max_size=2))
documents = st.dictionaries(st.sampled_from([*NAMES, "extra"]), values, max_size=6)
# Lines: objects (any key order, any values), blank lines and lines that are no JSON object.
lines = (documents.map(json.dumps)  # the standard library's: integers beyond 64 bits too
         | st.sampled_from(["", "   ", "{not json", "[1, 2]", "null", '{"id": 1} trailing'])
         | st.builds(lambda i: orjson.dumps({"id": i, "name": "n", "score": 1.5, "flag": True, "at": None}).decode(),
                     st.integers(0, 1000)))


def one_at_a_time(content: list[str], start: int, on_bad_record: str, timestamps: bool,
                  file: str) -> Iterator[tuple[int, dict[str, Any], float | None] | str]:
    """What the source read one line at a time yields: ``(position, row, timestamp)``, or a bad
    record's error text (raised with ``fail``, dropped with ``skip``); its position still counts."""
    position = 0
    for line, raw in enumerate(content, start=1):
        if not raw.strip():
            continue
        if position >= start:
            try:
                row = json_row(raw, STREAM.columns, f"{file}:{line}")
                yield position, row, timestamp_of(row, STREAM, "at" if timestamps else None, file, line)
            except SourceDataError as error:
                yield str(error)
                if on_bad_record == "fail":
                    return
        position += 1


GOOD = [orjson.dumps({"id": i, "name": "n"}).decode() for i in range(3)]


@fuzz(150)
@example([GOOD[0], "", GOOD[1], GOOD[2], "{not json"], 2, 0, "fail", False)  # a blank line in the first chunk
@example([GOOD[0], '{"id": 1.5}', GOOD[1], GOOD[2], GOOD[0]], 2, 1, "skip", True)
@given(st.lists(lines, max_size=14), st.integers(1, 5), st.integers(0, 4), st.sampled_from(["fail", "skip"]),
       st.booleans())
def test_chunks_hold_the_records_and_errors_of_reading_one_at_a_time(
        content: list[str], count: int, start: int, on_bad_record: str, timestamps: bool) -> None:
    text = "".join(line + "\n" for line in content)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.jsonl"
        path.write_text(text)
        parameters = FileSourceParameters(path="f.jsonl", on_bad_record=on_bad_record,  # type: ignore[arg-type]
                                          timestamp_column="at" if timestamps else None)
        expected = list(one_at_a_time(content, start, on_bad_record, timestamps, str(path)))
        records = len([1 for item in expected if not isinstance(item, str)])
        if start > len([line for line in content if line.strip()]):
            return  # fewer records than the start position: refused (SourceChangedError), as before
        chunks: list[RecordChunk] = []
        error = None
        try:
            for chunk in JsonlSource.create("s", parameters, STREAM, Path(folder)).record_chunks(start, count):
                chunks.append(chunk)
        except SourceDataError as raised:
            error = str(raised)
    got = [(p, r, t) for c in chunks for p, r, t in zip(c.positions, c.rows, c.event_timestamps, strict=True)]
    assert [[list(row.items()), position, timestamp] for position, row, timestamp in got] == [
        [list(item[1].items()), item[0], item[2]] for item in expected if not isinstance(item, str)][:len(got)]
    failed = on_bad_record == "fail" and bool(expected) and isinstance(expected[-1], str)
    assert error == (expected[-1] if failed else None)
    # Every record before a bad one is yielded (its chunk ends there), in full chunks but the last.
    assert len(got) == records
    assert all(len(chunk.rows) == count for chunk in chunks[:-1])
    assert all(0 < len(chunk.rows) <= count for chunk in chunks)


@fuzz(300)
@example({"id": 2**63})  # beyond int64: orjson decodes up to 2**64 - 1
@example({"name": "n", "id": 2**63 - 1, "score": 1})  # another key order; an int for a double
@example({"id": 1, "name": None, "score": 1.5, "flag": False, "at": "x"})
@example({"id": None})
@given(documents | values)
def test_the_one_schema_row_check_gives_the_row_of_the_column_by_column_check_or_defers_to_it(document: Any) -> None:
    rows = JsonRows(STREAM.columns)
    row = rows.row(document)
    try:
        expected: dict[str, Any] | None = document_row(document, STREAM.columns, "f:1")
    except SourceDataError:
        expected = None
    if row is not None:  # None: needs converting (an int for a double) or is bad, as document_row says
        assert expected is not None
        assert list(row.items()) == list(expected.items())
        assert [type(value) for value in row.values()] == [type(value) for value in expected.values()]
    elif expected is not None:
        assert any(type(document.get(c.name)) is int and c.type == "double" for c in STREAM.columns)


PLAIN = {"id": 1, "name": "n", "score": 1.5, "flag": True, "at": None}


@fuzz(200)
@example([PLAIN, {**PLAIN, "id": 2**63}])  # one int64 out of range: all checked one at a time
@example([PLAIN, {**PLAIN, "id": None}])  # a null in a required column
@example([PLAIN, {"at": None, **PLAIN}])  # another key order: a row of its own
@example([PLAIN, {**PLAIN, "score": 2}])  # an int for a double: converted one at a time
@given(st.lists(documents | st.just(PLAIN) | st.builds(lambda i: {**PLAIN, "id": i}, st.integers(-2**64, 2**64)),
                max_size=6))
def test_a_chunks_row_check_gives_the_rows_of_checking_each_document(chunk: list[Any]) -> None:
    rows = JsonRows(STREAM.columns)
    each = [rows.row(document) for document in chunk]
    together = rows.rows(chunk)
    if None in each:
        assert together is None
    else:
        assert together is not None
        assert [list(row.items()) for row in together] == [list(row.items()) for row in each]  # type: ignore[union-attr]
