"""The payloads of the NATS engine's messages, in MessagePack; rows inside in the project's row
encoding (:func:`egress.rows.encode_row`, MessagePack too, as bytes), so a row reads back exactly as
from the SQLite engine (``bytes`` stay ``bytes``; a row of JSON, as written before, still reads).

* checkpoint: ``{"positions": [[stream, partition, offset, hint]], "sinks": [[sink, producer id,
  max persisted message id, max persisted seq, sink state]], "last_seq", "acknowledged",
  "watermark", "generation", "markers", "compacted"}``; ``hint`` is the stream sequence of a log
  chunk at or before ``offset`` (0: unknown), what retention purges below.
* log chunk: ``[stream, partition, first offset, count, [[message id, key, event timestamp, row]]]``.
* outbox chunk: ``[first seq, count, [[seq, stream, message id, key, event timestamp, row]]]``.
* keyed record: ``[name, key, value or None]`` (state: state name; external: table) or, for a
  timer, ``[key, trigger, domain]``.
* redo chunk: ``[[subject without the bucket prefix, keyed record, deleted]]``.
* appends note (core NATS, not stored): ``[sender, [[stream, partition]], [[stream, partition,
  first offset, count, stream sequence]], [log chunk or nil]]``, ``sender`` the committing engine's
  instance id, the third item the log chunks the commit stored (a note without it names the slots
  only), the fourth, one item per chunk of the third, the chunk as stored (its payload, the bytes
  a get of its sequence answers) or nil: a note carries its small chunks whole, so a reader that
  heard it reads them with no request (a note without it carries none).

Leases and members are JSON, for ``nats kv get``: a lease ``{"consumer", "partition", "owner"
(host:pid of the process), "ttl", "acquired_at"}`` plus, for a lease of ``try_acquire``,
``"worker"`` (the owner worker id) and ``"expires_at"`` (the lessee's clock, seconds since the Unix
epoch); a renewal has ``"epoch"`` (:data:`LEASE_GENERATION`: the revision that took it, the lease's
generation) and ``"renewed_at"`` instead of
``"acquired_at"``; a member ``{"worker_id",
"spec_digest", "details"}``.

Whole values are packed and unpacked with ``ormsgpack`` (as rows are). ``msgpack`` stays for what
``ormsgpack`` has no API for: its streaming ``Unpacker``, which reads a chunk's header (first
offset and count, first and last seq) without decoding its entries. The end of a log partition
(``end_offset``, which the runtime asks per job for its lag; the end before an append) and the
outbox chunks of a consumer partition are read that way; a chunk holds up to ``max_payload``
(1 MiB) of entries, and on a chunk of 4,000 log entries (870 kB) the header read takes 40 µs
against 1.4 ms for ``ormsgpack.unpackb`` of the whole. Its ``Packer.pack_array_header`` frames
entries packed once (each is packed alone first, to be sized for ``max_payload``): 0.3 ms for those
4,000 entries, against 4.3 ms for ``ormsgpack.packb`` of a list of ``ormsgpack.Fragment``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import ormsgpack

from egress.engines.protocols import EpochCommit, LeaseInfo, MemberInfo, OutboxMessage, SinkProgress
from egress.rows import decode_row, encode_row

LogEntry = tuple[bytes, bytes, float | None, bytes]
"""A log message as stored in a chunk: ``(message id, key, event timestamp, encoded row)``."""

LEASE_GENERATION = "epoch"
"""The key of a renewed lease's JSON holding its generation (the revision that took it): the stored
name, which buckets written before keep."""

pack = ormsgpack.packb
unpack = ormsgpack.unpackb


NotedChunk = tuple[str, int, int, int, int]
"""A log chunk an appends note names: ``(stream, partition, first offset, count, stream sequence)``."""


NotedPayload = tuple[NotedChunk, bytes | None]
"""A log chunk an appends note names, with the chunk as stored when the note carries it."""


def appends_note(sender: str, slots: Iterable[tuple[str, int]], chunks: Iterable[NotedChunk] = (),
                 payloads: Sequence[bytes | None] = ()) -> bytes:
    """The note a commit with log appends to ``slots`` (its log ``chunks``; ``payloads``: the chunks
    as stored, or ``None`` for one the note does not carry, one per chunk or none at all) publishes
    (see the module docs)."""
    noted = [list(c) for c in chunks]
    carried = list(payloads) if any(payload is not None for payload in payloads) else []
    if carried and len(carried) != len(noted):
        raise ValueError(f"an appends note of {len(noted)} chunks given {len(carried)} payloads")
    note: list[Any] = [sender, sorted([stream, partition] for stream, partition in slots), noted]
    return pack([*note, carried] if carried else note)


def read_appends_note(data: bytes) -> tuple[str, set[tuple[str, int]], list[NotedPayload]]:
    """``(sender, slots, chunks)`` of an appends note, each chunk with its payload when the note
    carries it (none for a note that names its slots only); raises ``ValueError`` or ``TypeError``
    for a note that is not one."""
    sender, slots, *rest = unpack(data)
    chunks = rest[0] if rest else []
    payloads = rest[1] if len(rest) > 1 and rest[1] else [None] * len(chunks)
    if len(payloads) != len(chunks):
        raise ValueError(f"an appends note of {len(chunks)} chunks carries {len(payloads)} payloads")
    return (str(sender), {(str(stream), int(partition)) for stream, partition in slots},
            [((str(stream), int(partition), int(first), int(count), int(seq)),
              None if payload is None else bytes(payload))
             for (stream, partition, first, count, seq), payload in zip(chunks, payloads, strict=True)])


def appends_note_slots(data: bytes) -> tuple[str, set[tuple[str, int]]]:
    """``(sender, slots)`` of an appends note."""
    sender, slots, _ = read_appends_note(data)
    return sender, slots


def appends_note_chunks(data: bytes) -> list[NotedChunk]:
    """The log chunks an appends note names (none for a note that names its slots only)."""
    return [chunk for chunk, _ in read_appends_note(data)[2]]


def lease_info(record: bytes, revision: int, now: float) -> LeaseInfo:
    """The :class:`LeaseInfo` of a stored lease ``record`` at stream sequence ``revision``, ``now``
    seconds since the Unix epoch: a lease of ``acquire`` names no owner and never lapses."""
    lease: dict[str, Any] = json.loads(record)
    expires_at = lease.get("expires_at")
    return LeaseInfo(str(lease["consumer"]), int(lease["partition"]), str(lease.get("worker", "")),
                     int(lease.get(LEASE_GENERATION, revision)),
                     None if expires_at is None else max(0.0, float(expires_at) - now))


def member_record(member: MemberInfo) -> bytes:
    return json.dumps({"worker_id": member.worker_id, "spec_digest": member.spec_digest,
                       "details": member.details}, sort_keys=True).encode()


def member_info(record: bytes) -> MemberInfo:
    member: dict[str, Any] = json.loads(record)
    return MemberInfo(str(member["worker_id"]), str(member["spec_digest"]), dict(member.get("details") or {}))


def array(items: Sequence[bytes]) -> bytes:
    """A MessagePack array of already packed ``items``."""
    packer = msgpack.Packer(use_bin_type=True)
    return packer.pack_array_header(len(items)) + b"".join(items)  # type: ignore[no-any-return]


def log_chunk(stream: str, partition: int, first: int, entries: Sequence[LogEntry]) -> bytes:
    """A log chunk of ``entries`` (rows encoded), packed whole (sized beforehand with
    :func:`log_entry_size`)."""
    return pack([stream, partition, first, len(entries), entries])


ENTRY_FRAMING = 48
"""Bytes of MessagePack a log or outbox chunk entry takes at most besides its byte and text
strings (its array header, their headers, a seq, a float or nil): chunks are sized from the strings'
lengths plus this, then packed whole in one call (half the CPU of packing each entry alone)."""


def log_entry_size(entry: LogEntry) -> int:
    """At least the packed size of a log chunk entry."""
    return len(entry[0]) + len(entry[1]) + len(entry[3]) + ENTRY_FRAMING


OutboxEntry = tuple[int, str, bytes, bytes, float | None, bytes]
"""An outbox message as stored in a chunk: ``(seq, stream, message id, key, event timestamp, encoded row)``."""


def outbox_entry_of(message: OutboxMessage) -> OutboxEntry:
    """One outbox message as a chunk entry; raises ``TypeError`` for a row
    :func:`~egress.rows.encode_row` cannot store."""
    return (message.seq, message.stream, message.message_id, message.key, message.event_timestamp,
            encode_row(message.row))


def outbox_entry_size(entry: OutboxEntry) -> int:
    """At least the packed size of an outbox chunk entry (a text string: up to 4 bytes a character)."""
    return 4 * len(entry[1]) + len(entry[2]) + len(entry[3]) + len(entry[5]) + ENTRY_FRAMING


def size_groups(sizes: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """``(start, end)`` of consecutive groups of ``sizes`` totalling at most ``budget`` each (an
    item larger than ``budget`` alone in its group; the caller checks its real size)."""
    groups: list[tuple[int, int]] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        if index > start and total + size > budget:
            groups.append((start, index))
            start, total = index, 0
        total += size
    if start < len(sizes):
        groups.append((start, len(sizes)))
    return groups


def log_chunk_entries(data: bytes) -> tuple[int, list[LogEntry]]:
    """A log chunk's first offset and entries (rows still encoded). msgpack's C unpacker makes
    each entry a tuple itself (``use_list=False``): a quarter of the CPU of rebuilding the entries
    from ormsgpack's lists in Python, paid by a job for every message another worker's reader
    appended."""
    _, _, first, _, entries = msgpack.unpackb(data, use_list=False, raw=False)
    return int(first), list(entries)


def log_chunk_extent(data: bytes) -> tuple[int, int]:
    """A log chunk's first offset and count, read without decoding its entries."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    unpacker.read_array_header()
    unpacker.skip()
    unpacker.skip()
    return int(unpacker.unpack()), int(unpacker.unpack())


def outbox_chunk(entries: Sequence[OutboxEntry], first: int) -> bytes:
    """An outbox chunk of ``entries``, packed whole (sized beforehand with :func:`outbox_entry_size`)."""
    return pack([first, len(entries), entries])


def outbox_chunk_messages(data: bytes) -> list[OutboxMessage]:
    _, _, entries = unpack(data)
    return [OutboxMessage(int(seq), str(stream), bytes(mid), bytes(key), ts, decode_row(row))
            for seq, stream, mid, key, ts, row in entries]


def outbox_chunk_streams(data: bytes) -> list[tuple[int, str]]:
    """``(seq, stream)`` of each message of an outbox chunk (rows left encoded)."""
    _, _, entries = unpack(data)
    return [(int(entry[0]), str(entry[1])) for entry in entries]


def outbox_chunk_range(data: bytes) -> tuple[int, int]:
    """An outbox chunk's first and last seq."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    unpacker.read_array_header()
    first, count = int(unpacker.unpack()), int(unpacker.unpack())
    return first, first + count - 1


def redo_chunk(entries: Sequence[bytes]) -> bytes:
    return array(entries)


def redo_entry(suffix: str, record: bytes, deleted: bool) -> bytes:
    return pack([suffix, record, deleted])


def redo_entries(data: bytes) -> list[tuple[str, bytes, bool]]:
    return [(str(suffix), bytes(record), bool(deleted)) for suffix, record, deleted in unpack(data)]


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """The committed checkpoint of one consumer partition.

    ``positions`` maps ``(stream, partition)`` to ``(offset, hint)``; ``last_seq`` is the highest
    outbox seq ever committed and ``acknowledged`` the highest ``outbox_acknowledged_seq`` (outbox
    messages up to it are gone); ``watermark`` the event-time watermark or ``None``;
    ``generation`` the generation of the partition's state and timer subjects that is live (the
    stream sequence it was chosen at, so generations only grow), ``markers`` the delete markers
    written into it since and ``compacted`` the live keys it started with (the engine compacts
    into a new generation once ``markers`` outgrows both ``compacted`` and its threshold).
    """

    positions: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    sinks: dict[str, SinkProgress] = field(default_factory=dict)
    last_seq: int = 0
    acknowledged: int = 0
    watermark: float | None = None
    generation: int = 0
    markers: int = 0
    compacted: int = 0

    def updated(self, commit: EpochCommit, hints: dict[tuple[str, int], int]) -> CheckpointRecord:
        """This checkpoint with ``commit`` applied; ``hints`` give a chunk sequence per position
        (a missing or 0 hint keeps the one before, still a chunk at or before the new offset)."""
        positions = dict(self.positions)
        for slot, offset in commit.input_positions.items():
            old_hint = positions.get(slot, (0, 0))[1]
            positions[slot] = (offset, hints.get(slot) or old_hint)
        last_seq = max([self.last_seq, *(m.seq for m in commit.outbox)])
        acknowledged = self.acknowledged
        if commit.outbox_acknowledged_seq is not None:
            acknowledged = max(acknowledged, commit.outbox_acknowledged_seq)
        return replace(self, positions=positions, sinks={**self.sinks, **commit.sink_progress}, last_seq=last_seq,
                       acknowledged=acknowledged,
                       watermark=self.watermark if commit.watermark is None else commit.watermark)

    def encode(self) -> bytes:
        return pack({
            "positions": [[s, p, offset, hint] for (s, p), (offset, hint) in self.positions.items()],
            "sinks": [[sink, progress.producer_id, progress.max_persisted_message_id, progress.max_persisted_seq_no,
                       progress.sink_state] for sink, progress in self.sinks.items()],
            "last_seq": self.last_seq,
            "acknowledged": self.acknowledged,
            "watermark": self.watermark,
            "generation": self.generation,
            "markers": self.markers,
            "compacted": self.compacted,
        })

    @classmethod
    def decode(cls, data: bytes) -> CheckpointRecord:
        record = unpack(data)
        return cls(
            {(str(s), int(p)): (int(offset), int(hint)) for s, p, offset, hint in record["positions"]},
            {str(sink): SinkProgress(str(producer), None if mid is None else bytes(mid), int(seq), bytes(state))
             for sink, producer, mid, seq, state in record["sinks"]},
            int(record["last_seq"]), int(record["acknowledged"]), record["watermark"],
            int(record.get("generation", 0)), int(record.get("markers", 0)), int(record.get("compacted", 0)))


def chunked(entries: Iterable[bytes], budget: int) -> list[list[bytes]]:
    """``entries`` in consecutive groups of at most ``budget`` bytes each (an entry larger than
    ``budget`` alone in its group; the caller refuses it)."""
    groups: list[list[bytes]] = []
    size = budget + 1
    for entry in entries:
        if size + len(entry) > budget:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += len(entry)
    return groups
