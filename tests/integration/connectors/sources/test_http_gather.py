"""The ``http`` source's gather against messy clients on loopback: connections the last commit
answered that go silent, stall mid-request, close after their ``200``, pipeline, turn to a chunked
body, idle keep-alive connections and clients arriving in an open loop. Every request is answered
``200`` once, only after the commit holding it, and every gather ends within
:data:`~egress.connectors.sources.http.GATHER_SECONDS` on the run's clock without spinning."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from egress.clock import VirtualClock
from egress.connectors.base import SourceRecord
from egress.connectors.sources.http import GATHER_GAP, GATHER_SECONDS, HttpSource, HttpSourceParameters
from egress.runtime import Pipeline, load_plan
from egress.spec import StreamSpec
from tests import raw_http
from tests.conftest import ServerFactory, pass_through_spec
from tests.ports import free_port
from tests.waiting import eventually

pytestmark = pytest.mark.integration

STREAM = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                                    "group_by": ["id"]})
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class CountingClock(VirtualClock):
    """A virtual clock counting its event waits (a gather that spins waits without end)."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.waits = 0

    async def wait_event(self, event: asyncio.Event, seconds: float) -> bool:
        self.waits += 1
        return await super().wait_event(event, seconds)


def event(event_id: int) -> bytes:
    return orjson.dumps({"id": event_id, "payload": f"event {event_id}"})


def request(event_id: int, *headers: tuple[str, str]) -> bytes:
    return raw_http.with_length("/events", event(event_id), headers)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One answer on ``reader``: its status and body (framed by its ``Content-Length``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(head.split()[1]), await reader.readexactly(length)


class Committer:
    """Takes and commits the source's batches as its reader does; a commit takes a while (real
    time), so an answer written before its commit is read by its client while it is not committed."""

    def __init__(self, source: HttpSource, clock: CountingClock) -> None:
        self.source, self.clock = source, clock
        self.taken: list[int] = []  # every event id taken, in order
        self.committed: set[int] = set()
        self.gathers: list[tuple[float, int, int]] = []  # per take: its time on the clock, its waits, its events

    async def run(self, stop: asyncio.Event) -> None:
        source, clock = self.source, self.clock
        while True:
            await eventually(lambda: source.unread_records() > 0 or stop.is_set(), what="a request queued",
                             interval=0.001)
            if stop.is_set():
                return
            started, waits = clock.monotonic(), clock.waits
            records: list[SourceRecord] = await source.take(100, 30.0) or []
            self.gathers.append((clock.monotonic() - started, clock.waits - waits, len(records)))
            ids = [record.row["id"] for record in records]
            self.taken += ids
            await asyncio.sleep(0.002)  # the commit's round trip
            self.committed.update(ids)
            source.committed()


class Clients:
    """Event ids for every request, and each 200's check: ``committed(id)`` when it is read (the
    commits so far: ``commits()``)."""

    def __init__(self, port: int, committed: Callable[[int], bool], commits: Callable[[], int]) -> None:
        self.port, self.committed, self.commits = port, committed, commits
        self.ids = itertools.count()
        self.answered: list[int] = []  # the event id of every 200 read
        self.closes = 0  # connections closed by a client (each may move a gather's gap)
        self.calm = asyncio.Event()  # set once the other clients are done: a stall waits for no more commits

    async def connect(self) -> Stream:
        return await asyncio.open_connection("127.0.0.1", self.port)

    def check(self, event_id: int, status: int, body: bytes) -> None:
        assert (status, orjson.loads(body)) == (200, {"accepted": 1}), event_id
        assert self.committed(event_id), f"event {event_id} answered 200 before its commit"
        self.answered.append(event_id)

    async def finish(self, stream: Stream) -> None:
        """A last request with ``Connection: close``: its answer, then the end of the connection,
        and nothing between (no answer came twice)."""
        reader, writer = stream
        event_id = next(self.ids)
        writer.write(request(event_id, ("Connection", "close")))
        self.check(event_id, *await answer(reader))
        assert await reader.read() == b"", "more than one answer to a request"
        writer.close()
        self.closes += 1

    async def keep_alive(self, requests: int) -> None:
        stream = await self.connect()
        for _ in range(requests):
            event_id = next(self.ids)
            stream[1].write(request(event_id))
            self.check(event_id, *await answer(stream[0]))
        await self.finish(stream)

    async def silent(self, done: asyncio.Event) -> None:
        """One request, then silence without closing until ``done`` (the last commit answered it)."""
        stream = await self.connect()
        event_id = next(self.ids)
        stream[1].write(request(event_id))
        self.check(event_id, *await answer(stream[0]))
        await done.wait()
        await self.finish(stream)

    async def pipelining(self, rounds: int) -> None:
        stream = await self.connect()
        for _ in range(rounds):
            first, second = next(self.ids), next(self.ids)
            stream[1].write(request(first) + request(second))
            self.check(first, *await answer(stream[0]))
            self.check(second, *await answer(stream[0]))
        await self.finish(stream)

    async def stalling(self, rounds: int) -> None:
        """Part of a request (of its body, or of its head), a stall over a few commits, then the rest."""
        stream = await self.connect()
        for number in range(rounds):
            event_id = next(self.ids)
            whole = request(event_id)
            cut = len(whole) - 3 if number % 2 else 20
            stream[1].write(whole[:cut])
            await self.stall(self.commits() + 2)
            stream[1].write(whole[cut:])
            self.check(event_id, *await answer(stream[0]))
        await self.finish(stream)

    async def stall(self, commits: int) -> None:
        """Until ``commits`` commits, or the other clients are done (no more commits may come)."""
        await eventually(lambda: self.commits() >= commits or self.calm.is_set(),
                         what="two commits while the request is half sent", interval=0.001)

    async def chunked(self, rounds: int) -> None:
        """A plain request, then a chunked one (the connection goes to aiohttp), then plain ones."""
        stream = await self.connect()
        for number in range(rounds):
            event_id = next(self.ids)
            if number == 1:
                stream[1].write(raw_http.chunked_head("/events") + raw_http.chunk(event(event_id))
                                + raw_http.chunk(b""))
            else:
                stream[1].write(request(event_id))
            self.check(event_id, *await answer(stream[0]))
        await self.finish(stream)

    async def closing_after_200(self) -> None:
        """A new connection, one request, closed as soon as its 200 is read."""
        reader, writer = await self.connect()
        event_id = next(self.ids)
        writer.write(request(event_id))
        self.check(event_id, *await answer(reader))
        writer.close()
        self.closes += 1

    async def open_loop(self, arrivals: int) -> None:
        """``arrivals`` one-request clients, one each millisecond whatever the answers (an open loop)."""
        clients = []
        for _ in range(arrivals):
            clients.append(asyncio.create_task(self.closing_after_200()))
            await asyncio.sleep(0.001)  # the pace of arrivals, not a condition of passing
        await asyncio.gather(*clients)


async def ticking(clock: VirtualClock) -> None:
    """Move ``clock`` on by half a millisecond each real millisecond (or more, on a loaded machine):
    its time passes while the clients' bytes travel, so a gather spans real arrivals."""
    while True:
        await asyncio.sleep(0.001)
        await clock.advance(0.0005)


@contextlib.asynccontextmanager
async def passing(clock: VirtualClock, how: str) -> AsyncIterator[None]:
    if how == "autojumping":  # every wait ends at its deadline as soon as the loop is idle
        async with clock.autojumping():
            yield
        return
    ticker = asyncio.create_task(ticking(clock))
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


async def messy(clients: Clients) -> int:
    """Every kind of client at once (see the module), until each is done; the requests sent."""
    quiet = asyncio.Event()
    idle = [await clients.connect() for _ in range(50)]  # a balancer's keep-alive connections, never used
    silent = [asyncio.create_task(clients.silent(quiet)) for _ in range(4)]
    try:
        others = asyncio.gather(*(clients.keep_alive(20) for _ in range(8)), clients.pipelining(10),
                                clients.chunked(4), clients.open_loop(100))
        others.add_done_callback(lambda _: clients.calm.set())
        await asyncio.gather(others, *(clients.stalling(3) for _ in range(2)))
        quiet.set()
        await asyncio.gather(*silent)
    finally:
        for task in silent:
            task.cancel()
        for _, writer in idle:
            writer.close()
    return next(clients.ids)


@pytest.mark.parametrize("how", ["autojumping", "ticking"])
async def test_messy_clients_get_one_200_each_after_its_commit_and_every_gather_ends_within_its_bound(
        how: str) -> None:
    clock = CountingClock(1_000.0)
    port = free_port()
    source = HttpSource("hooks", HttpSourceParameters(port=port), STREAM, Path("."))
    source.use_clock(clock)
    await source.start(0, b"", until_caught_up=False)
    committer = Committer(source, clock)
    clients = Clients(port, committer.committed.__contains__, lambda: len(committer.gathers))
    stop = asyncio.Event()
    try:
        async with passing(clock, how), asyncio.timeout(60):
            committing = asyncio.create_task(committer.run(stop))
            sent = await messy(clients)
            stop.set()
            await committing
    finally:
        await source.close()
    assert sorted(clients.answered) == list(range(sent))  # every request answered 200, once
    assert sorted(committer.taken) == list(range(sent))  # every event committed, once
    assert max(seconds for seconds, _, _ in committer.gathers) <= GATHER_SECONDS + 1e-9
    for _, waits, events in committer.gathers:
        # a wait ends the gather or moves its gap past a request or a close: never a wait for nothing
        assert waits <= 1 + events + clients.closes


async def test_messy_clients_of_a_run_get_one_200_each_after_its_commit_and_every_event_is_delivered_once(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    """The same clients against ``egress run``'s http source: a 200 is read only once the reader has
    counted as many rows committed, and the endpoint gets every event once."""
    delivered: list[bytes] = []

    async def receive(request: web.Request) -> web.Response:
        delivered.append(await request.read())
        return web.Response()

    receiver = web.Application()
    receiver.router.add_post("/events", receive)
    port = free_port()
    spec = pass_through_spec(tmp_path / "spec.yaml", "http_gather", {"source_class_name": "http",
                                                                     "parameters": {"port": port}},
                             f"{await serve_app(receiver)}/events")
    pipeline = Pipeline(load_plan(spec), tmp_path / "state")
    running = asyncio.create_task(pipeline.run())
    metrics = pipeline.metrics

    def committed(_: int) -> bool:  # this 200 and every one before it: as many rows committed
        return len(clients.answered) < metrics.total("egress_source_rows_total")

    clients = Clients(port, committed, lambda: int(metrics.total("egress_source_commits_total")))
    try:
        probe: Stream = await eventually(clients.connect, what="the http source listening", interval=0.02,
                                         ignoring=(OSError,))
        probe[1].close()
        clients.closes += 1
        async with asyncio.timeout(60):
            sent = await messy(clients)
        assert sorted(clients.answered) == list(range(sent))
        assert metrics.total("egress_source_rows_total") == sent
        await eventually(lambda: len(delivered) >= sent, what="every event delivered")
        assert sorted(delivered) == sorted(f"event {n}".encode() for n in range(sent))
    finally:
        pipeline.request_stop()
        assert (await running).ok


class Answered:
    """``count`` keep-alive connections, each having had one request answered by the last commit."""

    def __init__(self, source: HttpSource, port: int, streams: list[Stream]) -> None:
        self.source, self.port, self.streams = source, port, streams

    @classmethod
    async def open(cls, clock: VirtualClock, count: int, **parameters: Any) -> Answered:
        port = free_port()
        source = HttpSource("hooks", HttpSourceParameters(port=port, **parameters), STREAM, Path("."))
        source.use_clock(clock)
        await source.start(0, b"", until_caught_up=False)
        answered = cls(source, port, [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)])
        for index in range(count):
            answered.post(index, 100 + index)
        await eventually(lambda: source.unread_records() == count, what="a request of each connection")
        assert len(await source.take(100, 1.0) or []) == count
        source.committed()
        for index in range(count):
            assert (await answer(answered.streams[index][0]))[0] == 200
        return answered

    def post(self, index: int, event_id: int) -> None:
        self.streams[index][1].write(request(event_id))

    async def close(self) -> None:
        for _, writer in self.streams:
            writer.close()
        await self.source.close()


async def take_ids(source: HttpSource) -> list[int]:
    return [record.row["id"] for record in await source.take(100, 30.0) or []]


async def test_a_connection_the_last_commit_answered_closing_ends_the_gather_at_once() -> None:
    clock = CountingClock(1_000.0)  # never advanced: only the close can end the gather
    answered = await Answered.open(clock, 2)
    try:
        async with asyncio.timeout(10):
            answered.post(0, 1)
            await eventually(lambda: answered.source.unread_records() == 1, what="the request queued")
            taking = asyncio.create_task(take_ids(answered.source))
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
            answered.streams[1][1].close()
            assert await taking == [1]
        assert (clock.monotonic(), clock.waits) == (1_000.0, 1)
    finally:
        await answered.close()


async def test_a_connection_the_last_commit_answered_turning_to_chunked_ends_the_gather_and_is_committed_next(
) -> None:
    clock = VirtualClock(1_000.0)  # never advanced
    answered = await Answered.open(clock, 2)
    source = answered.source
    try:
        async with asyncio.timeout(10):
            answered.post(0, 1)
            await eventually(lambda: source.unread_records() == 1, what="the request queued")
            taking = asyncio.create_task(take_ids(source))
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
            reader, writer = answered.streams[1]
            writer.write(raw_http.chunked_head("/events") + raw_http.chunk(b'{"id": 2}') + raw_http.chunk(b""))
            # handed over to aiohttp: no longer a lean connection to wait for (the clock never moved)
            first = await taking
            assert (first[0], clock.monotonic()) == (1, 1_000.0)
            source.committed()
            assert (await answer(answered.streams[0][0]))[0] == 200
            if first == [1]:  # aiohttp queued the chunked request after the gather ended: the next batch
                await eventually(lambda: source.unread_records() == 1, what="the chunked request queued")
                taking = asyncio.create_task(take_ids(source))
                await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
                await clock.advance(GATHER_GAP)  # the last commit answered the first connection alone
                assert await taking == [2]
                source.committed()
            else:
                assert first == [1, 2]
            status, body = await answer(reader)
        assert (status, orjson.loads(body)) == (200, {"accepted": 1})
    finally:
        await answered.close()


async def test_a_connection_the_last_commit_answered_stalling_mid_request_holds_the_batch_one_gap_then_is_committed(
) -> None:
    clock = VirtualClock(1_000.0)
    answered = await Answered.open(clock, 2)
    source = answered.source
    try:
        async with asyncio.timeout(10):
            answered.post(0, 1)
            whole = request(2)
            answered.streams[1][1].write(whole[:-3])  # half a request, then a stall
            await eventually(lambda: source.unread_records() == 1, what="the whole request queued")
            taking = asyncio.create_task(take_ids(source))
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
            assert clock.next_deadline() == pytest.approx(1_000.0 + GATHER_GAP)
            await clock.advance(GATHER_GAP)
            assert await taking == [1]
            source.committed()
            assert (await answer(answered.streams[0][0]))[0] == 200
            answered.streams[1][1].write(whole[-3:])
            await eventually(lambda: source.unread_records() == 1, what="the stalled request whole")
            taking = asyncio.create_task(take_ids(source))  # waits a gap for the first connection
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
            assert clock.next_deadline() == pytest.approx(1_000.0 + 2 * GATHER_GAP)
            await clock.advance(GATHER_GAP)
            assert await taking == [2]
            source.committed()
            assert (await answer(answered.streams[1][0]))[0] == 200
    finally:
        await answered.close()


async def test_a_pipelined_request_queued_by_the_commit_answering_the_first_is_not_waited_for_again() -> None:
    clock = CountingClock(1_000.0)  # never advanced
    answered = await Answered.open(clock, 2)
    source = answered.source
    try:
        async with asyncio.timeout(10):
            answered.streams[0][1].write(request(1) + request(2))  # two at once on one connection
            answered.post(1, 3)
            await eventually(lambda: source.unread_records() == 2, what="a request of each connection")
            assert await take_ids(source) == [1, 3]  # the second waits for the first's answer
            source.committed()  # answers 1 and 3; 2 is queued at once, 1's connection has one waiting
            assert (await answer(answered.streams[0][0]))[0] == 200
            await eventually(lambda: source.unread_records() == 1, what="the pipelined request queued")
            taking = asyncio.create_task(take_ids(source))
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering for 3's connection")
            answered.post(1, 4)
            assert await taking == [2, 4]
            source.committed()
            assert [(await answer(answered.streams[i][0]))[0] for i in (0, 1, 1)] == [200, 200, 200]
        assert (clock.monotonic(), clock.waits) == (1_000.0, 1)
    finally:
        await answered.close()


async def test_a_connection_the_last_commit_answered_timing_out_mid_body_ends_the_gather_with_its_408() -> None:
    clock = CountingClock(1_000.0)  # never advanced: only the 408's close can end the gather
    answered = await Answered.open(clock, 2, body_timeout=1.0)
    source = answered.source
    try:
        async with asyncio.timeout(10):
            answered.streams[1][1].write(request(2)[:-3])  # then nothing: body_timeout (the loop's) passes
            answered.post(0, 1)
            await eventually(lambda: source.unread_records() == 1, what="the request queued")
            assert await take_ids(source) == [1]
            status, _ = await answer(answered.streams[1][0])
            assert await answered.streams[1][0].read() == b""  # closed after its 408
        assert (status, clock.monotonic()) == (408, 1_000.0)
        assert clock.waits <= 1  # the gather's one wait (none had the 408 come before the take)
        source.committed()
        assert (await answer(answered.streams[0][0]))[0] == 200
    finally:
        await answered.close()


async def test_a_gather_ends_once_the_takes_limit_of_events_wait_whoever_is_still_awaited() -> None:
    clock = CountingClock(1_000.0)  # never advanced: only the limit can end the gather
    answered = await Answered.open(clock, 3)
    source = answered.source
    try:
        async with asyncio.timeout(10):
            answered.post(0, 1)
            await eventually(lambda: source.unread_records() == 1, what="the request queued")
            taking = asyncio.create_task(source.take(2, 30.0))
            await eventually(lambda: clock.next_deadline() is not None, what="the take gathering")
            answered.post(1, 2)  # the third connection is still awaited
            assert [record.row["id"] for record in await taking or []] == [1, 2]
        assert (clock.monotonic(), clock.waits) == (1_000.0, 1)
    finally:
        await answered.close()
