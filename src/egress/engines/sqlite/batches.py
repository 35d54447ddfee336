"""Decoded log batches kept in memory: the tail this process committed last and the rests of batches
reads stopped inside, and the decoding of a batch into log messages."""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Iterable
from typing import Any

from egress.engines.protocols import LogMessage
from egress.line_chunks import chunk_entries, is_packed, unpack_chunk, unpack_reference
from egress.rows import unpack_batch

new_tuple = tuple.__new__


def batch_messages(stream: str, partition: int, after: int, end: int,
              batches: Iterable[tuple[int, bytes]], rests: BatchRests) -> list[LogMessage]:
    """The messages with offsets ``after`` .. ``end - 1`` of stored ``(offset, messages)`` batches
    (in offset order, the first one holding ``after`` or later). When ``end`` falls inside a batch,
    the rest of it, decoded, goes to ``rests`` (the next read from ``end`` starts with it)."""
    messages: list[LogMessage] = []
    for offset, blob in batches:
        if offset >= end:
            break
        start = max(0, after - offset)
        entries = log_entries(blob)
        messages.extend(entry_messages(stream, partition, offset + start, entries[start:end - offset]))
        if len(entries) > end - offset:
            rests.keep(stream, partition, end, entries[end - offset:])
    return messages


def log_entries(blob: bytes) -> list[list[Any]]:
    """A stored log batch's entries ``[message id, key, event timestamp, row]``: a MessagePack batch
    of rows, or a chunk of lines (``egress.line_chunks``) decoded into rows."""
    if is_packed(blob):
        return chunk_entries(unpack_chunk(blob))
    return unpack_batch(blob)


def outbox_entries(db: sqlite3.Connection, first_seq: int, blob: bytes) -> list[list[Any]]:
    """A stored outbox batch's entries ``[seq, message id, key, event timestamp, row]``: a MessagePack
    batch, or a reference to log records (``egress.line_chunks.ChunkReference``) read from the log
    (retention keeps what a reference names; a reference to records no longer there is an error)."""
    reference = unpack_reference(blob) if is_packed(blob) else None
    if reference is None:
        return unpack_batch(blob)
    stream, partition, offset, count = reference.stream, reference.partition, reference.offset, reference.count
    rows = db.execute(
        "SELECT offset, messages FROM log_batches WHERE stream = ? AND partition = ? AND offset < ? "
        "AND offset + count > ? ORDER BY offset", (stream, partition, offset + count, offset)).fetchall()
    messages = batch_messages(stream, partition, offset, offset + count, rows, BatchRests(0))
    if len(messages) != count:
        raise RuntimeError(f"outbox seq {first_seq}: {count} records of log {stream} partition {partition} from "
                           f"offset {offset} referenced, {len(messages)} found")
    suffix = reference.id_suffix
    return [[first_seq + i, m.message_id + suffix, m.key, m.event_timestamp, m.row] for i, m in enumerate(messages)]


def entry_messages(stream: str, partition: int, first: int, entries: list[list[Any]]) -> list[LogMessage]:
    """Decoded batch entries ``[message id, key, event timestamp, row]`` as the log messages at
    offsets ``first``, ``first + 1``, ..."""
    # tuple.__new__: a LogMessage without the NamedTuple's Python-level __new__ (per message read)
    return [new_tuple(LogMessage, (stream, partition, index, message_id, key, ts, row))
            for index, (message_id, key, ts, row) in enumerate(entries, first)]


class BatchRests:
    """The decoded rests of log batches that reads stopped inside, by ``(stream, partition, offset
    of the first message left)``: entries ``[message id, key, event timestamp, row]`` as
    :data:`~egress.rows.unpack_batch` returned them. No message of a rest was handed to a reader,
    so each read still gets rows of its own. At most ``limit_messages`` messages are kept, the
    oldest rest dropped first; a rest is taken once. Log batches never change once committed
    (trimming deletes only batches every reader is past, and :meth:`clear` follows it), so a rest
    stays true. Used on the engine's database thread only."""

    def __init__(self, limit_messages: int) -> None:
        self._limit = limit_messages
        self._rests: dict[tuple[str, int, int], list[list[Any]]] = {}
        self.messages = 0

    def keep(self, stream: str, partition: int, offset: int, entries: list[list[Any]]) -> None:
        """Keep ``entries``, the messages of ``(stream, partition)`` from ``offset`` on."""
        self.take(stream, partition, offset)
        self._rests[(stream, partition, offset)] = entries
        self.messages += len(entries)
        while self.messages > self._limit:
            self.messages -= len(self._rests.pop(next(iter(self._rests))))

    def take(self, stream: str, partition: int, offset: int) -> list[list[Any]] | None:
        """The rest that starts at ``offset`` of ``(stream, partition)`` (removed), ``None`` if none is kept."""
        rest = self._rests.pop((stream, partition, offset), None)
        if rest is not None:
            self.messages -= len(rest)
        return rest

    def clear(self) -> None:
        self._rests.clear()
        self.messages = 0


class LogTail:
    """The log batches this process committed last, as stored (MessagePack bytes, so every read
    decodes its own rows: one reader's changes to a row never reach another), at most
    ``limit_bytes`` of them, the oldest dropped first. Per ``(stream, partition)`` the batches are
    contiguous and end where that slot's last commit in this process ended. Used on the engine's
    database thread only."""

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._slots: dict[tuple[str, int], deque[tuple[int, int, bytes]]] = {}
        self._order: deque[tuple[tuple[str, int], int]] = deque()  # (slot, offset) of every batch, oldest first
        self.bytes = 0

    def add(self, stream: str, partition: int, offset: int, count: int, blob: bytes) -> None:
        """Keep the batch of ``count`` messages from ``offset`` just committed to ``(stream, partition)``."""
        slot = (stream, partition)
        batches = self._slots.get(slot)
        if batches and batches[-1][0] + batches[-1][1] != offset:  # a gap: another writer appended
            self.bytes -= sum(len(b) for _, _, b in batches)
            batches = None
        if batches is None:
            batches = self._slots[slot] = deque()
        batches.append((offset, count, blob))
        self._order.append((slot, offset))
        self.bytes += len(blob)
        while self.bytes > self._limit and self._order:
            oldest, at = self._order.popleft()
            kept = self._slots.get(oldest)
            if kept and kept[0][0] == at:
                self.bytes -= len(kept.popleft()[2])

    def batches(self, stream: str, partition: int, after: int, end: int | None) -> list[tuple[int, bytes]] | None:
        """``(offset, messages)`` of the kept batches from the one holding ``after`` on, or ``None``
        when the tail cannot answer: ``after`` is older than what is kept, or the kept batches do not
        reach ``end`` (the slot's durable end offset; ``None``: unknown)."""
        kept = self._slots.get((stream, partition))
        if not kept or end is None or after < kept[0][0] or kept[-1][0] + kept[-1][1] != end:
            return None
        # From the newest back: a reader that keeps up wants the last batch or two, and the tail may
        # hold thousands of small ones (a scan from the oldest cost ~13 µs per event of http ingest).
        found = []
        for offset, count, blob in reversed(kept):
            if offset + count <= after:
                break
            found.append((offset, blob))
        found.reverse()
        return found

