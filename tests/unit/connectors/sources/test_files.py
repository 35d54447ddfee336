"""File sources: typed conversion, nulls, positions, resumption, and errors naming file, line, column."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from egress.connectors.sources import CsvSource, JsonlSource
from egress.connectors.sources.files import CsvSourceParameters, FileSourceParameters
from egress.errors import SourceChangedError, SourceDataError
from egress.spec import StreamSpec

STREAM = StreamSpec.model_validate({"schema": [
    {"name": "origin", "type": "string", "required": True},
    {"name": "dep_time", "type": "int64"},
    {"name": "distance", "type": "double"},
    {"name": "cancelled", "type": "boolean"},
    {"name": "tailnum", "type": "string"},
    {"name": "time_hour", "type": "string"},
], "group_by": ["origin"]})

CSV = """origin,dep_time,distance,cancelled,tailnum,time_hour,extra
EWR,517,1400,false,N14228,2013-01-01T10:00:00Z,ignored
JFK,NA,1089.5,true,,2013-01-01 11:00:00,x
LGA,,17,1,NA,,y
"""


def csv_source(tmp_path: Path, text: str, name: str = "f.csv", **parameters: object) -> CsvSource:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    params = CsvSourceParameters.model_validate({"path": name, **parameters})
    return CsvSource.create("s", params, STREAM, tmp_path)


def test_csv_rows_are_converted_to_the_schema_with_na_and_empty_as_null(tmp_path: Path) -> None:
    records = list(csv_source(tmp_path, CSV).records(0))
    assert [r.position for r in records] == [0, 1, 2]
    assert records[0].row == {"origin": "EWR", "dep_time": 517, "distance": 1400.0, "cancelled": False,
                              "tailnum": "N14228", "time_hour": "2013-01-01T10:00:00Z"}
    assert records[1].row["dep_time"] is None
    assert records[1].row["tailnum"] is None
    assert records[2].row == {"origin": "LGA", "dep_time": None, "distance": 17.0, "cancelled": True,
                              "tailnum": None, "time_hour": None}


def test_event_timestamps_come_from_the_configured_column(tmp_path: Path) -> None:
    records = list(csv_source(tmp_path, CSV, timestamp_column="time_hour").records(0))
    assert records[0].event_timestamp == 1357034400.0  # 2013-01-01T10:00:00Z
    assert records[1].event_timestamp == 1357038000.0  # a naive time is UTC
    assert records[2].event_timestamp is None


def test_gzip_files_read_the_same(tmp_path: Path) -> None:
    plain = [r.row for r in csv_source(tmp_path, CSV).records(0)]
    assert [r.row for r in csv_source(tmp_path, CSV, name="f.csv.gz").records(0)] == plain


def test_reading_resumes_at_a_position(tmp_path: Path) -> None:
    records = list(csv_source(tmp_path, CSV).records(2))
    assert [(r.position, r.row["origin"]) for r in records] == [(2, "LGA")]


def test_a_bad_value_names_file_line_and_column(tmp_path: Path) -> None:
    bad = CSV + "EWR,5x7,1,true,N1,2013-01-01T10:00:00Z,z\n"
    with pytest.raises(SourceDataError) as raised:
        list(csv_source(tmp_path, bad).records(0))
    assert str(raised.value) == f"{tmp_path / 'f.csv'}:5: column dep_time: cannot parse '5x7' as int64 " \
        "(invalid literal for int() with base 10: '5x7')"


def test_null_in_a_required_column_is_an_error_but_a_required_string_keeps_its_text(tmp_path: Path) -> None:
    stream = StreamSpec.model_validate({"schema": [{"name": "code", "type": "string", "required": True},
                                                   {"name": "year", "type": "int64", "required": True}]})
    (tmp_path / "r.csv").write_text("code,year\nNA,2013\nEWR,NA\n")
    source = CsvSource.create("s", CsvSourceParameters(path="r.csv"), stream, tmp_path)
    records = source.records(0)
    assert next(records).row == {"code": "NA", "year": 2013}
    with pytest.raises(SourceDataError, match=r"r\.csv:3: column year: 'NA' \(null\) in a required column"):
        next(records)


def test_a_header_without_a_schema_column_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceDataError, match=r"f\.csv:1: the header lacks schema column\(s\) time_hour"):
        list(csv_source(tmp_path, "origin,dep_time,distance,cancelled,tailnum\n").records(0))


def test_a_bad_timestamp_names_its_column(tmp_path: Path) -> None:
    text = "origin,dep_time,distance,cancelled,tailnum,time_hour\nEWR,1,1,true,a,yesterday\n"
    with pytest.raises(SourceDataError, match=r"f\.csv:2: column time_hour: cannot parse 'yesterday'"):
        list(csv_source(tmp_path, text, timestamp_column="time_hour").records(0))


def jsonl_source(tmp_path: Path, text: str) -> JsonlSource:
    (tmp_path / "f.jsonl").write_text(text)
    return JsonlSource.create("s", FileSourceParameters(path="f.jsonl"), STREAM, tmp_path)


def test_jsonl_checks_types_and_treats_missing_keys_as_null(tmp_path: Path) -> None:
    text = '{"origin": "EWR", "dep_time": 517, "distance": 1400, "cancelled": false}\n\n{"origin": "JFK"}\n'
    records = list(jsonl_source(tmp_path, text).records(0))
    assert records[0].row["distance"] == 1400.0
    assert records[1].position == 1
    assert records[1].row["dep_time"] is None
    assert [r.position for r in jsonl_source(tmp_path, text).records(1)] == [1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"origin": "EWR", "dep_time": "517"}', "column dep_time: expected int64, got str '517'"),
        ('{"origin": "EWR", "cancelled": 1}', "column cancelled: expected boolean, got int 1"),
        ('{"origin": "EWR", "dep_time": 9223372036854775808}', "column dep_time: out of the int64 range"),
        ('{"origin": "EWR", "dep_time": true}', "column dep_time: expected int64, got bool True"),
        ('{"origin": "EWR", "distance": false}', "column distance: expected double, got bool False"),
        ('{"origin": null}', "column origin: null in a required column"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("{not json", "not valid JSON"),
    ],
)
def test_jsonl_errors_name_file_line_and_column(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(SourceDataError) as raised:
        list(jsonl_source(tmp_path, '{"origin": "LGA"}\n' + line + "\n").records(0))
    assert str(raised.value).startswith(f"{tmp_path / 'f.jsonl'}:2: ")
    assert message in str(raised.value)


@pytest.mark.parametrize(("content", "reason"), [
    (gzip.compress(CSV.encode())[:-20], "EOFError"),  # truncated
    (b"not gzip at all", "BadGzipFile"),
])
def test_an_unreadable_gzip_file_is_named(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "f.csv.gz").write_bytes(content)
    source = CsvSource.create("s", CsvSourceParameters(path="f.csv.gz"), STREAM, tmp_path)
    with pytest.raises(SourceDataError) as raised:
        list(source.records(0))
    assert str(raised.value).startswith(f"{tmp_path / 'f.csv.gz'}: cannot be read as a gzip file ({reason}")


def test_validation_checks_the_csv_header(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("origin,dep_time\nEWR,1\n")
    errors = CsvSource.check(CsvSourceParameters(path="f.csv"), STREAM, tmp_path)
    assert [e.path for e in errors] == ["parameters/path"]
    assert "lacks schema column(s) distance, cancelled, tailnum, time_hour" in errors[0].message


def test_a_gzip_file_replaced_by_another_is_refused_and_an_identical_one_resumes(tmp_path: Path) -> None:
    first = csv_source(tmp_path, CSV, name="f.csv.gz")
    assert len(list(first.records(0))) == 3
    committed = first.source_state
    same = csv_source(tmp_path, CSV + "EWR,1,2,false,N1,,z\n", name="f.csv.gz")  # rewritten: other compressed bytes
    same.resume(committed)
    with pytest.raises(SourceChangedError, match=r"f\.csv\.gz: source 's' already read 2 record"):
        list(same.records(2))


def test_a_state_directory_without_a_committed_identity_resumes_by_position(tmp_path: Path) -> None:
    source = csv_source(tmp_path, CSV)
    source.resume(b"")  # written before identities were committed: the position is trusted
    assert [r.position for r in source.records(2)] == [2]
    assert source.source_state  # and the identity is committed from now on


def test_an_appended_file_keeps_its_identity(tmp_path: Path) -> None:
    source = csv_source(tmp_path, CSV)
    assert len(list(source.records(0))) == 3
    committed = source.source_state
    with open(tmp_path / "f.csv", "a") as file:
        file.write("EWR,1,2,false,N1,,z\n")
    again = CsvSource.create("s", CsvSourceParameters.model_validate({"path": "f.csv"}), STREAM, tmp_path)
    again.resume(committed)
    assert [r.position for r in again.records(3)] == [3]


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])
def test_a_file_sources_unread_records_are_estimated_and_0_only_at_its_end(tmp_path: Path, name: str) -> None:
    import hashlib

    import orjson

    data = b"".join(orjson.dumps({"id": i, "payload": hashlib.sha256(b"%d" % i).hexdigest()}) + b"\n"
                    for i in range(100_000, 130_000))
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    stream = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"},
                                                   {"name": "payload", "type": "string"}]})
    source = JsonlSource(path, FileSourceParameters(path=name), stream)
    assert source.unread_records() is None  # not open yet: unknown
    records = source.records(0)
    for _ in range(5000):
        next(records)
    unread = source.unread_records()
    assert unread is not None
    assert 0.5 * 25_000 < unread <= 25_000  # an estimate: the file's read-ahead counts as read
    left = sum(1 for _ in records)
    assert left == 25_000
    assert source.unread_records() == 0
