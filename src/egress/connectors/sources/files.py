"""File sources: ``csv`` and ``jsonl``, plain or gzip-compressed (by the ``.gz`` extension).

Each record becomes a row of the output stream's schema; its position is its 0-based record
number (the CSV header is not a record), which makes message ids stable across restarts.
A bad value stops the source with an error naming the file, the line and the column.

The file's identity (inode and a fingerprint of its first bytes, ``identity.FileIdentity``) is
committed with the position as the source state; a restart that finds another file at the path,
or the same file with fewer records than were read, raises ``SourceChangedError`` before reading
anything instead of resuming by record number.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import itertools
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

import orjson
from pydantic import ConfigDict, Field

from egress.connectors.base import READERS_LIMIT, SOURCES, SourceRecord
from egress.connectors.sources.bad_records import (
    BadRecordParameters,
    BadRecords,
    WithBadRecords,
    check_bad_record_parameters,
)
from egress.connectors.sources.chunks import RecordChunk
from egress.connectors.sources.follow import FollowedFiles, has_magic
from egress.connectors.sources.identity import FileIdentity, changed_error, check_record_count
from egress.connectors.sources.schema import (
    JsonRows,
    csv_plan,
    csv_row,
    document_row,
    json_row,
    parse_timestamp,
    timestamp_of,
)
from egress.connectors.sources.unread import estimate
from egress.errors import SourceDataError, SpecError
from egress.line_chunks import nth_line_end
from egress.spec import StreamSpec


class FileSourceParameters(BadRecordParameters):
    """``path`` (relative paths are relative to the Spec file's folder), the optional
    ``timestamp_column`` giving each message's event time, and ``follow``: tail the file (or every
    file of a glob ``path``) as it grows and follow its rotation (``egress.connectors.sources.follow``);
    ``on_bad_record`` and ``dead_letter_path`` (``egress.connectors.sources.bad_records``);
    ``readers`` (1 to 1024; above 1 only with ``follow: true`` and a glob ``path``): how many readers
    share the files, reader 0 dealing each to the reader with the fewest (``shares``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    timestamp_column: str | None = None
    follow: bool = False
    readers: int = Field(default=1, ge=1, le=READERS_LIMIT)


class CsvSourceParameters(FileSourceParameters):
    """Adds ``delimiter`` (one character) and ``null_values``: texts read as null in nullable
    columns (default ``NA`` and the empty string, as R and nycflights13 write them)."""

    delimiter: str = Field(default=",", min_length=1, max_length=1)
    null_values: list[str] = Field(default_factory=lambda: ["NA", ""])


def unreadable(path: Path, error: BaseException) -> SourceDataError:
    """The error for a file that cannot be read as text (as opposed to a bad value in it)."""
    if isinstance(error, csv.Error):  # e.g. a field over the csv module's limit of 131,072 characters
        return SourceDataError(f"{path}: cannot be read as CSV ({error}): fix the file or split the field")
    kind = "a gzip file" if path.suffix == ".gz" else "a UTF-8 text file"
    return SourceDataError(f"{path}: cannot be read as {kind} ({type(error).__name__}: {error})")


TEXT_ENCODING = "utf-8-sig"
"""UTF-8, a leading byte order mark dropped (spreadsheet exports write one: it would otherwise join the
first header name, or make the first JSON line invalid)."""


def open_text(path: Path) -> IO[str]:
    """Open ``path`` for reading text, decompressing ``.gz`` files."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding=TEXT_ENCODING, newline="")
    return open(path, encoding=TEXT_ENCODING, newline="")


def csv_text(fields: list[str], delimiter: str) -> str:
    """One CSV record as text again (for a dead letter)."""
    text = io.StringIO()
    csv.writer(text, delimiter=delimiter, lineterminator="").writerow(fields)
    return text.getvalue()


def check_followed(path: Path) -> list[SpecError]:
    """A followed ``path`` (or glob) may name no file yet, but its folder must exist and it must not
    be compressed (a ``.gz`` file cannot be read while it is written)."""
    errors = []
    if path.suffix == ".gz":
        errors.append(SpecError("follow: true cannot tail a compressed (.gz) file: follow the plain file",
                                path="parameters/follow"))
    if not path.parent.is_dir():
        errors.append(SpecError(f"folder not found: {path.parent} (relative paths start at the Spec's folder)",
                                path="parameters/path"))
    return errors


def wrap_text(binary: IO[bytes], path: Path) -> IO[str]:
    """Text over the open ``binary`` file of ``path``, decompressing a ``.gz`` one."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=binary, mode="rb"), encoding=TEXT_ENCODING, newline="")
    return io.TextIOWrapper(binary, encoding=TEXT_ENCODING, newline="")


_Read = TypeVar("_Read")


class _FileSource(WithBadRecords):
    parameters_model: ClassVar[type[FileSourceParameters]] = FileSourceParameters

    def __init__(self, path: Path, parameters: Any, stream: StreamSpec, source_id: str = "",
                 bad_records: BadRecords | None = None) -> None:
        self.path = path
        self.parameters = parameters
        self.stream = stream
        self.source_id = source_id
        self.bad_records = bad_records or BadRecords(source_id, parameters, path.parent)
        self._committed: FileIdentity | None = None
        self._identity: FileIdentity | None = None
        self._raw: Any = None  # the open file (its FileIO), for unread_records
        self._size = 0
        self._passed = 0  # records (and bad records) of the file read so far, those before the start included
        self._ended = False

    def unread_records(self) -> int | None:
        """An estimate (``egress.connectors.sources.unread``): the file's bytes after the offset read
        so far times the records per byte so far; ``None`` before the file is open and a record read,
        at least 1 until and 0 once read to its end. The offset is the file's (compressed for ``.gz``),
        read-ahead included: the figure is 1 while the last buffer read is parsed."""
        if self._ended:
            return 0
        raw = self._raw
        if raw is None:
            return None
        try:
            offset = raw.tell()
        except (OSError, ValueError):  # closed meanwhile: read to its end, or failed
            return 0 if self._ended else None
        # at least 1 until the end: the last read-ahead (a buffer of the file) still holds records
        return max(1, estimate(self._size - offset, self._passed, offset) or 0) if self._passed else None
    def resume(self, source_state: bytes) -> None:
        """The committed identity of the file (``b""``: none, a new source or a state directory
        written before identities were committed, whose position is then trusted)."""
        self._committed = FileIdentity.decode(source_state) if source_state else None

    @property
    def source_state(self) -> bytes:
        """The identity of the file being read, once ``records`` opened it (``b""`` before)."""
        return b"" if self._identity is None else self._identity.encode()

    @contextlib.contextmanager
    def _open(self, start_position: int) -> Iterator[IO[str]]:
        """The file as text, after checking it is the one the committed position was read from."""
        with self._open_binary(start_position) as binary, \
                io.TextIOWrapper(binary, encoding=TEXT_ENCODING, newline="") as text:
            yield text

    @contextlib.contextmanager
    def _open_binary(self, start_position: int) -> Iterator[IO[bytes]]:
        """The file's bytes (decompressed for ``.gz``), after the check of :meth:`_open`."""
        with open(self.path, "rb") as binary:
            descriptor = binary.fileno()
            if self._committed is not None and start_position > 0:
                how = self._committed.change(descriptor)
                if how is not None:
                    raise changed_error(str(self.path), self.source_id, start_position, how)
            self._identity = FileIdentity.of(descriptor)
            self._size, self._raw = os.fstat(descriptor).st_size, binary.raw
            if self.path.suffix == ".gz":
                with gzip.GzipFile(fileobj=binary, mode="rb") as unpacked:
                    yield unpacked  # type: ignore[misc]
            else:
                yield binary

    kind: ClassVar[str] = ""

    @classmethod
    def reader_count(cls, parameters: Any) -> int:
        """``readers`` (``egress.connectors.base.reader_count``)."""
        return int(parameters.readers)

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        errors = check_bad_record_parameters(parameters, base_dir)
        path = base_dir / parameters.path
        if parameters.readers > 1 and not (parameters.follow and has_magic(parameters.path)):
            errors.append(SpecError(f"readers: {parameters.readers} shares the files of a glob among readers: it "
                                    "needs follow: true and a glob path (e.g. logs/*.jsonl), or readers: 1",
                                    path="parameters/readers"))
        if parameters.follow:
            errors += check_followed(path)
        elif not path.is_file():
            errors.append(SpecError(f"file not found: {path} (relative paths start at the Spec's folder)",
                                    path="parameters/path"))
        column = parameters.timestamp_column
        if column is not None and stream.column(column) is None:
            errors.append(SpecError(f'column "{column}" is not in the output stream schema',
                                    path="parameters/timestamp_column"))
        return errors

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> Any:
        bad_records = BadRecords(source_id, parameters, base_dir)
        if parameters.follow:
            return FollowedFiles(cls.kind, base_dir / parameters.path, parameters, stream, source_id, bad_records)
        return cls(base_dir / parameters.path, parameters, stream, source_id, bad_records)

    def records(self, start_position: int) -> Iterator[SourceRecord]:
        """Records from ``start_position`` on; raises ``SourceDataError`` naming the file for a bad
        record, and for a file that cannot be read (a truncated or fake ``.gz``, bad UTF-8);
        ``SourceChangedError`` for a file that is not the one the committed position was read from."""
        return self._reading(self._records(start_position))

    def _reading(self, items: Iterator[_Read]) -> Iterator[_Read]:
        """``items`` read from the file, its end noted, a failure to read it raised as ``unreadable``."""
        try:
            yield from items
            self._ended = True
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as error:
            raise unreadable(self.path, error) from None

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        raise NotImplementedError


@SOURCES.register("csv")
class CsvSource(_FileSource):
    """CSV with a header row; columns not in the schema are ignored."""

    parameters_model: ClassVar[type[FileSourceParameters]] = CsvSourceParameters
    kind: ClassVar[str] = "csv"

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        """Adds the header check, so ``egress validate`` catches a file without a schema column."""
        errors = super().check(parameters, stream, base_dir)
        path = base_dir / parameters.path
        if errors or parameters.follow or not path.is_file():
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
        with self._open(start_position) as text:
            reader = csv.reader(text, delimiter=self.parameters.delimiter)
            header = next(reader, None)
            if header is None:
                check_record_count(file, self.source_id, start_position, 0)
                return
            plan = csv_plan(self.stream, header, file)
            count = 0
            for position, fields in enumerate(reader):
                count = self._passed = position + 1
                if position < start_position:
                    continue
                line = reader.line_num
                try:
                    row = csv_row(fields, plan, nulls, file, line)
                    timestamp = timestamp_of(row, self.stream, timestamp_column, file, line)
                except SourceDataError as error:
                    self.bad_records.handle(error, file, position, csv_text(fields, self.parameters.delimiter))
                    continue
                yield SourceRecord(position, row, timestamp)
            check_record_count(file, self.source_id, start_position, count)


@SOURCES.register("jsonl")
class JsonlSource(_FileSource):
    """One JSON object per line; keys not in the schema are ignored, a missing key is null."""

    kind: ClassVar[str] = "jsonl"

    def record_chunks(self, start_position: int, count: int) -> Iterator[RecordChunk]:
        """``records(start_position)`` in chunks of up to ``count`` records
        (``egress.connectors.sources.chunks.ChunkedSource``): the lines of a chunk are decoded and
        checked together, and one at a time only when one of them is blank, bad or needs converting."""
        return self._reading(self._chunks(start_position, count))

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        for chunk in self._chunks(start_position, 1):
            yield from chunk.records()

    def _chunks(self, start_position: int, count: int) -> Iterator[RecordChunk]:
        file = str(self.path)
        rows = JsonRows(self.stream.columns)
        with self._open(start_position) as text:
            line = position = 0  # lines and records read so far
            if start_position > 0:
                for raw in text:
                    line += 1
                    if not raw.isspace():  # a blank line is no record
                        position = self._passed = position + 1
                        if position == start_position:
                            break
            while True:
                chunk = RecordChunk()
                try:
                    # Only as many lines as the chunk lacks records: it ends just after its last record.
                    while len(chunk.rows) < count and (block := list(itertools.islice(text, count - len(chunk.rows)))):
                        position = self._passed = self._convert(block, line + 1, position, rows, chunk)
                        line += len(block)
                except SourceDataError:  # as one record at a time: the records before it first
                    if chunk.rows:
                        yield chunk
                    raise
                if not chunk.rows:
                    break
                yield chunk
            check_record_count(file, self.source_id, start_position, position)

    def _convert(self, block: list[str], first_line: int, position: int, rows: JsonRows, chunk: RecordChunk) -> int:
        """Add the records of the lines ``block`` (the first one line ``first_line``, its first record
        at ``position``) to ``chunk``; returns the position after them."""
        try:
            documents: list[Any] | None = list(map(orjson.loads, block))
        except orjson.JSONDecodeError:  # a blank or bad line: its error is raised below, in its order
            documents = None
        converted = None if documents is None else rows.rows(documents)
        timestamps = None if converted is None else self._timestamps(converted)
        if converted is not None and timestamps is not None:
            chunk.positions.extend(range(position, position + len(converted)))
            chunk.rows.extend(converted)
            chunk.event_timestamps.extend(timestamps)
            return position + len(converted)
        file, column = str(self.path), self.parameters.timestamp_column
        for offset, raw in enumerate(block):
            if raw.isspace():
                continue
            line = first_line + offset
            try:
                if documents is None:
                    row = json_row(raw, rows.columns, f"{file}:{line}")
                else:
                    row = rows.row(documents[offset]) or document_row(documents[offset], rows.columns, f"{file}:{line}")
                timestamp = timestamp_of(row, self.stream, column, file, line)
            except SourceDataError as error:
                self.bad_records.handle(error, file, position, raw)
            else:
                chunk.append(position, row, timestamp)
            position += 1
        return position

    def _timestamps(self, rows: list[dict[str, Any]]) -> list[float | None] | None:
        """The event timestamps of ``rows`` (all ``None`` without a timestamp column); ``None`` when
        one cannot be parsed (its error is raised one record at a time)."""
        column = self.parameters.timestamp_column
        if column is None:
            return [None] * len(rows)
        try:
            return [None if row[column] is None else parse_timestamp(row[column]) for row in rows]
        except ValueError:
            return None


LINE_CHUNK_BYTES = 1024 * 1024
"""How many bytes of a file the ``lines`` source reads at a time: a chunk is that, cut after its last newline."""
BYTE_ORDER_MARK = b"\xef\xbb\xbf"


@SOURCES.register("lines")
class LinesSource(_FileSource):
    """Each non-empty line of a text file (UTF-8, or ``.gz``) is one record: the row ``{column:
    line}`` (without its newline) of an output stream with exactly one column, of type ``string``.
    An empty line is no record (as a blank line of ``jsonl``); a last line without a newline is one.
    Read a chunk of lines at a time as bytes (``egress.connectors.sources.chunks.LineChunkSource``),
    which the byte-chunk path carries to the sink unchanged (``docs/architecture.md``)."""

    kind: ClassVar[str] = "lines"

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        """Adds: one ``string`` column, no ``timestamp_column``, no ``follow``."""
        errors = [error for error in super().check(parameters, stream, base_dir)
                  if error.path != "parameters/timestamp_column"]
        if len(stream.columns) != 1 or stream.columns[0].type != "string":
            errors.append(SpecError("the lines source writes each line to the one column of its output stream: give "
                                    "that stream exactly one column, of type string", path="output_stream_id"))
        if parameters.timestamp_column is not None:
            errors.append(SpecError("the lines source has no timestamp column: remove timestamp_column",
                                    path="parameters/timestamp_column"))
        if parameters.follow:
            errors.append(SpecError("the lines source reads a whole file: remove follow: true, or use jsonl",
                                    path="parameters/follow"))
        return errors

    @property
    def line_column(self) -> str:
        """The output stream's column that holds each line."""
        return self.stream.columns[0].name

    def line_chunks(self, start_position: int, chunk_bytes: int = LINE_CHUNK_BYTES) -> Iterator[tuple[bytes, int, int]]:
        """The records from ``start_position`` on, about ``chunk_bytes`` at a time: ``(data, position of
        the first record, records)``, ``data`` each record followed by ``\\n``. Raises what
        :meth:`records` raises (a file that is not UTF-8, or not the committed one)."""
        return self._reading(self._line_chunks(start_position, chunk_bytes))

    def _records(self, start_position: int) -> Iterator[SourceRecord]:
        column = self.line_column
        for data, first, _ in self._line_chunks(start_position, LINE_CHUNK_BYTES):
            for position, line in enumerate(data.decode().split("\n")[:-1], first):
                yield SourceRecord(position, {column: line}, None)

    def _line_chunks(self, start_position: int, chunk_bytes: int) -> Iterator[tuple[bytes, int, int]]:
        with self._open_binary(start_position) as binary:
            position, carry, ended, first = 0, b"", False, True
            while not ended:
                block = binary.read(chunk_bytes)
                if first and block.startswith(BYTE_ORDER_MARK):
                    block = block[len(BYTE_ORDER_MARK):]
                first = False
                data = carry + block
                if not block:  # the end: a last line without its newline is a record too
                    ended = True
                    data += b"\n" if data and not data.endswith(b"\n") else b""
                cut = data.rfind(b"\n") + 1
                data, carry = data[:cut], data[cut:]
                if not data:
                    continue  # no newline yet: a line longer than a read
                if not data.isascii():
                    data.decode()  # all of it UTF-8, checked in C (UnicodeDecodeError: unreadable)
                # One pass in C gives both the records and whether an empty line is among them.
                lines = data.split(b"\n")
                lines.pop()  # after the last newline
                count = len(lines)
                if b"" in lines:  # empty lines are no records
                    data = b"".join(line + b"\n" for line in lines if line)
                    count = data.count(b"\n")
                if count and position + count > start_position:
                    if position < start_position:
                        data = data[nth_line_end(data, 0, start_position - position):]
                        count -= start_position - position
                        position = start_position
                    self._passed = position + count
                    yield data, position, count
                position += count
            self._passed = position
            check_record_count(str(self.path), self.source_id, start_position, position)
