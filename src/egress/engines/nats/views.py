"""What a NATS engine knows of a consumer partition it commits (its checkpoint, outbox chunks and
pending redo), and the latest keyed record of each subject."""

from __future__ import annotations

from dataclasses import dataclass

from egress.engines.nats import records
from egress.engines.nats.jetstream import Stored, is_deleted
from egress.engines.nats.records import CheckpointRecord
from egress.engines.nats.subjects import Layout


@dataclass(slots=True)
class OutboxChunk:
    first: int
    last: int
    seq: int


@dataclass(slots=True)
class Redo:
    """Keyed writes committed as redo chunks and not yet applied: ``(subject, record, deleted)``."""

    writes: list[tuple[str, bytes, bool]]
    last_seq: int


@dataclass(slots=True)
class View:
    """What this process knows of a consumer partition it commits: the committed checkpoint, the
    outbox chunks still stored, and keyed writes waiting to be applied."""

    checkpoint: CheckpointRecord
    outbox: list[OutboxChunk]
    redo: Redo | None


def latest_records(layout: Layout, stored: list[Stored], redos: list[Stored], prefixes: tuple[str, ...]
                   ) -> dict[str, tuple[int, bytes, bool]]:
    """The latest ``(sequence, record, deleted)`` of each keyed subject (without the bucket
    prefix) of ``stored`` and of the writes of the pending redo chunks ``redos`` to subjects
    starting with ``prefixes``: keyed writes of a commit not yet applied (a crash came between)
    are newer than what they replace."""
    latest = {layout.suffix(s.subject): (s.seq, s.data, is_deleted(s)) for s in stored}
    for redo in redos:
        for suffix, record, deleted in records.redo_entries(redo.data):
            if suffix.startswith(prefixes) and latest.get(suffix, (0, b"", False))[0] < redo.seq:
                latest[suffix] = (redo.seq, record, deleted)
    return latest
