"""Hostile input files for the ``csv`` and ``jsonl`` sources, fuzzed with hypothesis: malformed CSV
quoting, huge lines, invalid UTF-8, NUL, byte order marks, CRLF, gzip or not. Reading either gives
rows that fit the schema or stops with a ``SourceDataError`` naming the file, per the configured
``on_bad_record`` (``fail``, ``skip``, ``dead_letter``), always within a time limit (never a hang)."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from egress.connectors.base import SOURCES, SourceRecord
from egress.errors import SourceDataError
from egress.spec import StreamSpec
from tests.fuzzing import fuzz

STREAM = StreamSpec.model_validate({"schema": [
    {"name": "id", "type": "int64", "required": True}, {"name": "name", "type": "string"},
    {"name": "score", "type": "double"}, {"name": "flag", "type": "boolean"}]})
TYPES: dict[str, tuple[type, ...]] = {"id": (int,), "name": (str,), "score": (float, int), "flag": (bool,)}
READ_TIMEOUT = 20.0
COLUMNS = ["id", "name", "score", "flag"]
HUGE = 200_000  # characters: beyond the csv module's default field limit (131,072)

fields = (st.text(max_size=12) | st.sampled_from(['"', '""', '"a"b', 'a"', "\x00", "\r", "\n", "\r\n", ",", "NA",
                                                  "1", "-7", "1.5", "true", "\ufeff", "\u2028"])
          | st.integers(-2**70, 2**70).map(str) | st.just("x" * HUGE))
endings = st.sampled_from(["\n", "\r\n", "\r", ""])
damage = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xef\xbb\xbf",
                                                                    b'"', b"\r", b"\n", b"\xed\xa0\x80"])),
                  max_size=3)


def read_all(kind: str, path: Path, on_bad_record: str) -> tuple[list[SourceRecord], SourceDataError | None, int]:
    """Every record of the ``kind`` source over ``path`` (with ``on_bad_record``), the error that stopped
    it, and how many bad records it skipped or dead-lettered; fails if reading takes over READ_TIMEOUT."""
    source_class = SOURCES.get(kind)
    parameters: dict[str, Any] = {"path": path.name, "on_bad_record": on_bad_record}
    if on_bad_record == "dead_letter":
        parameters["dead_letter_path"] = "dead.jsonl"
    checked = source_class.parameters_model.model_validate(parameters)
    source = source_class.create("fuzzed", checked, STREAM, path.parent)

    def read() -> tuple[list[SourceRecord], SourceDataError | None]:
        got: list[SourceRecord] = []
        try:
            for record in source.records(0):
                got.append(record)
        except SourceDataError as error:
            return got, error
        return got, None

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        records, error = pool.submit(read).result(timeout=READ_TIMEOUT)
    bad = source.bad_records.skipped + source.bad_records.dead_lettered
    return records, error, bad


def check(records: list[SourceRecord], error: SourceDataError | None, path: Path, on_bad_record: str) -> None:
    """Rows fit the schema, positions rise; an error names the file and is one line; under ``skip`` and
    ``dead_letter`` only an unreadable file (not a bad value) stops the source."""
    positions = [record.position for record in records]
    assert positions == sorted(set(positions))
    for record in records:
        assert isinstance(record.row["id"], int)
        assert not isinstance(record.row["id"], bool)
        for name, value in record.row.items():
            assert value is None or (isinstance(value, TYPES[name]) and (name == "flag" or not isinstance(value, bool)))
    if error is not None:
        text = str(error)
        assert str(path) in text, text
        assert "\n" not in text.rstrip("\n"), text
        if "field larger than field limit" in text:  # said to be bad UTF-8 before
            assert "cannot be read as CSV" in text, text
        if on_bad_record != "fail":  # only what is wrong with the whole file
            assert "cannot be read" in text or "the header lacks" in text, text


def write(path: Path, data: bytes, hits: list[tuple[int, bytes]], compressed: bool) -> Path:
    for position, injected in hits:
        at = position % (len(data) + 1)
        data = data[:at] + injected + data[at:]
    if compressed:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


@fuzz(120)
@given(header=st.lists(st.sampled_from(["id", "name", "score", "flag", "other", ""]), min_size=1, max_size=5),
       rows=st.lists(st.lists(fields, max_size=6), max_size=8), quote=st.booleans(), ending=endings,
       bom=st.booleans(), hits=damage, compressed=st.booleans(),
       on_bad_record=st.sampled_from(["fail", "skip", "dead_letter"]))
@example(header=COLUMNS, rows=[["1", "a", "", ""]], quote=False, ending="\r\n", bom=True, hits=[], compressed=False,
         on_bad_record="fail")  # a UTF-8 byte order mark before the header
@example(header=COLUMNS, rows=[["1", "x" * HUGE, "", ""]], quote=False, ending="\n", bom=False, hits=[],
         compressed=False, on_bad_record="skip")
def test_a_hostile_csv_file_gives_rows_or_one_clear_error(
        header: list[str], rows: list[list[str]], quote: bool, ending: str, bom: bool, hits: list[tuple[int, bytes]],
        compressed: bool, on_bad_record: str) -> None:
    def line(values: list[str]) -> str:
        return ",".join(f'"{v}"' if quote else v for v in values)

    text = ("\ufeff" if bom else "") + ending.join(line(values) for values in [header, *rows]) + ending
    with tempfile.TemporaryDirectory(prefix="egress-csv-fuzz-") as directory:
        path = write(Path(directory) / "input.csv", text.encode(), hits, compressed)
        records, error, _ = read_all("csv", path, on_bad_record)
        check(records, error, path, on_bad_record)
        if bom and not hits and header == COLUMNS and rows == [["1", "a", "", ""]]:
            assert error is None
            assert [r.row["id"] for r in records] == [1]


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.sampled_from(["id", "name", "score", "flag", "x"]), children,
                                             max_size=4), max_leaves=10)


@fuzz(120)
@given(lines=st.lists(json_values.map(json.dumps) | fields, max_size=8), ending=endings, bom=st.booleans(),
       hits=damage, compressed=st.booleans(), on_bad_record=st.sampled_from(["fail", "skip", "dead_letter"]))
@example(lines=['{"id": 1, "name": "a"}'], ending="\r\n", bom=True, hits=[], compressed=False, on_bad_record="fail")
@example(lines=['{"id": 1, "name": "' + "y" * HUGE + '"}'], ending="\n", bom=False, hits=[], compressed=True,
         on_bad_record="fail")
def test_a_hostile_jsonl_file_gives_rows_or_one_clear_error(
        lines: list[str], ending: str, bom: bool, hits: list[tuple[int, bytes]], compressed: bool,
        on_bad_record: str) -> None:
    text = ("\ufeff" if bom else "") + ending.join(lines) + ending
    with tempfile.TemporaryDirectory(prefix="egress-jsonl-fuzz-") as directory:
        path = write(Path(directory) / "input.jsonl", text.encode(), hits, compressed)
        records, error, bad = read_all("jsonl", path, on_bad_record)
        check(records, error, path, on_bad_record)
        if bom and not hits and lines == ['{"id": 1, "name": "a"}']:
            assert error is None
            assert bad == 0
            assert [r.row["id"] for r in records] == [1]
