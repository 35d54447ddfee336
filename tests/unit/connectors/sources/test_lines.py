"""The ``lines`` source: each non-empty line a record, read as byte chunks that hold the same records
and positions as one record at a time, from any position, plain or gzip; what it refuses."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.connectors.sources.files import FileSourceParameters, LinesSource
from egress.errors import SourceChangedError, SourceDataError
from egress.spec import StreamSpec

STREAM = StreamSpec.model_validate({"schema": [{"name": "line", "type": "string", "required": True}]})


def lines_source(folder: Path, content: bytes, name: str = "in.txt") -> LinesSource:
    path = folder / name
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    return LinesSource.create("s", FileSourceParameters(path=name), STREAM, folder)


def test_empty_lines_are_no_records_and_a_last_line_without_newline_is_one(tmp_path: Path) -> None:
    source = lines_source(tmp_path, b"\xef\xbb\xbf\na\n\n\n b \r\n\xc3\xa9 \xe2\x9c\x93\nlast")
    assert [(r.position, r.row) for r in source.records(0)] == [
        (0, {"line": "a"}), (1, {"line": " b \r"}), (2, {"line": "é ✓"}), (3, {"line": "last"})]
    assert list(source.line_chunks(0)) == [(b"a\n b \r\n\xc3\xa9 \xe2\x9c\x93\n", 0, 3), (b"last\n", 3, 1)]


@given(st.lists(st.sampled_from([b"", b"x", b"yy", b"\xc3\xa9", b"longer line"]), max_size=40),
       st.integers(1, 16), st.integers(0, 45), st.booleans())
def test_chunks_hold_the_records_and_positions_of_one_record_at_a_time(
        lines: list[bytes], chunk_bytes: int, start: int, compressed: bool) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        source = lines_source(Path(folder), b"".join(line + b"\n" for line in lines),
                              "in.txt.gz" if compressed else "in.txt")
        records = [line for line in lines if line]
        if start > len(records):
            with pytest.raises(SourceChangedError, match="shortened"):
                list(source.line_chunks(start, chunk_bytes))
            return
        chunks = list(source.line_chunks(start, chunk_bytes))
        assert b"".join(data for data, _, _ in chunks) == b"".join(r + b"\n" for r in records[start:])
        position = start
        for data, first, count in chunks:
            assert (first, count) == (position, data.count(b"\n"))
            assert count > 0
            position += count
        assert [r.row["line"].encode() for r in source.records(start)] == records[start:]


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    source = lines_source(tmp_path, b"fine\n\xff\xfe broken\n")
    with pytest.raises(SourceDataError, match=r"in\.txt: cannot be read as a UTF-8 text file"):
        list(source.line_chunks(0))


def test_the_stream_must_be_one_string_column_and_timestamps_and_follow_are_refused(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a\n")
    two = StreamSpec.model_validate({"schema": [{"name": "a", "type": "string"}, {"name": "b", "type": "string"}]})
    errors = LinesSource.check(FileSourceParameters(path="in.txt", timestamp_column="a"), two, tmp_path)
    assert [(e.path, str(e)) for e in errors] == [
        ("output_stream_id", "output_stream_id: the lines source writes each line to the one column of its output "
                             "stream: give that stream exactly one column, of type string"),
        ("parameters/timestamp_column", "parameters/timestamp_column: the lines source has no timestamp column: "
                                        "remove timestamp_column")]
    assert LinesSource.check(FileSourceParameters(path="in.txt"), STREAM, tmp_path) == []
