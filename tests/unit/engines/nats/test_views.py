"""Which outbox chunks a checkpoint committed: a commit of one outbox chunk stores the chunk
before its checkpoint, so a commit that failed in between leaves an orphan chunk that readers
must skip, and a SIGKILL of the server can bring an orphan back after the next commit replaced it."""

from __future__ import annotations

from egress.engines.nats.views import OutboxChunk, committed_chunks


def ranges(chunks: list[OutboxChunk]) -> list[tuple[int, int, int]]:
    return [(chunk.first, chunk.last, chunk.seq) for chunk in chunks]


def test_chunks_within_the_checkpoints_outbox_are_kept_in_order() -> None:
    chunks = [OutboxChunk(1, 10, 5), OutboxChunk(11, 20, 8), OutboxChunk(21, 25, 12)]
    assert ranges(committed_chunks(chunks, 25)) == [(1, 10, 5), (11, 20, 8), (21, 25, 12)]
    assert committed_chunks([], 25) == []


def test_an_orphan_past_the_checkpoints_outbox_is_skipped() -> None:
    chunks = [OutboxChunk(1, 10, 5), OutboxChunk(11, 30, 9)]  # stored, its checkpoint (last seq 10) not
    assert ranges(committed_chunks(chunks, 10)) == [(1, 10, 5)]


def test_an_orphan_brought_back_beside_the_chunks_that_replaced_it_is_skipped() -> None:
    # the orphan 11-30 (seq 9) was replaced by the committed 11-15 (seq 14), then 16-40 (seq 20)
    # was committed; a SIGKILL of the server brought the orphan back
    chunks = [OutboxChunk(1, 10, 5), OutboxChunk(11, 30, 9), OutboxChunk(11, 15, 14), OutboxChunk(16, 40, 20)]
    assert ranges(committed_chunks(chunks, 40)) == [(1, 10, 5), (11, 15, 14), (16, 40, 20)]


def test_an_orphan_brought_back_reaching_past_the_checkpoints_outbox_is_skipped() -> None:
    chunks = [OutboxChunk(11, 30, 9), OutboxChunk(11, 15, 14)]
    assert ranges(committed_chunks(chunks, 15)) == [(11, 15, 14)]

