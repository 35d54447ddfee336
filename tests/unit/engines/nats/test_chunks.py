"""The NATS engine's log and outbox chunks, packed whole: sized from their strings beforehand (an
upper bound of the packed size, so no chunk outgrows a message), grouped within a budget, and read
back exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from egress.engines import OutboxMessage
from egress.engines.nats import records
from egress.engines.nats.log_index import Chunk, LogIndex

log_entries = st.tuples(st.binary(max_size=300), st.binary(max_size=70000), st.none() | st.floats(allow_nan=False),
                        st.binary(max_size=70000))
outbox_entries = st.tuples(st.integers(0, 2**63 - 1), st.text(max_size=40), st.binary(max_size=300),
                           st.binary(max_size=70000), st.none() | st.floats(allow_nan=False), st.binary(max_size=70000))


@given(log_entries)
def test_a_log_entry_packs_within_its_estimated_size(entry: records.LogEntry) -> None:
    assert len(records.pack(entry)) <= records.log_entry_size(entry)


@given(outbox_entries)
def test_an_outbox_entry_packs_within_its_estimated_size(entry: records.OutboxEntry) -> None:
    assert len(records.pack(entry)) <= records.outbox_entry_size(entry)


def test_groups_of_sizes_stay_within_the_budget_and_an_oversized_item_stands_alone() -> None:
    assert records.size_groups([40, 40, 40, 30, 100, 10], 100) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert records.size_groups([250, 10, 10], 100) == [(0, 1), (1, 3)]
    assert records.size_groups([], 100) == []


def test_a_log_chunk_reads_back_its_first_offset_count_and_entries() -> None:
    entries = [(b"m%d" % i, b"[%d]" % i, None if i % 2 else 1.5 * i, b"row%d" % i) for i in range(5)]
    chunk = records.log_chunk("events", 3, 4096, entries)
    assert records.log_chunk_extent(chunk) == (4096, 5)
    assert records.log_chunk_entries(chunk) == (4096, entries)


def test_an_outbox_chunk_reads_back_its_messages_and_range() -> None:
    messages = [OutboxMessage(7 + i, "requests", b"m%d" % i, b"[%d]" % i, None, {"payload": f"p{i}"})
                for i in range(3)]
    chunk = records.outbox_chunk([records.outbox_entry_of(m) for m in messages], 7)
    assert records.outbox_chunk_messages(chunk) == messages
    assert records.outbox_chunk_range(chunk) == (7, 9)
    assert records.outbox_chunk_streams(chunk) == [(7, "requests"), (8, "requests"), (9, "requests")]


def test_a_log_index_keeps_the_payloads_notes_carried_as_few_as_decoded_chunks_and_entries_replace_them() -> None:
    index = LogIndex()
    for first in range(0, 60, 10):
        index.add(Chunk(first, 10, first + 1, payload=b"chunk %d" % first))
    kept = [first for first in range(0, 60, 10) if index.chunks[first].payload is not None]
    assert kept == [20, 30, 40, 50]  # the last four, as for decoded entries
    assert index.chunks[0].seq == 1
    assert index.chunks[0].payload is None
    entries = [(b"m", b"k", None, b"r")] * 10
    decoded = index.add(Chunk(50, 10, 51, entries))
    assert decoded.entries == entries
    assert decoded.payload is None
    assert index.add(Chunk(50, 10, 51, payload=b"again")).payload is None  # decoded already: kept so
