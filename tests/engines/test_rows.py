"""Conformance, rows: every value of a row reads back with its type and its bytes (Flow's strings
are byte strings: ``bytes`` with any byte values, NUL and invalid UTF-8 included, beside ``str``),
from the log and the outbox alike; a row that cannot be stored fails its commit with
``RowEncodingError`` naming the computation, stream, column and message id, and commits nothing."""

from __future__ import annotations

import pytest

from egress.engines import Engine, EpochCommit, OutboxMessage
from egress.errors import RowEncodingError
from tests.engines.conftest import OpenEngine

EVERY_BYTE = bytes(range(256))


async def test_bytes_in_log_and_outbox_rows_read_back_exactly(engine: Engine, reopen: OpenEngine) -> None:
    row = {"payload": EVERY_BYTE, "text": "caf\u00e9", "invalid_utf8": b"\xc3\x28", "none": None}
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, log_appends=[("out", 0, b"m1", b"[]", None, row)],
                                    outbox=[OutboxMessage(1, "requests", b"id1", b"[]", None, row)]))
    await engine.close()
    engine = await reopen()
    assert [m.row for m in await engine.read("out", 0, 0, 10)] == [row]
    assert [m.row for m in (await engine.load_checkpoint("c", 0, ["http"])).outbox] == [row]


@pytest.mark.parametrize("where", ["log", "outbox"])
async def test_a_row_that_cannot_be_stored_fails_the_commit_naming_it_and_commits_nothing(
        engine: Engine, where: str) -> None:
    bad = {"payload": "\udcff"}  # a lone surrogate: no encoding of text can hold it
    good = {"payload": b"\xff"}
    log_row, outbox_row = (bad, good) if where == "log" else (good, bad)
    generation = await engine.acquire("to_json", 1)
    commit = EpochCommit("to_json", 1, generation, {("flights", 1): 5},
                         log_appends=[("out", 0, b"\x01", b"[]", None, good),
                                      ("out", 0, b"\x02", b"[]", None, log_row)],
                         outbox=[OutboxMessage(1, "requests", b"\x03", b"[]", None, good),
                                 OutboxMessage(2, "requests", b"\x04", b"[]", None, outbox_row)])
    with pytest.raises(RowEncodingError) as raised:
        await engine.commit(commit)
    stream, message = ("out", "02") if where == "log" else ("requests", "04")
    assert str(raised.value).startswith(
        f"computation 'to_json' partition 1 emitted message {message} to stream {stream!r} whose column 'payload' "
        "cannot be stored (string contains surrogates")
    assert (await engine.load_checkpoint("to_json", 1, ["http"])).input_positions == {}
    assert await engine.read("out", 0, 0, 10) == []
    assert await engine.end_offset("out", 0) == 0
    await engine.commit(EpochCommit("to_json", 1, generation, log_appends=[("out", 0, b"\x05", b"[]", None, good)]))
    assert [m.offset for m in await engine.read("out", 0, 0, 10)] == [0]  # the failed commit took no offset
