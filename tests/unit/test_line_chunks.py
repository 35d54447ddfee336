"""``egress.line_chunks``: runs of whole lines found at the newlines, the ids of a chunk's records,
and the stored forms of a chunk and of an outbox reference."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.keys import derived_message_id, source_message_id, source_message_id_prefix
from egress.line_chunks import (
    ChunkReference,
    LineChunk,
    chunk_entries,
    is_packed,
    lines_fitting,
    nth_line_end,
    pack_chunk,
    pack_reference,
    unpack_chunk,
    unpack_reference,
)
from egress.rows import pack_batch

SCOPE = "pipeline/source/file"
lines_strategy = st.lists(st.binary(min_size=1, max_size=12).map(lambda b: b.replace(b"\n", b"x")), min_size=1,
                          max_size=30)


def chunk_of(records: list[bytes], first: int = 0, suffix: bytes = b"") -> LineChunk:
    return LineChunk(b"".join(r + b"\n" for r in records), len(records), source_message_id_prefix(SCOPE, 0), first,
                     "line", suffix)


@given(lines_strategy, st.integers(0, 400), st.integers(0, 40), st.data())
def test_lines_fitting_is_the_longest_run_of_whole_lines_within_both_bounds(
        records: list[bytes], room_bytes: int, room_records: int, data: st.DataObject) -> None:
    chunk = chunk_of(records)
    first = data.draw(st.integers(0, len(records) - 1))
    start = nth_line_end(chunk.data, 0, first) if first else 0
    end, lines = lines_fitting(chunk.data, start, room_bytes, room_records)
    assert lines_fitting(chunk.data, start, room_bytes, room_records, len(records) - first) == (end, lines)
    sizes = [len(r) + 1 for r in records[first:]]
    expected = 0
    while expected < len(sizes) and expected < room_records and sum(sizes[:expected + 1]) <= room_bytes:
        expected += 1
    assert lines == expected
    assert end - start == sum(sizes[:expected])
    assert chunk.data[start:end] == b"".join(r + b"\n" for r in records[first:first + expected])


def test_record_ids_are_the_sources_and_the_identitys_derived_ones() -> None:
    chunk = chunk_of([b"a", b"b", b"c"], first=41)
    assert [chunk.message_id(i) for i in range(3)] == [source_message_id(SCOPE, 0, p) for p in (41, 42, 43)]
    derived = chunk.derived(derived_message_id(b"", 0))
    assert derived.message_id(2) == derived_message_id(source_message_id(SCOPE, 0, 43), 0)
    tail = derived.tail(1)
    assert (tail.count, tail.data, tail.message_id(0)) == (2, b"b\nc\n", derived.message_id(1))


@given(st.lists(st.text(min_size=1, max_size=8).map(lambda t: t.replace("\n", "x")), min_size=1, max_size=20),
       st.integers(0, 2**40), st.binary(max_size=4))
def test_a_stored_chunk_reads_back_as_the_same_chunk_and_the_same_rows(texts: list[str], first: int,
                                                                        suffix: bytes) -> None:
    chunk = chunk_of([t.encode() for t in texts], first, suffix)
    blob = pack_chunk(chunk)
    assert is_packed(blob)
    assert unpack_chunk(blob) == chunk
    assert chunk.rows() == [{"line": t} for t in texts]
    assert chunk_entries(chunk, 1) == [[chunk.message_id(i), b"[]", None, {"line": t}]
                                       for i, t in enumerate(texts) if i >= 1]


def test_a_reference_reads_back_and_nothing_else_reads_as_one() -> None:
    reference = ChunkReference("lines", 3, 12_345, 678, b"\x00\x00")
    assert unpack_reference(pack_reference(reference)) == reference
    assert unpack_reference(pack_chunk(chunk_of([b"x"]))) is None
    rows = pack_batch([(1, b"id", b"[]", None, {"line": "x"})])
    assert not is_packed(rows)
    assert unpack_reference(rows) is None
    with pytest.raises(ValueError, match="not a stored line chunk"):
        unpack_chunk(pack_reference(reference))
