"""Chunks of lines: consecutive records of a line source kept as one bytes object (issue 25).

A :class:`LineChunk` holds ``count`` records, each followed by ``\\n`` in ``data`` (a record never
contains one), so the newlines are the line offsets: a run of whole lines is found with
``bytes.rfind`` and counted with ``bytes.count``, both in C, and no offset array is built. Record
``i`` has the message id ``id_prefix ‖ (first_position + i) as u64 big-endian ‖ id_suffix``:
``egress.keys.source_message_id`` of a source partition's record numbers (``id_suffix`` empty),
or that id with ``derived_message_id``'s output index appended (an identity's output, suffix
``\\x00\\x00``). Stored as one blob (:func:`pack_chunk`) that starts with :data:`CHUNK_MARK`, a
byte MessagePack never writes, so a reader tells it from a batch of rows by its first byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from egress.keys import EMPTY_KEY

CHUNK_MARK = 0xC1
"""First byte of a stored chunk (MessagePack's one never-used byte: no row batch starts with it)."""
_CHUNK_KIND = ord("C")
_REFERENCE_KIND = ord("R")
_HEADER = struct.Struct(">BB12sQIH")  # mark, kind, id prefix, first position, count, suffix length
_REFERENCE = struct.Struct(">BBIQIH")  # mark, kind, log partition, log offset, count, suffix length


@dataclass(frozen=True, slots=True)
class LineChunk:
    """``count`` records of column ``column`` as ``data`` (each record followed by ``\\n``), their
    message ids from ``id_prefix`` (12 bytes), ``first_position`` and ``id_suffix``."""

    data: bytes
    count: int
    id_prefix: bytes
    first_position: int
    column: str
    id_suffix: bytes = b""

    def message_id(self, index: int) -> bytes:
        """The id of record ``index`` (0-based) of the chunk."""
        return self.id_prefix + (self.first_position + index).to_bytes(8, "big") + self.id_suffix

    def records(self) -> list[bytes]:
        """Every record's bytes, without its newline (one object per record: for the rare paths)."""
        return self.data.split(b"\n")[:-1]

    def rows(self) -> list[dict[str, Any]]:
        """Every record as its row ``{column: text}``."""
        column = self.column
        return [{column: line} for line in self.data.decode().split("\n")[:-1]]

    def derived(self, suffix: bytes) -> LineChunk:
        """The same records with ``suffix`` appended to every id (an identity's outputs)."""
        return LineChunk(self.data, self.count, self.id_prefix, self.first_position, self.column,
                         self.id_suffix + suffix)

    def tail(self, index: int) -> LineChunk:
        """Records ``index`` .. ``count - 1`` as a chunk of their own (``index`` < ``count``)."""
        if index == 0:
            return self
        start = nth_line_end(self.data, 0, index)
        return LineChunk(self.data[start:], self.count - index, self.id_prefix, self.first_position + index,
                         self.column, self.id_suffix)


def nth_line_end(data: bytes, start: int, lines: int) -> int:
    """The offset just after the ``lines``-th newline of ``data`` from ``start`` (``lines`` >= 1, and
    at least that many newlines there)."""
    end = start
    find = data.find
    for _ in range(lines):
        end = find(b"\n", end) + 1
    return end


def lines_fitting(data: bytes, start: int, room_bytes: int, room_records: int,
                  lines_left: int | None = None) -> tuple[int, int]:
    """The longest run of whole lines of ``data`` from offset ``start`` (a line start) that is at most
    ``room_bytes`` bytes (newlines included) and ``room_records`` lines: ``(end offset, lines)``;
    ``(start, 0)`` when not even the first line fits. ``lines_left``, when given, is the number of
    lines from ``start`` to the end (then the smaller side of a cut is the one counted)."""
    if room_bytes <= 0 or room_records <= 0:
        return start, 0
    size = len(data)
    if lines_left is not None and size - start <= room_bytes and lines_left <= room_records:
        return size, lines_left  # the rest fits whole: nothing to count
    limit = min(size, start + room_bytes)
    end = data.rfind(b"\n", start, limit) + 1
    if end <= start:
        return start, 0
    if lines_left is not None and size - end < end - start:
        lines = lines_left - data.count(b"\n", end)
    else:
        lines = data.count(b"\n", start, end)
    if lines > room_records:
        end, lines = nth_line_end(data, start, room_records), room_records
    return end, lines


def pack_chunk(chunk: LineChunk) -> bytes:
    """The stored form of ``chunk`` (a log row's blob)."""
    column = chunk.column.encode()
    return b"".join((_HEADER.pack(CHUNK_MARK, _CHUNK_KIND, chunk.id_prefix, chunk.first_position, chunk.count,
                                  len(chunk.id_suffix)), chunk.id_suffix, len(column).to_bytes(2, "big"), column,
                     chunk.data))


def is_packed(blob: bytes) -> bool:
    """Whether ``blob`` is a stored chunk or reference (else a MessagePack batch of rows)."""
    return len(blob) > 0 and blob[0] == CHUNK_MARK


def unpack_chunk(blob: bytes) -> LineChunk:
    """The chunk :func:`pack_chunk` stored; ``ValueError`` for another blob."""
    if len(blob) < _HEADER.size or blob[0] != CHUNK_MARK or blob[1] != _CHUNK_KIND:
        raise ValueError("not a stored line chunk")
    _, _, prefix, first, count, suffix_length = _HEADER.unpack_from(blob)
    at = _HEADER.size
    suffix = bytes(blob[at:at + suffix_length])
    at += suffix_length
    column_length = int.from_bytes(blob[at:at + 2], "big")
    column = bytes(blob[at + 2:at + 2 + column_length]).decode()
    return LineChunk(bytes(blob[at + 2 + column_length:]), count, bytes(prefix), first, column, suffix)


@dataclass(frozen=True, slots=True)
class ChunkReference:
    """An outbox entry that names records of the log instead of copying them: ``count`` messages
    from ``offset`` of log ``(stream, partition)``, their ids with ``id_suffix`` appended."""

    stream: str
    partition: int
    offset: int
    count: int
    id_suffix: bytes


def pack_reference(reference: ChunkReference) -> bytes:
    stream = reference.stream.encode()
    return b"".join((_REFERENCE.pack(CHUNK_MARK, _REFERENCE_KIND, reference.partition, reference.offset,
                                     reference.count, len(reference.id_suffix)), reference.id_suffix, stream))


def unpack_reference(blob: bytes) -> ChunkReference | None:
    """The reference :func:`pack_reference` stored, ``None`` for any other blob."""
    if len(blob) < _REFERENCE.size or blob[0] != CHUNK_MARK or blob[1] != _REFERENCE_KIND:
        return None
    _, _, partition, offset, count, suffix_length = _REFERENCE.unpack_from(blob)
    at = _REFERENCE.size
    return ChunkReference(bytes(blob[at + suffix_length:]).decode(), partition, offset, count,
                          bytes(blob[at:at + suffix_length]))


def chunk_entries(chunk: LineChunk, start: int = 0, end: int | None = None) -> list[list[Any]]:
    """Records ``start`` .. ``end - 1`` as row-batch entries ``[message id, key, event timestamp,
    row]`` (key ``encode_key([])``, no timestamp), as a MessagePack batch decodes."""
    rows = chunk.rows()
    stop = chunk.count if end is None else min(end, chunk.count)
    return [[chunk.message_id(i), EMPTY_KEY, None, rows[i]] for i in range(start, stop)]


__all__ = ["CHUNK_MARK", "ChunkReference", "LineChunk", "chunk_entries", "is_packed", "lines_fitting",
           "nth_line_end", "pack_chunk", "pack_reference", "unpack_chunk", "unpack_reference"]
