"""The batching HTTP sink's byte-chunk path (``distribute_chunk``): batches sliced from chunks of
lines have the bodies, keys, boundaries and per-record dead letters that the same records as rows
(``distribute``) give."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress.engines import OutboxMessage, SinkProgress
from egress.keys import derived_message_id, source_message_id_prefix
from egress.line_chunks import LineChunk
from tests.unit.connectors.sinks.test_async_http_delivery import Outcome
from tests.unit.connectors.sinks.test_batching_http import Harness

PREFIX = source_message_id_prefix("pipeline/source/file", 0)
SUFFIX = derived_message_id(b"", 0)


def chunk(records: list[str], first_position: int) -> LineChunk:
    return LineChunk("".join(r + "\n" for r in records).encode(), len(records), PREFIX, first_position, "p", SUFFIX)


def as_messages(c: LineChunk, first_seq: int) -> list[OutboxMessage]:
    return [OutboxMessage(first_seq + i, "events", c.message_id(i), b"[]", None, {"p": row["p"]})
            for i, row in enumerate(c.rows())]


def split(records: list[str], cuts: list[int]) -> list[tuple[int, list[str]]]:
    """``records`` cut at ``cuts`` into chunks: ``(index of the first record, records)`` each."""
    edges = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    return [(a, records[a:b]) for a, b in itertools.pairwise(edges) if b > a]


async def run(static: dict[str, Any], parts: list[tuple[int, list[str]]], *, chunks: bool) -> Harness:
    h = Harness(static)
    for first, records in parts:
        c = chunk(records, 100 + first)
        if chunks:
            h.sink.distribute_chunk(1 + first, c)
        else:
            h.sink.distribute(as_messages(c, 1 + first))
    h.sink.flush()
    await h.settle()
    return h


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\n"), min_size=1, max_size=9),
                min_size=1, max_size=40),
       st.lists(st.integers(0, 40), max_size=4), st.integers(1, 60), st.integers(1, 7),
       st.sampled_from(["identity", "gzip"]))
async def test_chunks_give_the_bodies_and_keys_of_the_same_records_as_rows(
        records: list[str], cuts: list[int], max_bytes: int, max_events: int, encoding: str) -> None:
    static: dict[str, Any] = {"max_bytes": max_bytes, "max_events": max_events, "max_delay": "1s"}
    if encoding == "gzip":
        static["content_encoding"] = "gzip"
    parts = split(records, cuts)
    rows, lines = await run(static, parts, chunks=False), await run(static, parts, chunks=True)

    def sent(h: Harness) -> list[tuple[str | None, bytes]]:  # gzip runs on threads: in any order
        return sorted((h.header(i, "Idempotency-Key"), body) for i, body in enumerate(h.bodies()))

    assert sent(lines) == sent(rows)
    assert lines.sink.progress() == rows.sink.progress()
    assert lines.sink.unacknowledged == 0


def test_the_sink_takes_chunks_only_of_its_payload_column_as_json_lines() -> None:
    assert Harness().sink.takes_chunks("p")
    assert not Harness().sink.takes_chunks("other")
    assert not Harness({"encoding": "json_array"}).sink.takes_chunks("p")
    assert not Harness({"encoding": "raw"}).sink.takes_chunks("p")


async def test_a_chunk_restarted_inside_its_persisted_prefix_sends_only_the_rest() -> None:
    c = chunk(["a", "b", "c", "d"], 0)
    h = Harness({"max_events": 10}, progress=SinkProgress("", c.message_id(1), 2))
    h.sink.distribute_chunk(1, c)
    with pytest.raises(ValueError, match="not greater than the last distributed"):
        h.sink.distribute_chunk(4, chunk(["e"], 4))
    h.sink.flush()
    await h.settle()
    assert h.bodies() == [b"c\nd\n"]
    assert h.sink.progress().max_persisted_seq_no == 4


async def test_a_chunk_batch_that_fails_for_good_is_dead_lettered_one_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    failing = b"c\nd\n"  # the second batch of two
    h = Harness({"max_events": 2, "dead_letter_path": str(path)},
                script=lambda request, n: Outcome(503 if request.body == failing else 200))
    h.sink.reconfigure(h.sink._dynamic.model_copy(update={"max_attempt_count": 1}))
    c = chunk(["a", "b", "c", "d", "e"], 7)
    h.sink.distribute_chunk(11, c.tail(0))
    h.sink.flush()
    await h.settle()
    assert h.sink.terminal_error is None
    assert h.sink.progress().max_persisted_seq_no == 15
    letters = [json.loads(line) for line in path.read_text().splitlines()]
    key = f"{c.message_id(2).hex().upper()}-{c.message_id(3).hex().upper()}"
    assert [(d["seq"], d["message_id"], d["payload"], d["idempotency_key"]) for d in letters] == [
        (13, c.message_id(2).hex(), "c", key), (14, c.message_id(3).hex(), "d", key)]
    assert h.bodies().count(failing) == 1
    assert h.bodies()[-1] == b"e\n"
