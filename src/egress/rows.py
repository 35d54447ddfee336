"""The stored form of a row: MessagePack (``ormsgpack``), which keeps Flow's byte strings exact.

Flow's ``string`` is a byte string, so a row may hold ``bytes`` (any byte values, NUL and invalid
UTF-8 included) as well as ``str``. MessagePack keeps the two apart (``bin`` and ``str``), so a row
reads back with the same types and the same bytes it was written with; JSON, the encoding of
earlier versions, has no bytes at all. A stored row is a MessagePack map, whose first byte is
``0x80``-``0x8F``, ``0xDE`` or ``0xDF``; a stored row whose first byte is ``{`` (``0x7B``, a
positive fixint in MessagePack, never a map) is the JSON of a directory written before, and reads
as such (:func:`decode_row`), so old state directories open unchanged.

A value that cannot be stored (a ``str`` with lone surrogates, an integer outside the 64-bit
range, an object of another type) raises :class:`~egress.errors.RowEncodingError` from the
caller, which names where the row came from (:func:`unstorable_row_error`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import ormsgpack

from egress.errors import RowEncodingError

JSON_ROW_FIRST_BYTE = 0x7B
"""``{``: the first byte of a row stored as JSON by earlier versions (never of a MessagePack map)."""

BYTES_MARKER = "$bytes"
"""The one key of the JSON object that stands for a byte string in JSON output (:func:`bytes_as_json`)."""

encode_row: Callable[[Any], bytes] = ormsgpack.packb
"""``encode_row(row) -> bytes``: the stored form of ``row`` (a dict of column → value). Raises
``TypeError`` for a value MessagePack cannot hold; :func:`unstorable_row_error` says which."""


pack_batch: Callable[[Any], bytes] = ormsgpack.packb
"""``pack_batch(entries) -> bytes``: a batch of messages (a list of tuples of ids, keys, timestamps and
rows) as one MessagePack array of arrays, what the engine stores per commit and stream. Raises
``TypeError`` as :data:`encode_row` does; :func:`first_unstorable_row_error` says which row."""

unpack_batch: Callable[[bytes], list[list[Any]]] = ormsgpack.unpackb
"""The entries :data:`pack_batch` stored, each as a list in the order it was given."""


def decode_row(stored: bytes, _unpack: Callable[[bytes], Any] = ormsgpack.unpackb,
               _loads: Callable[[bytes], Any] = orjson.loads) -> dict[str, Any]:
    """The row ``stored`` holds: MessagePack, or the JSON of directories written before (the
    defaults bind the decoders once: this runs once per message read)."""
    if stored[0] == JSON_ROW_FIRST_BYTE:
        return _loads(stored)  # type: ignore[no-any-return]
    return _unpack(stored)  # type: ignore[no-any-return]


def unstorable_column(row: dict[str, Any]) -> tuple[str, str]:
    """The first column of ``row`` whose value :func:`encode_row` rejects, and why (``("", reason)``
    when no single column is to blame, e.g. a column name that is not a ``str``)."""
    for column, value in row.items():
        try:
            ormsgpack.packb(value)
        except TypeError as error:
            return str(column), _reason(value, error)
    try:
        ormsgpack.packb(row)
    except TypeError as error:
        return "", str(error)
    return "", "no reason found (the row encodes now)"


def _reason(value: Any, error: TypeError) -> str:
    if isinstance(value, str):
        return (f"{error}: a str must be valid Unicode text (no lone surrogates such as the "
                "'surrogateescape' error handler leaves); emit bytes for binary data")
    return f"{error} (value of type {type(value).__name__})"


def unstorable_row_error(where: str, stream: str, message_id: bytes, row: dict[str, Any]) -> RowEncodingError:
    """The error for ``row`` of message ``message_id`` (shown as its idempotency key, upper-case
    hex) emitted to ``stream`` by ``where`` (e.g. ``computation 'to_json' partition 0``)."""
    column, reason = unstorable_column(row)
    named = f"column {column!r}" if column else "a column"
    return RowEncodingError(
        f"{where} emitted message {message_id.hex().upper()} to stream {stream!r} whose {named} cannot be "
        f"stored ({reason}); nothing from this batch was committed",
        stream=stream, column=column, message_id=message_id)


def first_unstorable_row_error(where: str, rows: Iterable[tuple[str, bytes, dict[str, Any]]]) -> RowEncodingError:
    """The error for the first of ``rows`` (``(stream, message id, row)``, emitted by ``where``)
    that :func:`encode_row` rejects (:func:`unstorable_row_error`); for an engine whose batch of
    rows failed to encode, ``where`` as in :attr:`egress.engines.EpochCommit.origin`."""
    for stream, message_id, row in rows:
        try:
            encode_row(row)
        except TypeError:
            return unstorable_row_error(where, stream, message_id, row)
    return RowEncodingError(f"{where}: a row of this epoch cannot be stored, and none alone fails to encode",
                            stream="", column="", message_id=b"")


def bytes_as_json(value: Any) -> Any:
    """``orjson``'s ``default`` hook for JSON output (``egress state dump``): a ``bytes`` value
    becomes ``{"$bytes": "<base64>"}`` (standard alphabet, padded); text stays text. Raises
    ``TypeError`` for any other type orjson cannot write."""
    if isinstance(value, bytes):
        return {BYTES_MARKER: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
