"""Conversion of raw values to a stream schema's types (string, int64, double, boolean)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from operator import itemgetter
from typing import Any, cast

import orjson

from egress.errors import SourceDataError
from egress.spec import Column, StreamSpec

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _to_int64(text: str) -> int:
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("out of the int64 range")
    return value


def _to_double(text: str) -> float:
    return float(text)


def _to_boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected true/false")


TEXT_PARSERS: dict[str, Callable[[str], Any]] = {
    "string": str,
    "int64": _to_int64,
    "double": _to_double,
    "boolean": _to_boolean,
}


def check_json_value(column: Column, value: Any) -> Any:
    """Check a JSON-decoded ``value`` against ``column``; returns it (ints widened for doubles).

    Raises ``ValueError`` describing the mismatch.
    """
    if value is None:
        if column.required:
            raise ValueError("null in a required column")
        return None
    kind = column.type
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "int64" and isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError("out of the int64 range")
        return value
    if kind == "double" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"expected {kind}, got {type(value).__name__} {value!r}")


def parse_timestamp(value: Any) -> float:
    """Seconds since the Unix epoch from a number (seconds) or an ISO 8601 string
    (``2013-01-01T10:00:00Z``; a naive time is taken as UTC). Raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"not a timestamp: {value!r}")
        return float(value)
    if isinstance(value, str):
        moment = datetime.fromisoformat(value.strip())
        if moment.tzinfo is None:
            from datetime import UTC

            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    raise ValueError(f"not a timestamp: {value!r}")


def data_error(file: str, line: int, column: str | None, problem: str) -> SourceDataError:
    """The one error shape of bad records: ``FILE:LINE: column NAME: PROBLEM``."""
    return record_error(f"{file}:{line}", column, problem)


def record_error(where: str, column: str | None, problem: str) -> SourceDataError:
    """``WHERE: column NAME: PROBLEM``, ``WHERE`` naming the input and the record's place in it."""
    return SourceDataError(f"{where}: column {column}: {problem}" if column else f"{where}: {problem}")


_EXACT_JSON_TYPES: dict[str, type] = {"string": str, "int64": int, "double": float, "boolean": bool}


def json_row(raw: bytes | str, columns: list[Column], where: str) -> dict[str, Any]:
    """The row of the JSON object ``raw`` (keys not in ``columns`` ignored, a missing key is null);
    raises ``SourceDataError`` at ``where`` for bad JSON, a non-object or a value of the wrong type."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise record_error(where, None, f"not valid JSON ({error})") from None
    return document_row(document, columns, where)


def document_row(document: Any, columns: list[Column], where: str) -> dict[str, Any]:
    """The row of the decoded JSON ``document`` (:func:`json_row` after decoding); raises ``SourceDataError``."""
    if not isinstance(document, dict):
        raise record_error(where, None, f"expected a JSON object, got {type(document).__name__}")
    row: dict[str, Any] = {}
    for column in columns:
        value: Any = document.get(column.name)
        # A value of its column's exact JSON type needs no conversion (an int64 only its range checked).
        exact = type(value) is _EXACT_JSON_TYPES[column.type]
        if exact and (type(value) is not int or INT64_MIN <= value <= INT64_MAX):
            row[column.name] = value
            continue
        try:
            row[column.name] = check_json_value(column, value)
        except ValueError as error:
            raise record_error(where, column.name, str(error)) from None
    return row


class JsonRows:
    """The row check of one schema's ``columns``, set up once: :meth:`rows` checks a chunk's
    documents together, a column at a time, and :meth:`row` one document without
    :func:`document_row`'s per-column loop, for the documents that need no conversion (the usual ones)."""

    _MAX_SHAPES = 4096  # distinct value-type tuples remembered (2 ** nullable columns at most)

    def __init__(self, columns: list[Column]) -> None:
        self.columns = columns
        self._names = tuple(column.name for column in columns)
        self._int64_names = tuple(column.name for column in columns if column.type == "int64")
        self._plain_shapes: dict[tuple[type, ...], bool] = {}
        # Per column: its values' getter, the types a value may have to go into a row unconverted, int64 or not.
        self._column_checks = [
            (itemgetter(column.name),
             frozenset({_EXACT_JSON_TYPES[column.type]} | (set() if column.required else {type(None)})),
             column.type == "int64")
            for column in columns]

    def rows(self, documents: list[Any]) -> list[dict[str, Any]] | None:
        """The rows of the decoded JSON ``documents``, ``None`` unless :meth:`row` gives one for
        each. Documents that all hold exactly the schema's keys in its order, each value of its
        column's exact JSON type or a null it may hold, are their own rows, checked a column at a
        time over all of them; the others one at a time."""
        if self._plain_documents(documents):
            return documents
        rows = list(map(self.row, documents))
        return None if None in rows else cast(list[dict[str, Any]], rows)

    def _plain_documents(self, documents: list[Any]) -> bool:
        if set(map(type, documents)) != {dict} or set(map(tuple, documents)) != {self._names}:
            return False
        for value_of, allowed, int64 in self._column_checks:
            values = list(map(value_of, documents))
            kinds = set(map(type, values))
            if not kinds <= allowed:
                return False
            numbers = [value for value in values if value is not None] if type(None) in kinds else values
            if int64 and numbers and not (min(numbers) >= INT64_MIN and max(numbers) <= INT64_MAX):
                return False
        return True

    def row(self, document: Any) -> dict[str, Any] | None:
        """The row of the decoded JSON ``document`` when every schema column's value is of its exact
        JSON type or a null it may hold (an int64 in range), else ``None``: then :func:`document_row`
        converts it or names what is wrong. A document holding exactly the schema's keys, in its
        order, is its own row (no copy)."""
        if type(document) is not dict:
            return None
        names = self._names
        row = document if tuple(document) == names else {name: document.get(name) for name in names}
        shape = tuple(map(type, row.values()))
        plain = self._plain_shapes.get(shape)
        if plain is None:
            plain = self._is_plain(shape)
            if len(self._plain_shapes) < self._MAX_SHAPES:
                self._plain_shapes[shape] = plain
        if not plain:
            return None
        for name in self._int64_names:
            value = row[name]
            if value is not None and not INT64_MIN <= value <= INT64_MAX:
                return None
        return row

    def _is_plain(self, shape: tuple[type, ...]) -> bool:
        """Whether values of the types ``shape`` (in column order) go into a row unconverted."""
        return all(kind in allowed for kind, (_, allowed, _) in zip(shape, self._column_checks, strict=True))


def timestamp_of(
    row: dict[str, Any], stream: StreamSpec, column: str | None, file: str, line: int
) -> float | None:
    if column is None:
        return None
    value = row.get(column)
    if value is None:
        return None
    try:
        return parse_timestamp(value)
    except ValueError as error:
        raise data_error(file, line, column, f"cannot parse {value!r} as a timestamp ({error})") from None


CsvPlan = list[tuple[str, int, Callable[[str], Any], bool, str]]
"""Per schema column: ``(name, field index, parser, required, type)``."""


def csv_plan(stream: StreamSpec, header: list[str], file: str) -> CsvPlan:
    """How to convert the records under ``header`` into ``stream``'s rows; raises
    ``SourceDataError`` (line 1 of ``file``) when the header lacks a schema column."""
    index = {name: i for i, name in enumerate(header)}
    missing = [c.name for c in stream.columns if c.name not in index]
    if missing:
        raise data_error(file, 1, None, f"the header lacks schema column(s) {', '.join(missing)}")
    return [(c.name, index[c.name], TEXT_PARSERS[c.type], c.required, c.type) for c in stream.columns]


def csv_row(fields: list[str], plan: CsvPlan, nulls: frozenset[str], file: str, line: int) -> dict[str, Any]:
    """The typed row of one CSV record (``nulls``: the texts read as null); raises ``SourceDataError``."""
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
    return row
