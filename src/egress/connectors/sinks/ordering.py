"""The order rule every sink applies to what ``distribute`` hands it (upstream: a message id not
greater than the last distributed one is an error), written once for the async HTTP sink and the
batching sinks (``batches.BatchedSink``: the Firehose and batching HTTP sinks)."""

from __future__ import annotations

from egress.engines import OutboxMessage


def fresh_messages(messages: list[OutboxMessage], persisted_seq: int, last_distributed_seq: int) -> list[OutboxMessage]:
    """The messages of ``messages`` that the sink has still to handle, in order: those at or below
    ``persisted_seq`` (the sink's acknowledged prefix: a restart re-distributes them) are skipped.
    The new last distributed ``seq`` is the last one returned.

    Raises ``ValueError`` for a ``seq`` not above ``last_distributed_seq`` or the one before it in
    ``messages`` (nothing of ``messages`` has been handled then)."""
    if not messages:
        return messages
    last = last_distributed_seq
    fresh: list[OutboxMessage] = []
    for message in messages:
        seq = message.seq
        if seq <= persisted_seq:
            continue
        if seq <= last:
            raise ValueError(f"message seq {seq} is not greater than the last distributed {last}")
        last = seq
        fresh.append(message)
    return fresh
