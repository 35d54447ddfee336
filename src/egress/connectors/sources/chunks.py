"""Records in chunks: what a source reader takes from a finite source at once.

A source that reads its input a chunk at a time (``ChunkedSource``, the ``jsonl`` file source)
converts and checks the records of a chunk together, with fewer Python-level steps per record than
one :class:`~egress.connectors.base.SourceRecord` at a time; :func:`chunks_of` gives every other
source's records the same shape. Either way a chunk holds up to ``count`` records and ends just
after its last one: a bad record after it is read with the next chunk, as one at a time. A source
that fails (a bad record under ``on_bad_record: fail``, a file that cannot be read on) first ends
its chunk with the records before the failure, and raises it when the next chunk is asked for: the
reader commits them, so the records before a failure are delivered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from egress.connectors.base import SourceRecord


@dataclass(slots=True)
class RecordChunk:
    """Consecutive records of a source's input (source partition 0), as columns: each one's
    ``position`` (record number, increasing; a dropped bad record's position is missing), typed
    ``row`` and ``event_timestamp`` (seconds since the Unix epoch, ``None`` without a timestamp
    column)."""

    positions: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    event_timestamps: list[float | None] = field(default_factory=list)

    def append(self, position: int, row: dict[str, Any], event_timestamp: float | None) -> None:
        self.positions.append(position)
        self.rows.append(row)
        self.event_timestamps.append(event_timestamp)

    def records(self) -> Iterator[SourceRecord]:
        """The chunk's records one at a time."""
        for position, row, timestamp in zip(self.positions, self.rows, self.event_timestamps, strict=True):
            yield SourceRecord(position, row, timestamp)


@runtime_checkable
class ChunkedSource(Protocol):
    """A finite source that reads and converts its records a chunk at a time."""

    def record_chunks(self, start_position: int, count: int) -> Iterator[RecordChunk]:
        """Chunks of up to ``count`` records from ``start_position`` on, each non-empty; the same
        records, positions and errors as ``records(start_position)``, at the same points."""
        ...


@runtime_checkable
class LineChunkSource(Protocol):
    """A finite source whose records are lines, read as bytes a chunk at a time (the ``lines``
    source): the byte-chunk path (``docs/architecture.md``) stores each chunk as one log row."""

    @property
    def line_column(self) -> str:
        """The output stream's one column, which holds each line."""
        ...

    def line_chunks(self, start_position: int) -> Iterator[tuple[bytes, int, int]]:
        """``(data, first record's position, records)`` from ``start_position`` on, each non-empty,
        ``data`` every record followed by ``\\n``; the same records and errors as ``records``."""
        ...


def chunks_of(records: Iterator[SourceRecord], count: int) -> Iterator[RecordChunk]:
    """``records`` (of source partition 0) in chunks of up to ``count``; each chunk takes its
    records from ``records`` only when it is asked for. When ``records`` raises, the records before
    are the last chunk, and the error is raised when the next one is asked for."""
    batch: list[SourceRecord] = []
    try:
        for record in records:
            batch.append(record)
            if len(batch) == count:
                yield _chunk(batch)
                batch = []
    except Exception:
        if batch:
            yield _chunk(batch)
        raise
    if batch:
        yield _chunk(batch)


def _chunk(batch: list[SourceRecord]) -> RecordChunk:
    return RecordChunk([record.position for record in batch], [record.row for record in batch],
                       [record.event_timestamp for record in batch])
