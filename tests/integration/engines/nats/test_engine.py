"""NatsEngine beyond the conformance suite (tests/engines/ runs that too): its bucket and lease,
fencing across processes, commits bigger than one atomic batch, reading from a fresh process,
concurrent appenders, bounded storage, and the errors of an unusable server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from egress.clock import VirtualClock
from egress.engines import ROLE_PREFIX, EpochCommit, FencedError, LogAppend, MemberInfo, SinkProgress
from egress.engines.nats import NatsEngine, NatsEngineError, NatsUnavailableError
from egress.engines.nats.appends import NOTE_CARRIES
from egress.engines.nats.errors import JetStreamRequestError
from egress.engines.nats.log import SEARCH_PERIOD
from egress.errors import EgressError, StateDirectoryError
from egress.keys import encode_key
from egress.runtime.lanes import lane
from tests.engines.engines import outbox_message
from tests.nats_server import nats_server_binary
from tests.waiting import eventually

pytestmark = pytest.mark.integration

Opener = Callable[..., Awaitable[NatsEngine]]


@pytest.fixture
async def open_nats(nats_server: str, request: pytest.FixtureRequest) -> AsyncIterator[Opener]:
    """Opens NatsEngines on this test's own bucket (each call: another process's view of it)."""
    bucket = "egress_it_" + request.node.name.replace("[", "_").replace("]", "")[-40:]
    opened: list[NatsEngine] = []

    async def open_engine(pipeline: str = "p", **options: Any) -> NatsEngine:
        engine = NatsEngine(nats_server, pipeline, bucket=options.pop("bucket", bucket), **options)
        opened.append(engine)
        await engine.open()
        return engine

    yield open_engine
    for engine in opened:
        await engine.close()
    connection = await nats.connect(nats_server)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await connection.jetstream().delete_stream(f"KV_{bucket}")
    await connection.close()


async def stream_info(url: str, engine: NatsEngine) -> Any:
    connection = await nats.connect(url)
    try:
        return await connection.jetstream().stream_info(f"KV_{engine.bucket}")
    finally:
        await connection.close()


def appends(stream: str, partition: int, start: int, count: int) -> list[LogAppend]:
    return [(stream, partition, f"m{i}".encode(), encode_key([i]), float(i), {"i": i})
            for i in range(start, start + count)]


async def test_the_bucket_is_one_file_stream_keeping_one_message_per_subject(open_nats: Opener,
                                                                             nats_server: str) -> None:
    engine = await open_nats()
    config = (await stream_info(nats_server, engine)).config
    assert (config.subjects, config.storage, config.num_replicas, config.max_msgs_per_subject,
            config.allow_atomic, config.allow_direct) == ([f"$KV.{engine.bucket}.>"], "file", 1, 1, True, True)
    await engine.close()
    await open_nats()  # opening again leaves the stream as it is


async def test_the_lease_is_a_kv_entry_whose_revision_is_the_generation(open_nats: Opener, nats_server: str) -> None:
    engine = await open_nats(owner="worker-7", lease_ttl=12.5)
    generation = await engine.acquire("source:files", 3)
    connection = await nats.connect(nats_server)
    try:
        entry = await (await connection.jetstream().key_value(engine.bucket)).get("lease.=c291cmNlOmZpbGVz.3")
    finally:
        await connection.close()
    assert entry.revision == generation
    lease = json.loads(entry.value or b"")
    assert (lease["consumer"], lease["partition"], lease["owner"], lease["ttl"]) == (
        "source:files", 3, "worker-7", 12.5)


async def test_a_lease_of_try_acquire_is_a_kv_entry_with_a_per_message_ttl_naming_its_worker(
        open_nats: Opener, nats_server: str) -> None:
    engine = await open_nats(owner="host:7")
    generation = await engine.try_acquire("source:files", 3, "worker-7", 2.5)
    assert generation is not None
    assert await engine.renew("source:files", 3, generation, 2.5)
    stored = await engine._js().last(f"$KV.{engine.bucket}.lease.=c291cmNlOmZpbGVz.3")
    assert stored is not None
    lease = json.loads(stored.data)
    assert (stored.headers["Nats-TTL"], lease["worker"], lease["owner"], lease["epoch"]) == (
        "3s", "worker-7", "host:7", generation)
    assert stored.seq > generation  # the renewal's revision: the fence from now on


async def test_a_lease_message_sent_again_after_its_answer_was_lost_reads_back_its_revision(
        open_nats: Opener) -> None:
    from egress.engines.nats.jetstream import Outgoing, expect_last

    engine = await open_nats()
    subject = f"$KV.{engine.bucket}.lease.c.0"
    message = Outgoing(subject, b'{"worker": "w", "expires_at": 1.5}', expect_last(0, subject))
    first = await engine._publish_lease(message, "a lease")
    assert first is not None
    assert await engine._publish_lease(message, "a lease") == first
    other = message._replace(payload=b'{"worker": "v", "expires_at": 1.5}')
    assert await engine._publish_lease(other, "a lease") is None


async def test_a_lease_taken_by_another_process_fences_the_first_owner(open_nats: Opener) -> None:
    first, second = await open_nats(), await open_nats()
    old = await first.acquire("c", 0)
    await first.commit(EpochCommit("c", 0, old, {("in", 0): 1}, log_appends=appends("out", 0, 0, 1)))
    new = await second.acquire("c", 0)
    with pytest.raises(FencedError, match="stale"):
        await first.commit(EpochCommit("c", 0, old, {("in", 0): 2}, log_appends=appends("out", 0, 1, 1)))
    await second.commit(EpochCommit("c", 0, new, {("in", 0): 2}, log_appends=appends("out", 0, 1, 1)))
    # read by a fresh process: ``first`` may not have heard of the second's append (its read stops at the end it knows)
    assert [m.offset for m in await (await open_nats()).read("out", 0, 0, 10)] == [0, 1]
    assert (await first.load_checkpoint("c", 0, [])).input_positions == {("in", 0): 2}


async def test_a_bucket_of_another_pipeline_is_refused(open_nats: Opener) -> None:
    await open_nats("orders")
    with pytest.raises(NatsEngineError, match="belongs to pipeline 'orders', not 'payments'"):
        await open_nats("payments")


async def test_open_without_create_refuses_a_missing_bucket_naming_it_and_creates_none(
        nats_server: str) -> None:
    engine = NatsEngine(nats_server, "absent", bucket="egress_it_absent")
    with pytest.raises(StateDirectoryError) as raised:
        await engine.open(create=False)
    await engine.close()
    assert str(raised.value) == (f"NATS bucket egress_it_absent at {nats_server}: no egress state here (no bucket "
                                 "egress_it_absent for pipeline 'absent'): check the pipeline name and the servers")
    with pytest.raises(nats.js.errors.NotFoundError):
        await stream_info(nats_server, engine)


async def test_open_without_create_opens_an_existing_bucket_of_its_pipeline_only(open_nats: Opener) -> None:
    engine = await open_nats("orders")
    await engine.write_meta("k", "v")
    await engine.close()
    existing = NatsEngine(engine.servers, "orders", bucket=engine.bucket)
    try:
        await existing.open(create=False)
        assert await existing.read_meta("k") == "v"
    finally:
        await existing.close()
    other = NatsEngine(engine.servers, "payments", bucket=engine.bucket)
    with pytest.raises(NatsEngineError, match="belongs to pipeline 'orders', not 'payments'"):
        await other.open(create=False)
    await other.close()


def many_keyed_writes(generation: int, n: int, count: int) -> EpochCommit:
    keys = [encode_key([f"user{i}"]) for i in range(count)]
    return EpochCommit(
        "c", 0, generation, {("in", 0): n}, outbox=[outbox_message(seq) for seq in range(1, 3)],
        state_writes={("counts", key): b"%d" % n for key in keys},
        external_state_writes={("profiles", key): b"p%d" % n for key in keys[:500]},
        timers_set=[(key, float(n), "processing") for key in keys[:500]],
        timers_deleted=[(key, float(n - 1), "processing") for key in keys[:500]], watermark=float(n))


async def test_a_commit_with_more_keyed_writes_than_one_batch_holds_lands_whole(open_nats: Opener) -> None:
    engine = await open_nats()
    generation = await engine.acquire("c", 0)
    for n in (1, 2):
        await engine.commit(many_keyed_writes(generation, n, 3000))  # 4,000 keyed writes: over a batch's 1,000
    keyed = await (await open_nats()).load_keyed_state("c", 0, 1, ["profiles"])
    assert keyed.internal == {"counts": {encode_key([f"user{i}"]): b"2" for i in range(3000)}}
    assert keyed.external == {"profiles": {encode_key([f"user{i}"]): b"p2" for i in range(500)}}
    assert sorted(keyed.timers) == sorted((encode_key([f"user{i}"]), 2.0, "processing") for i in range(500))
    assert keyed.watermark == 2.0


async def test_keyed_writes_committed_but_not_yet_applied_are_loaded_and_applied_by_the_next_owner(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    crashing = await open_nats()
    generation = await crashing.acquire("c", 0)
    await crashing.commit(many_keyed_writes(generation, 1, 1500))

    async def crash(*args: Any) -> None:
        raise ConnectionResetError("the process died here")

    monkeypatch.setattr(crashing, "_apply_redo", crash)  # dies after the atomic batch, before the redo
    with pytest.raises(ConnectionResetError):
        await crashing.commit(many_keyed_writes(generation, 2, 1500))
    await crashing.close()
    successor = await open_nats()
    expected = {"counts": {encode_key([f"user{i}"]): b"2" for i in range(1500)}}
    assert (await successor.load_keyed_state("c", 0, 1, [])).internal == expected  # from the redo
    assert (await successor.load_checkpoint("c", 0, [])).input_positions == {("in", 0): 2}
    generation = await successor.acquire("c", 0)
    await successor.commit(EpochCommit("c", 0, generation, {("in", 0): 3}, state_writes={("counts", b'["x"]'): b"3"}))
    assert await successor._js().scan(successor._layout.all_redos()) == []  # applied and purged
    expected["counts"][b'["x"]'] = b"3"
    assert (await (await open_nats()).load_keyed_state("c", 0, 1, [])).internal == expected


async def test_the_inventory_counts_outbox_messages_not_acknowledged_and_timers_not_deleted(
        open_nats: Opener) -> None:
    engine = await open_nats()
    generation = await engine.acquire("c", 0)
    await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 1}, outbox=[outbox_message(s) for s in (1, 2, 3)],
                                    timers_set=[(b'["a"]', 1.0, "processing"), (b'["b"]', 2.0, "event")]))
    await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 2}, outbox_acknowledged_seq=2,
                                    timers_deleted=[(b'["a"]', 1.0, "processing")]))
    found = await (await open_nats()).inventory()  # the chunk of seqs 1-3 stays, a's deletion marker too
    assert (found.outbox, found.timers, found.read_positions) == ({("c", 0, "requests"): 1}, {("c", 0): 1},
                                                                  {("in", 0): [2]})


async def test_the_inventory_counts_timers_committed_but_not_yet_applied(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    crashing = await open_nats()
    generation = await crashing.acquire("c", 0)

    async def crash(*args: Any) -> None:
        raise ConnectionResetError("the process died here")

    monkeypatch.setattr(crashing, "_apply_redo", crash)  # dies after the atomic batch, before the redo
    with pytest.raises(ConnectionResetError):  # 1,500 timers: over a batch's 1,000, so committed as redo
        await crashing.commit(EpochCommit("c", 0, generation, {("in", 0): 1},
                                          timers_set=[(encode_key([i]), 5.0, "processing") for i in range(1500)]))
    assert (await (await open_nats()).inventory()).timers == {("c", 0): 1500}


async def test_metadata_of_any_key_is_read_by_another_process(open_nats: Opener) -> None:
    await (await open_nats()).write_meta("spec layout/v2", "caf\u00e9")
    reader = await open_nats()
    assert (await reader.read_meta("spec layout/v2"), await reader.read_meta("spec_layout")) == ("caf\u00e9", None)


async def test_a_fresh_process_reads_the_log_from_any_offset(open_nats: Opener) -> None:
    writer = await open_nats()
    generation = await writer.acquire("source:s", 0)
    for start in range(0, 500, 100):
        await writer.commit(EpochCommit("source:s", 0, generation, {("", 0): start + 100},
                                        log_appends=appends("events", 1, start, 100)))
    reader = await open_nats()
    assert [m.row["i"] for m in await reader.read("events", 1, 250, 120)] == list(range(250, 370))
    assert [m.offset for m in await reader.read("events", 1, 10, 3)] == [10, 11, 12]
    assert await reader.read("events", 1, 500, 10) == []
    assert await reader.end_offset("events", 1) == 500


async def test_a_read_of_an_empty_log_partition_or_from_its_last_chunk_searches_no_subjects(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle job's reads (an empty lane, a lane read to its end) cost a direct get of the last
    chunk, not a STREAM.INFO over the chunk subjects."""
    writer = await open_nats()
    generation = await writer.acquire("source:s", 0)
    for start in range(0, 500, 100):
        await writer.commit(EpochCommit("source:s", 0, generation, {("", 0): start + 100},
                                        log_appends=appends("events", 1, start, 100)))
    empty, caught_up, within_last = await open_nats(), await open_nats(), await open_nats()
    for reader in (empty, caught_up, within_last):
        monkeypatch.setattr(reader._js(), "subjects", no_request("searched the chunk subjects"))
    assert await empty.read("events", 2, 0, 10) == []
    assert await caught_up.read("events", 1, 500, 10) == []
    assert [m.offset for m in await within_last.read("events", 1, 450, 100)] == list(range(450, 500))


async def heard_note_of_next_commit(writer: NatsEngine, reader: NatsEngine, generation: int,
                                    rows: Callable[[int], list[LogAppend]]) -> int:
    """Commit ``rows(end)`` (appends from the log's end) until ``reader`` hears a note, then once
    more, heard: returns the end before that last commit."""
    heard = asyncio.Event()
    reader.on_appends(lambda slots: heard.set())

    async def commit() -> int:
        end = await writer.end_offset("events", 1)
        await writer.commit(EpochCommit("source:s", 0, generation, {("", 0): end + 1}, log_appends=rows(end)))
        return end

    async def commit_until_heard() -> bool:  # the reader may subscribe after the first notes went out
        await commit()
        return heard.is_set()

    await eventually(commit_until_heard, what="the reader hears an appends note", interval=0.05)
    heard.clear()  # subscribed: the note of the next commit reaches it
    end = await commit()
    await asyncio.wait_for(heard.wait(), 30)
    return end


def no_request(what: str) -> Callable[..., Awaitable[None]]:
    async def refused(*_: object, **__: object) -> None:
        raise AssertionError(f"the reader {what}")
    return refused


async def test_a_reader_that_heard_an_appends_note_carrying_a_small_chunk_reads_it_with_no_request(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    writer, reader = await open_nats(), await open_nats()
    generation = await writer.acquire("source:s", 0)
    assert await reader.read("events", 1, 0, 10) == []  # the reader knows the log partition's end
    end = await heard_note_of_next_commit(writer, reader, generation, lambda end: appends("events", 1, end, 100))
    for request in ("get", "scan", "subjects", "last"):
        monkeypatch.setattr(reader._js(), request, no_request(f"asked the server ({request}) for a carried chunk"))
    read = await reader.read("events", 1, end, 100)
    assert [(m.offset, m.message_id, m.row) for m in read] == [(i, f"m{i}".encode(), {"i": i})
                                                              for i in range(end, end + 100)]


async def test_a_reader_that_heard_an_appends_note_gets_a_chunk_too_large_to_carry_by_its_sequence_without_a_search(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    writer, reader = await open_nats(), await open_nats()
    generation = await writer.acquire("source:s", 0)
    padding = "x" * (NOTE_CARRIES // 10)

    def large(end: int) -> list[LogAppend]:  # 20 rows of NOTE_CARRIES / 10 bytes: one chunk, twice too large
        return [(stream, partition, message_id, key, timestamp, {**row, "pad": padding})
                for stream, partition, message_id, key, timestamp, row in appends("events", 1, end, 20)]

    assert await reader.read("events", 1, 0, 10) == []
    end = await heard_note_of_next_commit(writer, reader, generation, large)
    for request in ("scan", "subjects"):
        monkeypatch.setattr(reader._js(), request, no_request("searched the stream for a chunk the note named"))
    assert [m.offset for m in await reader.read("events", 1, end, 100)] == list(range(end, end + 20))


async def test_a_read_with_messages_stops_at_the_known_end_and_a_read_from_there_finds_an_unannounced_chunk(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    own, other = await open_nats(), await open_nats()
    generations = [await own.acquire("source:a", 0), await other.acquire("source:b", 0)]
    await own.commit(EpochCommit("source:a", 0, generations[0], log_appends=appends("events", 0, 0, 100)))
    known = own._log_ends[("events", 0)]
    await other.commit(EpochCommit("source:b", 0, generations[1], log_appends=appends("events", 0, 100, 100)))
    own._log_ends[("events", 0)] = known  # as if the other's appends note was missed (notes are at most once)
    scan = own._js().scan

    async def no_search(*_: object, **__: object) -> None:
        raise AssertionError("a read with messages searched the stream past the end it knows")

    monkeypatch.setattr(own._js(), "scan", no_search)
    assert [m.offset for m in await own.read("events", 0, 0, 1000)] == list(range(100))
    monkeypatch.setattr(own._js(), "scan", scan)
    assert [m.offset for m in await own.read("events", 0, 100, 1000)] == list(range(100, 200))


async def test_a_read_from_the_known_end_searches_for_an_unannounced_chunk_at_most_every_search_period(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock()
    own, other = await open_nats(clock=clock), await open_nats()
    generations = [await own.acquire("source:a", 0), await other.acquire("source:b", 0)]
    await own.commit(EpochCommit("source:a", 0, generations[0], log_appends=appends("events", 0, 0, 100)))
    known = own._log_ends[("events", 0)]
    assert await own.read("events", 0, 100, 1000) == []  # a search from the known end that finds nothing
    await other.commit(EpochCommit("source:b", 0, generations[1], log_appends=appends("events", 0, 100, 100)))
    own._log_ends[("events", 0)] = known  # as if the other's appends note was missed (notes are at most once)
    scan = own._js().scan

    async def no_search(*_: object, **__: object) -> None:
        raise AssertionError("a read from the known end searched again within SEARCH_PERIOD")

    monkeypatch.setattr(own._js(), "scan", no_search)
    assert await own.read("events", 0, 100, 1000) == []
    monkeypatch.setattr(own._js(), "scan", scan)
    await clock.advance(SEARCH_PERIOD)
    assert [m.offset for m in await own.read("events", 0, 100, 1000)] == list(range(100, 200))


async def test_the_backstop_wakes_only_after_a_log_append_and_until_a_wake_reads_a_chunk_whose_note_was_missed(
        open_nats: Opener) -> None:
    """``appends_missed``: no wake while nothing is appended (renewals and commits without appends
    move no log), and after an append ``True`` until a read woken then searches again, which finds
    the chunk whose note was missed."""
    clock = VirtualClock()
    own, other = await open_nats(clock=clock), await open_nats()
    generations = [await own.acquire("source:a", 0), await other.acquire("source:b", 0)]
    await own.commit(EpochCommit("source:a", 0, generations[0], log_appends=appends("events", 0, 0, 100)))
    assert await own.appends_missed()  # the first call
    await clock.advance(SEARCH_PERIOD)
    assert await own.appends_missed()
    await other.commit(EpochCommit("source:b", 0, generations[1], {("", 0): 5}))  # no log append
    assert not await own.appends_missed()
    assert not await own.appends_missed()
    known = own._log_ends[("events", 0)]
    assert await own.read("events", 0, 100, 1000) == []  # searched: nothing past the end yet
    await other.commit(EpochCommit("source:b", 0, generations[1], log_appends=appends("events", 0, 100, 100)))
    own._log_ends[("events", 0)] = known  # as if the other's appends note was missed (notes are at most once)
    assert await own.appends_missed()
    assert await own.read("events", 0, 100, 1000) == []  # within SEARCH_PERIOD of its last search: not searched
    await clock.advance(SEARCH_PERIOD)
    assert await own.appends_missed()  # SEARCH_PERIOD after the move: a woken read searches
    assert [m.offset for m in await own.read("events", 0, 100, 1000)] == list(range(100, 200))
    assert not await own.appends_missed()


async def test_a_writer_that_heard_another_writers_appends_note_appends_after_it_at_the_first_attempt(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = await open_nats(), await open_nats()
    heard = asyncio.Event()
    second.on_appends(lambda slots: heard.set())
    generations = [await first.acquire("source:a", 0), await second.acquire("source:b", 0)]
    await second.commit(EpochCommit("source:b", 0, generations[1], log_appends=appends("events", 0, 0, 10)))
    offset = 10

    async def first_appends_until_heard() -> bool:  # the second may subscribe after the first notes went out
        nonlocal offset
        await first.commit(EpochCommit("source:a", 0, generations[0], log_appends=appends("events", 0, offset, 10)))
        offset += 10
        return heard.is_set()

    await eventually(first_appends_until_heard, what="the second writer hears an appends note", interval=0.05)
    heard.clear()
    await first_appends_until_heard()
    await asyncio.wait_for(heard.wait(), 30)
    refused: list[int] = []
    publish_batch = second._js().publish_batch

    async def counting(*args: Any, **kwargs: Any) -> int | None:
        try:
            return await publish_batch(*args, **kwargs)
        except JetStreamRequestError as error:
            refused.append(error.code)
            raise

    monkeypatch.setattr(second._js(), "publish_batch", counting)
    await second.commit(EpochCommit("source:b", 0, generations[1], log_appends=appends("events", 0, offset, 10)))
    assert refused == []
    messages = await (await open_nats()).read("events", 0, 0, offset + 10)
    assert [m.offset for m in messages] == list(range(offset + 10))


async def test_two_processes_appending_to_one_log_partition_keep_its_offsets_dense(open_nats: Opener) -> None:
    engines = [await open_nats(), await open_nats()]
    generations = [await engine.acquire(f"source:{i}", 0) for i, engine in enumerate(engines)]
    for round_ in range(6):  # each engine's idea of the end is stale after the other appended
        i = round_ % 2
        await engines[i].commit(EpochCommit(f"source:{i}", 0, generations[i],
                                            log_appends=appends("events", 0, round_ * 10, 10)))
    messages = await (await open_nats()).read("events", 0, 0, 100)
    assert [(m.offset, m.row["i"]) for m in messages] == [(i, i) for i in range(60)]


async def commit_at_once(open_nats: Opener, log_stream: Callable[[int], str], writers: int = 4, commits: int = 40,
                         partitions: int = 4) -> list[NatsEngine]:
    """``writers`` source readers (each its own process's engine, a lease of its own, reader ``k``
    appending to ``log_stream(k)``) commit back to back, every commit appending to each of the
    ``partitions`` log partitions; every commit lands once, offsets dense. Returns the engines."""
    engines = [await open_nats() for _ in range(writers)]
    generations = [await engine.acquire("source:s", reader) for reader, engine in enumerate(engines)]

    async def read_all(reader: int) -> None:
        for n in range(commits):
            rows = [(log_stream(reader), p, f"r{reader}n{n}p{p}".encode(), encode_key([reader]), 0.0,
                     {"r": reader, "n": n}) for p in range(partitions)]
            await engines[reader].commit(EpochCommit("source:s", reader, generations[reader], {("", 0): n + 1},
                                                     log_appends=rows))

    await asyncio.gather(*(read_all(reader) for reader in range(writers)))
    fresh = await open_nats()
    streams = sorted({log_stream(reader) for reader in range(writers)})
    for stream in streams:
        mine = [reader for reader in range(writers) if log_stream(reader) == stream]
        for p in range(partitions):
            messages = await fresh.read(stream, p, 0, writers * commits + 1)
            assert [m.offset for m in messages] == list(range(len(mine) * commits))
            assert sorted(m.message_id for m in messages) == sorted(f"r{r}n{n}p{p}".encode()
                                                                   for r in mine for n in range(commits))
    for reader in range(writers):
        assert (await fresh.load_checkpoint("source:s", reader, [])).input_positions == {("", 0): commits}
    return engines


async def test_writers_committing_at_once_to_the_same_log_partitions_all_commit(open_nats: Opener) -> None:
    """Four writers of the same log partitions (as the partitions of a computation writing one logged
    stream are) commit at once: a writer that reads the ends after losing a race arrives behind the
    others' next commits, and must not give up while its lease holds (a worker of a healthy cluster
    would exit 1)."""
    await commit_at_once(open_nats, lambda reader: "events")


async def test_readers_of_one_source_committing_at_once_each_to_its_lane_never_race(open_nats: Opener) -> None:
    """The same four writers as a source's readers, each appending to its own lane
    (``egress.runtime.lanes``): no commit is refused for another's appends."""
    engines = await commit_at_once(open_nats, lambda reader: lane("events", reader))
    assert [engine.races_lost for engine in engines] == [0, 0, 0, 0]


async def wait_for_messages_at_most(url: str, engine: NatsEngine, bound: int) -> int:
    """Poll the stream's message count until it is at most ``bound`` (a member's delete marker lapses
    a second after it is written); returns the last count seen."""

    async def at_most() -> list[int]:  # the count in a list: a count of 0 is a success too
        count = int((await stream_info(url, engine)).state.messages)
        return [count] if count <= bound else []

    return (await eventually(at_most, what=f"at most {bound} messages in the stream", interval=0.05))[0]


async def churn(engine: NatsEngine, commits: int) -> None:
    """``commits`` rounds of: a source commit appending 20 log messages, and a job commit reading
    them with an outbox message, its acknowledgement, 5 state keys overwritten, a key deleted, a
    timer set and the previous one deleted (two delete markers per round)."""
    source, job = await engine.acquire("source:s", 0), await engine.acquire("c", 0)
    position = 0
    for n in range(1, commits + 1):
        await engine.commit(EpochCommit("source:s", 0, source, {("", 0): n * 20},
                                        log_appends=appends("events", 0, (n - 1) * 20, 20)))
        batch = await engine.read("events", 0, position, 100)
        position = batch[-1].offset + 1
        await engine.commit(EpochCommit(
            "c", 0, job, {("events", 0): position}, outbox=[outbox_message(n)],
            sink_progress={"http": SinkProgress("", b"", n - 1)}, outbox_acknowledged_seq=n - 1,
            state_writes={("counts", encode_key([n % 5])): b"%d" % n, ("gone", encode_key([n])): b"1"}
            if n % 2 else {("counts", encode_key([n % 5])): b"%d" % n, ("gone", encode_key([n - 1])): None},
            timers_set=[(b"[]", float(n), "processing")],
            timers_deleted=[(b"[]", float(n - 1), "processing")] if n > 1 else []))


async def test_storage_stays_bounded_through_deletions_as_generations_are_compacted(
        open_nats: Opener, nats_server: str) -> None:
    engine = await open_nats(retention_period=0, compaction_markers=10)
    await engine.register(MemberInfo("w-1", "d", {}), 30)
    await engine.deregister("w-1")  # a worker id used once leaves nothing behind
    await churn(engine, 200)
    # meta, 2 leases, 2 checkpoints, 5 state keys and a timer live, up to 11 markers, 1-2 log and outbox chunks
    assert await wait_for_messages_at_most(nats_server, engine, 27) <= 27
    assert (await engine.load_checkpoint("c", 0, ["http"])).outbox == [outbox_message(200)]
    assert [m.offset for m in await engine.read("events", 0, 3990, 100)] == list(range(3990, 4000))
    keyed = await engine.load_keyed_state("c", 0, 1, [])
    assert keyed.internal == {"counts": {encode_key([n % 5]): b"%d" % n for n in range(196, 201)}}
    assert keyed.timers == [(b"[]", 200.0, "processing")]
    assert (await engine.inventory()).timers == {("c", 0): 1}


async def test_without_compaction_each_deletion_keeps_a_marker(open_nats: Opener, nats_server: str) -> None:
    """The bound of the test above comes from compaction: else 25 deleted keys and 49 deleted timers stay as markers."""
    engine = await open_nats(retention_period=0, compaction_markers=10**9)
    await churn(engine, 50)
    assert (await stream_info(nats_server, engine)).state.messages >= 74


async def test_the_log_is_kept_for_the_slowest_consumer_and_for_one_that_has_not_committed(
        open_nats: Opener, nats_server: str) -> None:
    engine = await open_nats(retention_period=0)
    source = await engine.acquire("source:s", 0)
    fast, slow = await engine.acquire("fast", 0), await engine.acquire("slow", 0)
    for n in range(10):
        await engine.commit(EpochCommit("source:s", 0, source, log_appends=appends("events", 0, n * 10, 10)))
    await engine.read("events", 0, 0, 100)
    await engine.commit(EpochCommit("fast", 0, fast, {("events", 0): 100}))
    await engine.trim()
    assert len(await engine.read("events", 0, 0, 100)) == 100  # "slow" holds a lease, has committed nothing
    await engine.commit(EpochCommit("slow", 0, slow, {("events", 0): 35}))
    await engine.trim()
    assert [m.offset for m in await (await open_nats()).read("events", 0, 0, 3)] == [30, 31, 32]


async def test_a_role_lease_does_not_keep_the_log(open_nats: Opener) -> None:
    engine = await open_nats(retention_period=0)
    source, job = await engine.acquire("source:s", 0), await engine.acquire("c", 0)
    assert await engine.try_acquire(f"{ROLE_PREFIX}throttler-controller", 0, "w1", 5) is not None
    for n in range(10):
        await engine.commit(EpochCommit("source:s", 0, source, log_appends=appends("events", 0, n * 10, 10)))
    await engine.commit(EpochCommit("c", 0, job, {("events", 0): 35}))
    await engine.trim()
    assert [m.offset for m in await (await open_nats()).read("events", 0, 0, 3)] == [30, 31, 32]


async def test_an_unreachable_server_raises_an_egress_error_naming_the_url(open_nats: Opener) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{unused.getsockname()[1]}"  # bound, not listening: refused
        engine = NatsEngine(url, "p", connect_timeout=1)
        with pytest.raises(NatsEngineError) as raised:
            await engine.open()
        await engine.close()
    message = str(raised.value)
    assert isinstance(raised.value, EgressError)
    assert message.startswith(f"{url}: cannot connect to the NATS server within 1 s")
    assert "\n" not in message


async def test_a_server_without_jetstream_raises_an_egress_error_naming_the_fix() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await asyncio.create_subprocess_exec(str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port),
                                                  stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    engine = NatsEngine(f"nats://127.0.0.1:{port}", "p", connect_timeout=10)
    try:
        with pytest.raises(NatsEngineError, match=f"nats://127.0.0.1:{port}: JetStream is not enabled .* -js"):
            await engine.open()
    finally:
        await engine.close()
        server.terminate()
        await server.wait()



class LeaderlessAtFirst(NatsEngine):
    """A NatsEngine whose first ``failures`` meta checks meet the answer a replicated stream gives
    before its leader is elected (two workers creating the R3 bucket of a cluster just formed): a
    JetStream publish that no stream answers, sent through the real server."""

    def __init__(self, *args: Any, failures: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures = failures
        self.checks = 0

    async def _check_meta(self, kv: Any, create: bool) -> None:
        self.checks += 1
        if self.checks <= self.failures:
            assert self._connection is not None
            await self._connection.jetstream().publish(f"egress_no_stream.{self.bucket}", b"")
        await super()._check_meta(kv, create)


async def test_open_tries_again_while_the_stream_has_no_leader(nats_server: str) -> None:
    """A worker that met a leaderless stream while opening its bucket exited 1 at start while the others
    drained (benchmarks/cluster_failover.py): open waits it out as any request does."""
    engine = LeaderlessAtFirst(nats_server, "p", bucket="egress_it_leaderless", failures=2)
    try:
        await engine.open()
        assert engine.checks == 3
        other = NatsEngine(nats_server, "p", bucket="egress_it_leaderless")
        try:
            await other.open()  # the meta key the retried check created is there, and it is this pipeline's
        finally:
            await other.close()
    finally:
        await engine.close()
        connection = await nats.connect(nats_server)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await connection.jetstream().delete_stream("KV_egress_it_leaderless")
        await connection.close()


async def test_open_refuses_a_bucket_of_another_pipeline_at_once(nats_server: str) -> None:
    """Not every failure is tried again: the answer that the bucket is another pipeline's is final."""
    first = NatsEngine(nats_server, "p", bucket="egress_it_owned")
    other = NatsEngine(nats_server, "q", bucket="egress_it_owned", outage_timeout=30)
    try:
        await first.open()
        started = asyncio.get_running_loop().time()
        with pytest.raises(NatsEngineError, match="belongs to pipeline 'p'"):
            await other.open()
        assert asyncio.get_running_loop().time() - started < 15  # not the 30 s of tries
    finally:
        await other.close()
        await first.close()
        connection = await nats.connect(nats_server)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await connection.jetstream().delete_stream("KV_egress_it_owned")
        await connection.close()


async def test_a_server_lost_after_open_raises_an_egress_error_naming_the_url(tmp_path: Path) -> None:
    """The commit waits for the server to come back for ``outage_timeout`` seconds (1 s here; the
    waiting is the same at the 60 s default), then raises the retryable ``NatsUnavailableError``;
    closing the engine then ends nats-py's reconnecting too."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await asyncio.create_subprocess_exec(str(nats_server_binary()), "-js", "-a", "127.0.0.1", "-p",
                                                  str(port), "-sd", str(tmp_path), stdout=asyncio.subprocess.DEVNULL,
                                                  stderr=asyncio.subprocess.DEVNULL)
    engine = NatsEngine(f"nats://127.0.0.1:{port}", "p", connect_timeout=10, request_timeout=0.5,
                        outage_timeout=1.0)
    try:
        await engine.open()
        generation = await engine.acquire("c", 0)
        server.terminate()
        await server.wait()
        with pytest.raises(NatsUnavailableError, match=f"nats://127.0.0.1:{port}: stream KV_egress_p: .*no usable "
                                                       r"answer for 1 s \(\d+ attempts; .*server is up"):
            await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 1}))
        await engine.close()  # and nats-py's reconnecting ends with it (else the event loop never could)
        assert not [task for task in asyncio.all_tasks() if "_attempt_reconnect" in repr(task.get_coro())]
    finally:
        await engine.close()
        if server.returncode is None:
            server.terminate()
            await server.wait()


async def test_state_and_timers_read_back_exactly_through_compactions_and_reloads(open_nats: Opener) -> None:
    """Random writes and deletions of keys and timers over 120 commits, several per batch beyond a
    batch (the redo path) now and then, compacted every few commits; a fresh engine loads exactly
    what a model of the commits holds, after every commit."""
    rng = random.Random(11)
    writer = await open_nats(retention_period=3600, compaction_markers=8)
    generation = await writer.acquire("c", 0)
    state: dict[bytes, bytes] = {}
    timers: set[tuple[bytes, float]] = set()
    for n in range(1, 121):
        size = 1200 if n % 40 == 0 else rng.randint(1, 12)  # 1,200 keyed writes do not fit one batch
        writes: dict[tuple[str, bytes], bytes | None] = {}
        for _ in range(size):
            key = encode_key([rng.randrange(60)])
            value = None if key in state and rng.random() < 0.5 else b"%d" % n
            writes[("s", key)] = value
        for key_value in list(writes.items()):
            (_, key), value = key_value
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        due = sorted(timers)[:rng.randint(0, 3)]
        new = {(encode_key([rng.randrange(60)]), float(n)) for _ in range(rng.randint(0, 3))} - timers
        timers = (timers - set(due)) | new
        await writer.commit(EpochCommit("c", 0, generation, {("in", 0): n}, state_writes=writes,
                                        timers_set=[(key, trigger, "processing") for key, trigger in sorted(new)],
                                        timers_deleted=[(key, trigger, "processing") for key, trigger in due]))
        if n % 7 == 0 or n % 40 == 0:
            reader = await open_nats()
            keyed = await reader.load_keyed_state("c", 0, 1, [])
            assert keyed.internal.get("s", {}) == state, n
            assert sorted((key, trigger) for key, trigger, _ in keyed.timers) == sorted(timers), n
            assert (await reader.inventory()).timers.get(("c", 0), 0) == len(timers), n


async def test_an_outbox_chunk_stored_by_a_commit_that_died_before_its_checkpoint_is_not_committed(
        open_nats: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    crashing = await open_nats()
    generation = await crashing.acquire("c", 0)
    await crashing.commit(EpochCommit("c", 0, generation, {("in", 0): 1}, outbox=[outbox_message(1)]))
    js = crashing._js()
    publish = js.publish

    async def die_at_the_checkpoint(message: Any) -> int:
        if message.subject == crashing._layout.checkpoint("c", 0):
            raise ConnectionResetError("the process died here")
        return await publish(message)

    monkeypatch.setattr(js, "publish", die_at_the_checkpoint)
    with pytest.raises(ConnectionResetError):  # its chunk of seqs 2-4 is stored, its checkpoint is not
        await crashing.commit(EpochCommit("c", 0, generation, {("in", 0): 4},
                                          outbox=[outbox_message(seq) for seq in (2, 3, 4)]))
    assert len(await js.scan(crashing._layout.outbox_chunks("c", 0))) == 2
    await crashing.close()
    successor = await open_nats()
    checkpoint = await successor.load_checkpoint("c", 0, [])
    assert ([m.seq for m in checkpoint.outbox], checkpoint.next_seq) == ([1], 2)
    assert (await successor.inventory()).outbox == {("c", 0, "requests"): 1}
    generation = await successor.acquire("c", 0)
    await successor.commit(EpochCommit("c", 0, generation, {("in", 0): 2}, outbox=[outbox_message(2)]))
    await successor.commit(EpochCommit("c", 0, generation, {("in", 0): 3}, outbox=[outbox_message(3)]))
    assert [m.seq for m in (await (await open_nats()).load_checkpoint("c", 0, [])).outbox] == [1, 2, 3]
    assert [m.seq for m in await successor.read_outbox("c", 0, 0, 10)] == [1, 2, 3]


async def test_an_outbox_commit_of_a_fenced_owner_stores_no_chunk(open_nats: Opener) -> None:
    first, second = await open_nats(), await open_nats()
    old = await first.acquire("c", 0)
    await first.commit(EpochCommit("c", 0, old, {("in", 0): 1}, outbox=[outbox_message(1)]))
    await second.acquire("c", 0)
    with pytest.raises(FencedError, match="stale"):
        await first.commit(EpochCommit("c", 0, old, {("in", 0): 2}, outbox=[outbox_message(2)]))
    assert len(await second._js().scan(second._layout.outbox_chunks("c", 0))) == 1
