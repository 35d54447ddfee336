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


def committed_chunks(chunks: list[OutboxChunk], last_seq: int) -> list[OutboxChunk]:
    """The outbox chunks of a consumer partition (in stream-sequence order) that its checkpoint,
    whose highest outbox seq is ``last_seq``, committed, in that order. A commit of one outbox chunk
    stores it (fenced) before its checkpoint, so a commit that failed in between leaves an orphan:
    a chunk from ``last_seq + 1`` on, which the next commit's chunk from that seq replaces (one
    message per subject). Dropped: a chunk from beyond ``last_seq``, and one whose seqs meet those of
    a chunk stored after it (an orphan replaced, brought back by a SIGKILL of the server before it
    recorded the replacement: committed chunks never share a seq, and each is stored after every
    orphan of its seqs)."""
    kept: list[OutboxChunk] = []
    floor = last_seq + 1
    for chunk in reversed(chunks):
        if chunk.last < floor:
            kept.append(chunk)
            floor = chunk.first
    kept.reverse()
    return kept


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
