"""The ``http`` source: POSTed events are answered 200 only once committed, bad bodies 400 with the
line, 401 without the token, 413 over the limit, 429 while events pile up or the sinks downstream
hold back (a stalled receiver), and a repeated ``Idempotency-Key`` is one event, across restarts too.
A body is read whole however it arrives (in pieces, chunked, split anywhere), up to
``max_body_bytes`` (413) and within ``body_timeout`` (408), or answered 400 at once when the
client half-closes (FIN) before its end, on the lean path and aiohttp's alike, from raw sockets."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from egress.clock import VirtualClock
from egress.connectors.sources.http import (
    GATHER_GAP,
    GATHER_SECONDS,
    STOP_GRACE,
    HttpSource,
    HttpSourceError,
    HttpSourceParameters,
)
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.runtime.cluster.assignment import assign
from egress.runtime.pipeline import nats_engine_factory
from egress.runtime.unit import Unit
from egress.spec import StreamSpec
from tests import raw_http
from tests.conftest import ServerFactory, pass_through_spec
from tests.fuzzing import fuzz
from tests.live_source_support import assert_an_idle_take_waits_on_the_clock
from tests.ports import free_port
from tests.waiting import eventually

pytestmark = pytest.mark.integration

STREAM = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                                    "group_by": ["id"]})


class StallingReceiver:
    """An endpoint that holds every request until ``recover()``, then answers 200, recording each
    payload it answered (a delivery retried after a timeout may come twice)."""

    def __init__(self) -> None:
        self.recovered = asyncio.Event()
        self.waiting = 0
        self.delivered: set[str] = set()
        self.app = web.Application()
        self.app.router.add_post("/events", self._receive)

    def recover(self) -> None:
        self.recovered.set()

    async def _receive(self, request: web.Request) -> web.Response:
        body = (await request.read()).decode()
        self.waiting += 1
        try:
            await self.recovered.wait()
        finally:
            self.waiting -= 1
        self.delivered.add(body)
        return web.Response()


class Running:
    """A pipeline run in the background, its source's URL, and a client session."""

    def __init__(self, pipeline: Pipeline, task: asyncio.Task[Any], url: str, session: aiohttp.ClientSession,
                 port: int) -> None:
        self.pipeline, self.task, self.url, self.session, self.port = pipeline, task, url, session, port

    async def stop(self) -> None:
        self.pipeline.request_stop()
        assert (await self.task).ok

    async def post(self, body: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
        async with self.session.post(self.url, data=body, headers=headers) as response:
            return response.status, await response.json()


@pytest.fixture
async def run_http(tmp_path: Path, serve_app: ServerFactory) -> AsyncIterator[Any]:
    tasks: list[tuple[Pipeline, asyncio.Task[Any]]] = []
    session = aiohttp.ClientSession()

    async def start(receiver: Receiver | StallingReceiver, **parameters: Any) -> Running:
        port = free_port()
        spec = pass_through_spec(tmp_path / "spec.yaml", "http_test",
                                 {"source_class_name": "http", "parameters": {"port": port, **parameters}},
                                 f"{await serve_app(receiver.app)}/events")
        pipeline = Pipeline(load_plan(spec), tmp_path / "state")
        task = asyncio.create_task(pipeline.run())
        tasks.append((pipeline, task))
        url = f"http://127.0.0.1:{port}/events"

        async def listening() -> bool:
            async with session.get(url) as response:  # 405: listening (only POST is routed)
                return response.status == 405

        await eventually(listening, what="the http source listening", interval=0.02,
                         ignoring=(aiohttp.ClientConnectionError,))
        return Running(pipeline, task, url, session, port)

    yield start
    for pipeline, task in tasks:
        pipeline.request_stop()
        await task
    await session.close()


async def test_posted_events_are_answered_200_once_committed_and_delivered(run_http: Any) -> None:
    receiver = Receiver()
    running = await run_http(receiver, format="jsonl")
    status, answer = await running.post(b'{"id": 1, "payload": "a"}\n{"id": 2, "payload": "b"}\n')
    assert (status, answer) == (200, {"accepted": 2})
    # The 200 came after the commit: the events are in the log already.
    assert running.pipeline.metrics.total("egress_source_rows_total") == 2
    await eventually(lambda: receiver.stats.requests >= 2, what="two requests delivered")


async def test_bad_json_is_400_naming_the_line_and_nothing_of_the_body_is_accepted(run_http: Any) -> None:
    receiver = Receiver()
    running = await run_http(receiver, format="jsonl")
    status, answer = await running.post(b'{"id": 1, "payload": "a"}\n{"id": "x"}\n')
    assert status == 400
    assert answer["error"] == "line 2: column id: expected int64, got str 'x'"
    assert running.pipeline.metrics.total("egress_source_rows_total") == 0


async def test_a_bearer_token_by_reference_is_required_when_configured(
        run_http: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_TOKEN", "s3cret")
    running = await run_http(Receiver(), bearer_token_env="HOOK_TOKEN")
    assert (await running.post(b'{"id": 1}'))[0] == 401
    assert (await running.post(b'{"id": 1}', Authorization="Bearer wrong"))[0] == 401
    assert (await running.post(b'{"id": 1}', Authorization="Bearer s3cret"))[0] == 200


async def test_a_body_over_the_limit_is_413(run_http: Any) -> None:
    running = await run_http(Receiver(), max_body_bytes=100, format="raw", payload_column="payload")
    status, answer = await running.post(b"x" * 101)
    assert status == 413
    assert "over 100 bytes" in answer["error"]


async def test_a_repeated_idempotency_key_is_one_event_also_after_a_restart(run_http: Any) -> None:
    receiver = Receiver()
    running = await run_http(receiver)
    for _ in range(2):
        status, _answer = await running.post(b'{"id": 1, "payload": "once"}', **{"Idempotency-Key": "k1"})
        assert status == 200
    await running.stop()
    again = await run_http(receiver)
    status, answer = await again.post(b'{"id": 1, "payload": "once"}', **{"Idempotency-Key": "k1"})
    assert (status, answer) == (200, {"accepted": 0, "duplicate": True})
    assert (await again.post(b'{"id": 2, "payload": "new"}', **{"Idempotency-Key": "k2"}))[0] == 200
    await eventually(lambda: receiver.stats.requests >= 2, what="two requests delivered")
    assert receiver.stats.requests == 2
    assert again.pipeline.metrics.total("egress_source_rows_total") == 1


async def test_events_piling_up_uncommitted_get_429_with_retry_after() -> None:
    port = free_port()
    parameters = HttpSourceParameters(port=port, max_pending_events=1, retry_after=3)
    source = HttpSource("hooks", parameters, STREAM, Path("."))
    await source.start(0, b"", until_caught_up=False)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/events"
            first = asyncio.create_task(session.post(url, data=b'{"id": 1}'))
            await eventually(lambda: source.unread_records() > 0, what="the first request queued")
            async with session.post(url, data=b'{"id": 2}') as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "3"
            records = await source.take(10, 1.0)
            assert records is not None
            assert [r.row["id"] for r in records] == [1]
            assert not first.done()  # taken but not committed: no answer yet
            source.committed()
            async with await first as response:
                assert response.status == 200
    finally:
        await source.close()


async def test_a_stalled_receiver_makes_the_source_answer_429_until_it_recovers_and_nothing_accepted_is_lost(
        run_http: Any) -> None:
    receiver = StallingReceiver()
    running = await run_http(receiver, max_backlog=4, retry_after=2)
    accepted: list[str] = []
    async with asyncio.timeout(10):
        while True:  # one event at a time, each answered once committed, until the source refuses
            payload = f"event {len(accepted)}"
            async with running.session.post(running.url, data=orjson.dumps({"id": len(accepted),
                                                                           "payload": payload})) as response:
                if response.status == 429:
                    assert response.headers["Retry-After"] == "2"
                    assert "max_backlog 4" in (await response.json())["error"]
                    break
                assert response.status == 200
                accepted.append(payload)
    # Refused only once more than max_backlog were committed and not delivered (the receiver holds them).
    assert len(accepted) >= 4
    assert receiver.delivered == set()
    receiver.recover()
    async with asyncio.timeout(10):
        while True:  # the client's retry: answered 200 once the backlog is delivered
            payload = f"event {len(accepted)}"
            status, _ = await running.post(orjson.dumps({"id": len(accepted), "payload": payload}))
            if status == 200:
                accepted.append(payload)
                break
            assert status == 429
            await asyncio.sleep(0.05)  # the client's Retry-After, shortened
        await eventually(lambda: receiver.delivered >= set(accepted), what="every accepted event delivered")
    assert running.pipeline.metrics.total("egress_source_rows_total") == len(accepted)


async def test_an_idle_take_waits_on_the_runs_clock() -> None:
    await assert_an_idle_take_waits_on_the_clock(HttpSource("hooks", HttpSourceParameters(port=free_port()), STREAM,
                                                            Path(".")))


class Clients:
    """``count`` keep-alive connections to a started source, each having had one request answered (so
    each is open on the source's lean path), posting one event per request."""

    def __init__(self, source: HttpSource, port: int) -> None:
        self.source, self.port = source, port
        self.connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.sent = 0

    async def open(self, count: int) -> None:
        self.connections = [await asyncio.open_connection("127.0.0.1", self.port) for _ in range(count)]
        for index in range(count):
            self.post(index)
        await eventually(lambda: self.source.unread_records() == count, what="a request of each connection")
        assert len(await self.source.take(100, 1.0) or []) == count  # every connection has a request: at once
        self.source.committed()
        for index in range(count):
            assert (await self.answer(index)).startswith(b"HTTP/1.1 200 ")

    def post(self, index: int) -> None:
        self.connections[index][1].write(raw_http.with_length("/events", orjson.dumps({"id": self.sent})))
        self.sent += 1

    async def answer(self, index: int) -> bytes:
        reader = self.connections[index][0]
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return head + await reader.readexactly(length)

    async def close(self) -> None:
        for _, writer in self.connections:
            writer.close()


async def gathering(clock: VirtualClock, connections: int) -> tuple[HttpSource, Clients]:
    port = free_port()
    source = HttpSource("hooks", HttpSourceParameters(port=port), STREAM, Path("."))
    source.use_clock(clock)
    await source.start(0, b"", until_caught_up=False)
    clients = Clients(source, port)
    await clients.open(connections)
    return source, clients


async def test_a_batch_waits_for_a_request_of_each_open_connection_so_one_commit_takes_them_all() -> None:
    clock = VirtualClock(1_000.0)  # never advanced: the gathering's time limit never passes
    source, clients = await gathering(clock, 2)
    try:
        clients.post(0)
        await eventually(lambda: source.unread_records() == 1, what="the first connection's request queued")
        taking = asyncio.create_task(source.take(100, 30.0))
        clients.post(1)
        async with asyncio.timeout(10):
            records = await taking
        assert [r.row["id"] for r in records or []] == [2, 3]  # one batch, one commit, both answered by it
        source.committed()
        assert [(await clients.answer(i)).startswith(b"HTTP/1.1 200 ") for i in range(2)] == [True, True]
    finally:
        await clients.close()
        await source.close()


async def take_on_the_clock(source: HttpSource, clock: VirtualClock, deadline: float) -> asyncio.Task[Any]:
    """A take started and gathering, its wait's end at ``deadline`` on ``clock``."""
    taking = asyncio.create_task(source.take(100, 30.0))
    await eventually(lambda: clock.next_deadline() is not None, what="the take gathering on the clock")
    assert clock.next_deadline() == pytest.approx(deadline)
    return taking


async def test_a_batch_waits_for_the_connections_the_last_commit_answered_at_most_the_gap_after_the_last_request(
) -> None:
    clock = VirtualClock(1_000.0)
    source, clients = await gathering(clock, 3)  # the last commit answered all three
    try:
        clients.post(0)
        await eventually(lambda: source.unread_records() == 1, what="the first connection's request queued")
        async with asyncio.timeout(10):
            taking = await take_on_the_clock(source, clock, 1_000.0 + GATHER_GAP)
            await clock.advance(GATHER_GAP / 2)
            clients.post(1)  # the gap counts again from this request
            await eventually(lambda: source.unread_records() == 2, what="the second connection's request queued")
            await clock.advance(GATHER_GAP / 2)
            assert not taking.done()
            await eventually(lambda: clock.next_deadline() == pytest.approx(1_000.0 + 1.5 * GATHER_GAP),
                             what="the gather's wait moved past the second request")
            await clock.advance(GATHER_GAP / 2)
            records = await taking
        assert [r.row["id"] for r in records or []] == [3, 4]
    finally:
        await clients.close()
        await source.close()


async def test_a_batch_gathers_at_most_the_gathering_time_while_requests_keep_arriving() -> None:
    clock = VirtualClock(1_000.0)
    source, clients = await gathering(clock, 1)
    arrivals = int(GATHER_SECONDS / (GATHER_GAP / 2)) + 2
    try:
        clients.connections += [await asyncio.open_connection("127.0.0.1", clients.port) for _ in range(arrivals)]
        taking = asyncio.create_task(source.take(100, 30.0))
        async with asyncio.timeout(10):
            for index in range(1, arrivals + 1):  # new connections, each one request: none the commit answered
                clients.post(index)
                await eventually(lambda index=index: source.unread_records() == index, what="the request queued")
                if taking.done():
                    break
                await clock.advance(GATHER_GAP / 2)
            records = await taking
        assert clock.monotonic() == pytest.approx(1_000.0 + GATHER_SECONDS)
        # every request that came before the time was up (one each GATHER_GAP / 2 from the first on)
        assert [r.row["id"] for r in records or []] == list(range(1, int(GATHER_SECONDS / (GATHER_GAP / 2)) + 1))
    finally:
        await clients.close()
        await source.close()


async def test_open_connections_the_last_commit_did_not_answer_keep_no_batch_waiting() -> None:
    """A balancer's idle keep-alive connections: the one client sending is committed at once."""
    clock = VirtualClock(1_000.0)
    source, clients = await gathering(clock, 3)
    try:
        async with asyncio.timeout(10):
            clients.post(0)
            await eventually(lambda: source.unread_records() == 1, what="the request queued")
            taking = await take_on_the_clock(source, clock, 1_000.0 + GATHER_GAP)  # the others were answered
            await clock.advance(GATHER_GAP)
            assert [r.row["id"] for r in await taking or []] == [3]
            source.committed()
            assert (await clients.answer(0)).startswith(b"HTTP/1.1 200 ")
            clients.post(0)  # the last commit answered this connection alone: nothing else to wait for
            await eventually(lambda: source.unread_records() == 1, what="the request queued again")
            records = await source.take(100, 30.0)
        assert [r.row["id"] for r in records or []] == [4]
        assert clock.monotonic() == 1_000.0 + GATHER_GAP
    finally:
        await clients.close()
        await source.close()


async def test_the_source_says_where_it_listens(caplog: pytest.LogCaptureFixture) -> None:
    """The address actually bound (port 0: the one the system chose), so a user knows where to POST."""
    source = HttpSource("hooks", HttpSourceParameters(port=0, path="/in"), STREAM, Path("."))
    with caplog.at_level("INFO", logger="egress.connectors.sources.http"):
        await source.start(0, b"", until_caught_up=True)
    try:
        [said] = [record.getMessage() for record in caplog.records if "listening" in record.getMessage()]
        port = int(said.split("http://127.0.0.1:")[1].split("/")[0])
        assert said == f"http source 'hooks' listening on http://127.0.0.1:{port}/in (POST)"
        assert port > 0
    finally:
        await source.close()


async def post_until(session: aiohttp.ClientSession, url: str, event_id: int, wanted: int) -> tuple[bool, str]:
    """POST event ``event_id`` until it is answered ``wanted`` (True) or the other of 200 / 429
    (False); a refused connection (no worker listens yet) is tried again. Returns its payload too."""
    payload = f"event {event_id}"
    while True:
        try:
            async with session.post(url, data=orjson.dumps({"id": event_id, "payload": payload})) as response:
                assert response.status in (200, 429), await response.text()
                if response.status == wanted:
                    return True, payload
                if wanted == 200:  # retrying a 429: the client's Retry-After, shortened
                    await asyncio.sleep(0.05)
                    continue
                return False, payload
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)


def reader_alone(prefixes: list[str]) -> list[str]:
    """Worker ids (``PREFIX-n``) under which the assignment gives the source reader's worker (the
    first) no partition of the computation: both partitions run in the others (with three workers,
    as the assignment balances each computation's partitions: two of them get one each)."""
    units = [Unit.source("input"), Unit.computation("deliver", 0), Unit.computation("deliver", 1)]
    for number in range(1000):
        names = [f"{prefix}-{number}" for prefix in prefixes]
        owners = assign(units, names)
        reader = owners[Unit.source("input")]
        if all(owner != reader for unit, owner in owners.items() if unit.name == "deliver"):
            return [reader, *(name for name in names if name != reader)]
    raise AssertionError("no such worker ids")


async def test_in_a_cluster_the_429_counts_the_partitions_another_worker_runs(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str) -> None:
    receiver = StallingReceiver()
    port = free_port()
    pipeline = f"http_{hashlib.blake2b(str(tmp_path).encode(), digest_size=6).hexdigest()}"
    spec = pass_through_spec(tmp_path / "spec.yaml", pipeline,
                             {"source_class_name": "http", "parameters": {"port": port, "max_backlog": 4}},
                             f"{await serve_app(receiver.app)}/events")
    # Jobs stop reading at 2 unacknowledged: what a stalled endpoint holds in another worker is
    # not known here, but the log it leaves unread then grows, and that is counted.
    options = RunOptions(max_unacknowledged=2, lease_ttl=2.0, heartbeat_period=0.5, remote_poll_period=0.2,
                         drained_check_period=0.2)
    names = reader_alone(["worker-a", "worker-b", "worker-c"])
    workers = [Pipeline(load_plan(spec), tmp_path / f"state-{name}", options=options,
                        engine_factory=nats_engine_factory([nats_server]), worker_id=name) for name in names]
    runs = [asyncio.create_task(worker.run()) for worker in workers]
    url = f"http://127.0.0.1:{port}/events"
    accepted: list[str] = []
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(30):
            # Settled: the reader's worker runs no partition of "deliver", the others both.
            await eventually(lambda: len(workers[0].readers) == 1 and not workers[0].jobs
                             and sum(len(worker.jobs) for worker in workers[1:]) == 2,
                             what="the reader's worker runs no partition, the others both", interval=0.05)
            while True:
                refused, payload = await post_until(session, url, len(accepted), 429)
                if refused:
                    break
                accepted.append(payload)
            assert len(accepted) >= 4
            receiver.recover()
            accepted.append((await post_until(session, url, len(accepted), 200))[1])
            await eventually(lambda: receiver.delivered >= set(accepted), what="every accepted event delivered")
    finally:
        receiver.recover()
        for worker in workers:
            worker.request_stop()
        results = await asyncio.gather(*runs)
    assert all(result.ok for result in results), results


# -- bodies as real clients send them -------------------------------------------------------------

def recording() -> StallingReceiver:
    """An endpoint answering 200 at once and recording the payloads delivered to it."""
    receiver = StallingReceiver()
    receiver.recover()
    return receiver


def events(first: int, count: int) -> tuple[bytes, list[str]]:
    """A JSONL body of ``count`` events, ids from ``first``, and their payloads."""
    payloads = [f"event {number}" for number in range(first, first + count)]
    body = b"".join(orjson.dumps({"id": first + n, "payload": p}) + b"\n" for n, p in enumerate(payloads))
    return body, payloads


async def assert_committed_and_delivered(running: Running, receiver: StallingReceiver, payloads: list[str]) -> None:
    """Exactly ``payloads`` were appended to the log (counted by the source) and all reached the endpoint."""
    assert running.pipeline.metrics.total("egress_source_rows_total") == len(payloads)
    await eventually(lambda: receiver.delivered >= set(payloads), what="every committed payload delivered")
    assert receiver.delivered == set(payloads)


def accepted(answer: raw_http.Answer) -> tuple[int, Any]:
    return answer.status, orjson.loads(answer.body)


async def test_a_body_arriving_in_two_writes_within_its_content_length_is_read_whole(run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, payloads = events(1, 2)
    request = raw_http.with_length("/events", body)
    split = len(request) - len(body) // 2  # the second write: the second half of the body
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [request[:split], request[split:]], 0.3)
    assert accepted(answer) == (200, {"accepted": 2})
    await assert_committed_and_delivered(running, receiver, payloads)


async def test_a_chunked_body_arriving_in_two_chunks_is_read_whole(run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, payloads = events(1, 2)
    first, second = body.splitlines(keepends=True)
    pieces = [raw_http.chunked_head("/events") + raw_http.chunk(first), raw_http.chunk(second) + raw_http.chunk(b"")]
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, pieces, 0.3)
    assert accepted(answer) == (200, {"accepted": 2})
    await assert_committed_and_delivered(running, receiver, payloads)


def post_with_urllib(url: str, body: bytes) -> tuple[int, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(urllib.request.Request(url, data=body, method="POST"), timeout=raw_http.ANSWER_TIMEOUT) \
                as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


async def test_a_urllib_post_of_15000_lines_is_accepted_whole(run_http: Any) -> None:
    running = await run_http(Receiver(), format="jsonl")
    body, _ = events(0, 15_000)
    assert 500_000 < len(body) < HttpSourceParameters(port=0).max_body_bytes
    assert await asyncio.to_thread(post_with_urllib, running.url, body) == (200, {"accepted": 15_000})
    assert running.pipeline.metrics.total("egress_source_rows_total") == 15_000


async def test_a_chunked_body_growing_over_max_body_bytes_is_413_and_nothing_is_accepted(run_http: Any) -> None:
    running = await run_http(Receiver(), format="jsonl")
    block = b'{"id": 1, "payload": "x"}\n' * 2_500  # 65,000 bytes of valid lines
    blocks = [*(raw_http.chunk(block) for _ in range(50 * 1024 * 1024 // len(block))), raw_http.chunk(b"")]  # 50 MiB
    answer = await asyncio.to_thread(raw_http.refused_while_sending, running.port, raw_http.chunked_head("/events"),
                                     blocks)
    assert answer.status == 413
    assert "over 1,048,576 bytes (max_body_bytes)" in orjson.loads(answer.body)["error"]
    assert answer.headers["connection"] == "close"
    assert running.pipeline.metrics.total("egress_source_rows_total") == 0


async def test_a_declared_content_length_over_max_body_bytes_is_413_before_any_byte_of_the_body(
        run_http: Any) -> None:
    running = await run_http(Receiver(), format="jsonl")
    head = raw_http.head("/events", [("Content-Length", str(50 * 1024 * 1024))])
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [head])  # no body follows
    assert answer.status == 413


@pytest.mark.parametrize(("stalled", "awaited"), [
    ("mid-body", "the body"),
    ("after the request line", "the request's headers"),  # a head never ended (slowloris)
    ("before the last chunk", "the body"),  # aiohttp's to read: chunked
])
async def test_a_client_stalling_mid_request_gets_408_after_body_timeout_and_nothing_is_accepted(
        run_http: Any, stalled: str, awaited: str) -> None:
    """The client keeps its writing side open (no FIN): what is missing may still come, so the
    request waits ``body_timeout``, then 408."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl", body_timeout=0.5)
    body, _ = events(1, 2)
    request = raw_http.with_length("/events", body)
    sent = {"mid-body": request[:len(request) - len(body) // 2],
            "after the request line": request[:request.index(b"\r\n") + 2],
            "before the last chunk": raw_http.chunked_head("/events") + raw_http.chunk(body)}[stalled]
    started = time.monotonic()
    with raw_http.connect(running.port) as connection:
        connection.sendall(sent)  # then nothing more
        answer = await asyncio.to_thread(raw_http.read_answer, connection)
        await asyncio.to_thread(raw_http.wait_closed, connection)  # at once: the rest is not coming
    assert time.monotonic() - started >= 0.5
    assert answer.status == 408
    assert orjson.loads(answer.body)["error"] == f"{awaited} did not arrive whole within 0.5 s (body_timeout)"
    assert answer.headers["connection"] == "close"
    # Nothing of the stalled request was appended: the next whole body is the only event.
    whole, payloads = events(3, 1)
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [raw_http.with_length("/events", whole)])
    assert accepted(answer) == (200, {"accepted": 1})
    await assert_committed_and_delivered(running, receiver, payloads)


async def test_a_body_written_in_pieces_split_anywhere_has_every_line_accepted_once(run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    sent: list[str] = []

    @fuzz(25)
    @given(count=st.integers(1, 8), chunked=st.booleans(), data=st.data())
    def post_split(count: int, chunked: bool, data: st.DataObject) -> None:
        body, payloads = events(1_000_000 + len(sent), count)  # ids of one width: the same draws every run
        if chunked:  # chunk boundaries and write boundaries chosen apart
            cuts = sorted(data.draw(st.sets(st.integers(1, len(body) - 1), max_size=4), label="chunks"))
            parts = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True)]
            request = raw_http.chunked_head("/events") + b"".join(map(raw_http.chunk, [*parts, b""]))
        else:
            request = raw_http.with_length("/events", body)
        cuts = sorted(data.draw(st.sets(st.integers(1, len(request) - 1), max_size=4), label="writes"))
        pieces = [request[start:end] for start, end in zip([0, *cuts], [*cuts, len(request)], strict=True)]
        answer = raw_http.send_in_pieces(running.port, pieces, 0.01)
        assert accepted(answer) == (200, {"accepted": count})
        sent.extend(payloads)

    await asyncio.to_thread(post_split)
    await assert_committed_and_delivered(running, receiver, sent)


# -- one connection, several requests (the lean path and its hand-over to aiohttp) ------------------

def read_answers(port: int, data: bytes, count: int) -> list[raw_http.Answer]:
    """Write ``data`` (several requests) at once on one connection, then read ``count`` answers from
    one buffered reader (answers arriving in one segment are read one after another; each framed by
    its ``Content-Length``, as the source frames every answer)."""
    with raw_http.connect(port) as connection, connection.makefile("rb") as stream:
        connection.sendall(data)
        answers = []
        for _ in range(count):
            status = int(stream.readline().split()[1])
            headers = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            answers.append(raw_http.Answer(status, headers, stream.read(int(headers["content-length"]))))
        return answers


async def test_pipelined_requests_on_one_connection_are_answered_in_order_each_once_committed(
        run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    bodies = [events(10 * n, n + 1) for n in range(4)]
    data = b"".join(raw_http.with_length("/events", body) for body, _ in bodies)
    answers = await asyncio.to_thread(read_answers, running.port, data, len(bodies))
    assert [accepted(answer) for answer in answers] == [(200, {"accepted": n + 1}) for n in range(4)]
    await assert_committed_and_delivered(running, receiver, [p for _, payloads in bodies for p in payloads])


async def test_a_connection_turning_to_a_chunked_request_is_served_on_by_aiohttp_with_nothing_lost(
        run_http: Any) -> None:
    """A plain request, then one the lean path does not take (chunked), then plain ones again: the
    connection is handed over with the bytes it had, every answer in order, every event once."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    (first, p1), (second, p2), (third, p3) = events(1, 2), events(5, 3), events(9, 1)
    data = (raw_http.with_length("/events", first)
            + raw_http.chunked_head("/events") + raw_http.chunk(second) + raw_http.chunk(b"")
            + raw_http.with_length("/events", third))
    answers = await asyncio.to_thread(read_answers, running.port, data, 3)
    assert [accepted(answer) for answer in answers] == [(200, {"accepted": 2}), (200, {"accepted": 3}),
                                                        (200, {"accepted": 1})]
    await assert_committed_and_delivered(running, receiver, p1 + p2 + p3)


async def test_a_key_posted_twice_on_one_connection_is_one_event_and_a_duplicate_answer(run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, payloads = events(1, 1)
    request = raw_http.with_length("/events", body, [("Idempotency-Key", "k-1")])
    answers = await asyncio.to_thread(read_answers, running.port, request + request, 2)
    assert [accepted(answer) for answer in answers] == [(200, {"accepted": 1}),
                                                        (200, {"accepted": 0, "duplicate": True})]
    await assert_committed_and_delivered(running, receiver, payloads)


async def assert_refused_with_400_then_a_plain_request_accepted(running: Any, receiver: Any, request: bytes) -> None:
    """``request`` (sent in pieces) is answered 400 and accepts nothing; then a plain request on a
    new connection is accepted, committed and delivered as usual."""
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [request])
    assert answer.status == 400
    good, payloads = events(7, 2)
    answer = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [raw_http.with_length("/events", good)])
    assert accepted(answer) == (200, {"accepted": 2})
    await assert_committed_and_delivered(running, receiver, payloads)


async def start_refused(parameters: HttpSourceParameters, base_dir: Path = Path(".")) -> str:
    """The message of the ``HttpSourceError`` the start of an http source ``hooks`` with ``parameters`` raises."""
    source = HttpSource("hooks", parameters, STREAM, base_dir)
    with pytest.raises(HttpSourceError) as raised:
        await source.start(0, b"", until_caught_up=False)
    return str(raised.value)


@pytest.mark.parametrize("bad", [b"Content-Length : 9", b" X-Folded: a", b"X-Trailing-Blank\t: a", b": no name",
                                 b"no colon at all", b"X-Bare-LF: a\nTransfer-Encoding: chunked",
                                 b"X-Bare-CR: a\rTransfer-Encoding: chunked", b"X(Paren: a", b"X\x80Byte: a"])
async def test_a_malformed_header_line_goes_to_aiohttp_which_answers_400_and_nothing_is_accepted(
        run_http: Any, bad: bytes) -> None:
    """The lean path hands a header line it would not read as aiohttp does (a blank before the
    colon, an obsolete fold, no name, no colon, a bare LF or CR hiding a header from a reader that
    splits lines at CRLF only) to aiohttp, whose answer is a 400; then a plain
    request on a new connection is accepted as usual."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, _ = events(1, 1)
    head = raw_http.with_length("/events", body).split(b"\r\n\r\n", 1)[0]
    request = head.replace(b"\r\nHost:", b"\r\n" + bad + b"\r\nHost:", 1) + b"\r\n\r\n" + body
    await assert_refused_with_400_then_a_plain_request_accepted(running, receiver, request)


async def test_header_names_in_any_case_and_values_padded_with_blanks_are_read_as_aiohttp_reads_them(
        run_http: Any) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, payloads = events(1, 1)
    request = (b"POST /events HTTP/1.1\r\nHOST: 127.0.0.1\r\ncontent-LENGTH: \t%d \r\nIdempotency-KEY:  k-1\t\r\n"
               b"CONNECTION: Keep-Alive\r\n\r\n" % len(body)) + body
    first = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [request])
    again = await asyncio.to_thread(raw_http.send_in_pieces, running.port, [request])
    assert accepted(first) == (200, {"accepted": 1})
    assert accepted(again) == (200, {"accepted": 0, "duplicate": True})  # the key read without its blanks
    await assert_committed_and_delivered(running, receiver, payloads)


async def test_a_port_in_use_stops_the_start_naming_the_parameter_and_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = await start_refused(HttpSourceParameters(port=port))
    assert message == (f"http source 'hooks': cannot listen on 127.0.0.1:{port} (address "
                                 "already in use): stop what listens there or change sources/hooks/parameters/port "
                                 "(0 picks a free one)")


async def test_a_request_whose_lines_end_in_bare_lfs_is_answered_400_by_aiohttp_not_held(run_http: Any) -> None:
    """A head of bare-LF lines never holds the CRLF CRLF the lean path looks for: it goes to aiohttp,
    which refuses it (400), instead of waiting for bytes that are not coming; nothing is accepted."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, _ = events(1, 1)
    request = raw_http.with_length("/events", body).replace(b"\r\n", b"\n")
    await assert_refused_with_400_then_a_plain_request_accepted(running, receiver, request)


def seconds_until_closed(connection: socket.socket, since: float) -> float:
    """Wait for the server to close ``connection`` (nothing sent meanwhile); the seconds from ``since``
    (``time.monotonic()`` taken before the client's last write or its connect: the server's idle time
    starts after it, so these seconds are at least that idle time, whatever the delays between)."""
    raw_http.wait_closed(connection)
    return time.monotonic() - since


def kept_busy_then_idle(port: int, busy_for: float, every: float) -> tuple[list[int], float]:
    """On one connection, a plain request every ``every`` seconds until ``busy_for`` seconds have
    passed since it opened: their statuses, then the seconds it stayed open from the last request's write."""
    with raw_http.connect(port) as connection:
        opened, statuses = time.monotonic(), []
        while True:
            body, _ = events(100 + len(statuses), 1)
            sent = time.monotonic()
            connection.sendall(raw_http.with_length("/events", body))
            statuses.append(raw_http.read_answer(connection).status)
            if time.monotonic() - opened >= busy_for:
                return statuses, seconds_until_closed(connection, sent)
            time.sleep(every)  # well within the idle timeout: a client keeping its connection busy


def handed_over_then_idle(port: int) -> tuple[int, float]:
    """A request aiohttp answers (GET: 405) on one connection, then the seconds it stayed open."""
    with raw_http.connect(port) as connection:
        sent = time.monotonic()
        connection.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status = raw_http.read_answer(connection).status
        return status, seconds_until_closed(connection, sent)


async def test_a_connection_idle_for_keepalive_timeout_is_closed_on_either_path_and_a_busy_one_stays_open(
        run_http: Any) -> None:
    running = await run_http(recording(), format="jsonl", keepalive_timeout=2.0)

    def never_sends() -> float:
        connecting = time.monotonic()
        with raw_http.connect(running.port) as connection:
            return seconds_until_closed(connection, connecting)

    silent, busy, handed_over = await asyncio.gather(
        asyncio.to_thread(never_sends),
        asyncio.to_thread(kept_busy_then_idle, running.port, 5.0, 0.2),
        asyncio.to_thread(handed_over_then_idle, running.port))
    assert silent >= 2.0  # a connection never used is closed once idle too
    statuses, after_last = busy
    assert len(statuses) > 5  # open past 2 s while each request came within it
    assert set(statuses) == {200}
    assert after_last >= 2.0
    status, after_answer = handed_over
    assert status == 405
    assert after_answer >= 2.0  # aiohttp's connections: the same timeout


CUT_AT_THE_FIN = ("the body did not arrive whole: the client ended its side of the connection first "
                  "(nothing of the request is accepted)")
"""The error of the 400 to a body incomplete at the client's FIN, on either path."""


def half_closed(port: int, request: bytes) -> raw_http.Answer:
    """Write ``request``, end the writing side (FIN), then read the answer and the server's close."""
    with raw_http.connect(port) as connection:
        connection.sendall(request)
        connection.shutdown(socket.SHUT_WR)
        answer = raw_http.read_answer(connection)
        raw_http.wait_closed(connection)
        return answer


async def test_a_client_that_half_closes_after_its_request_gets_its_200_once_committed(run_http: Any) -> None:
    """A FIN after a whole request ends the requests, not the connection: the events are accepted,
    so the client is told (not left to send them again), then the connection closes."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    body, payloads = events(1, 2)
    answer = await asyncio.to_thread(half_closed, running.port, raw_http.with_length("/events", body))
    assert accepted(answer) == (200, {"accepted": 2})
    await assert_committed_and_delivered(running, receiver, payloads)


def half_closed_after(port: int, pieces: list[bytes], count: int) -> tuple[list[raw_http.Answer], bool]:
    """Write ``pieces`` one after another on one connection (each its own segment), end the writing
    side (FIN), then read up to ``count`` answers: those read, and whether the server then closed
    the connection with nothing more sent."""
    with raw_http.connect(port) as connection, connection.makefile("rb") as stream:
        for piece in pieces:
            connection.sendall(piece)
        connection.shutdown(socket.SHUT_WR)
        answers = []
        while len(answers) < count and (line := stream.readline()):
            headers = {}
            while (header := stream.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            answers.append(raw_http.Answer(int(line.split()[1]), headers,
                                           stream.read(int(headers["content-length"]))))
        return answers, stream.read() == b""


async def test_a_client_that_half_closes_after_two_pipelined_requests_gets_both_answered_then_the_close(
        run_http: Any) -> None:
    """The FIN ends the client's requests, not those it sent before it: the second request, whole
    before the FIN, is accepted and answered 200 once committed, as the first, then the close."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    (first, p1), (second, p2) = events(1, 2), events(5, 3)
    data = raw_http.with_length("/events", first) + raw_http.with_length("/events", second)
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, [data], 2)
    assert [accepted(answer) for answer in answers] == [(200, {"accepted": 2}), (200, {"accepted": 3})]
    assert closed
    await assert_committed_and_delivered(running, receiver, p1 + p2)


async def test_a_half_close_after_a_body_sent_in_pieces_gets_its_200_and_one_mid_body_gets_400(
        run_http: Any) -> None:
    """A body whole when the FIN comes, however many pieces it came in, is accepted; a FIN before its
    last piece makes it incomplete (RFC 9112 section 8): 400, nothing of it accepted, the close."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    (whole, payloads), (cut, _) = events(1, 3), events(20, 3)
    request = raw_http.with_length("/events", whole)
    third = len(whole) // 3
    pieces = [request[:-2 * third], request[-2 * third:-third], request[-third:]]
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, pieces, 1)
    assert [accepted(answer) for answer in answers] == [(200, {"accepted": 3})]
    assert closed
    request = raw_http.with_length("/events", cut)
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, [request[:-10], request[-10:-5]], 1)
    assert [answer.status for answer in answers] == [400]
    assert orjson.loads(answers[0].body)["error"] == CUT_AT_THE_FIN  # as aiohttp's path words it
    assert answers[0].headers["connection"] == "close"
    assert closed
    await assert_committed_and_delivered(running, receiver, payloads)


@pytest.mark.parametrize("cut", ["mid-body", "mid-head"])
async def test_a_pipelined_request_incomplete_at_the_half_close_gets_400_after_the_first_gets_200(
        run_http: Any, cut: str) -> None:
    receiver = recording()
    running = await run_http(receiver, format="jsonl")
    (first, p1), (second, _) = events(1, 2), events(5, 3)
    incomplete = raw_http.with_length("/events", second)
    incomplete = incomplete[:-5] if cut == "mid-body" else incomplete[:len(incomplete) - len(second) - 3]
    data = raw_http.with_length("/events", first) + incomplete
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, [data], 2)
    assert [answer.status for answer in answers] == [200, 400]
    assert accepted(answers[0]) == (200, {"accepted": 2})
    assert closed
    await assert_committed_and_delivered(running, receiver, p1)


@pytest.mark.parametrize("shape", ["chunked", "plain, chunked", "chunked, plain", "refused, plain", "refused"])
async def test_requests_served_by_aiohttp_are_answered_after_the_half_close(run_http: Any, shape: str) -> None:
    """Requests the lean path hands over to aiohttp (a chunked body; a refused one, 400), before and
    after its own, all whole before the FIN, sent at once with it: each is answered, in order, each
    200 once committed; aiohttp, not told of the FIN (its own protocol closes at it, the answers
    lost), closes the connection once idle for ``keepalive_timeout``."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl", keepalive_timeout=1.0)
    (plain, p1), (body, p2) = events(1, 2), events(5, 3)
    parts = {"plain": (raw_http.with_length("/events", plain), (200, {"accepted": 2}), p1),
             "chunked": (raw_http.chunked_head("/events") + raw_http.chunk(body) + raw_http.chunk(b""),
                         (200, {"accepted": 3}), p2),
             "refused": (raw_http.with_length("/events", b"not json\n"), 400, [])}
    sent = [parts[name] for name in shape.split(", ")]
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, [b"".join(s[0] for s in sent)],
                                              len(sent))
    assert [accepted(answer) if answer.status == 200 else answer.status for answer in answers] == [
        s[1] for s in sent]
    assert closed
    await assert_committed_and_delivered(running, receiver, [p for s in sent for p in s[2]])


def chunked_in_pieces(body: bytes, cut: str) -> list[bytes]:
    """A chunked request of ``body`` in two chunks, each its own write, cut as ``cut`` says: ``whole``
    (the last chunk and the end, written apart), ``before the last chunk`` (two chunks, no zero-length
    one), ``mid-chunk`` (the second chunk's size line and half its data), ``before the end`` (the last
    chunk's size line without the CRLF that ends the message)."""
    half = len(body) // 2
    pieces = [raw_http.chunked_head("/events") + raw_http.chunk(body[:half]), raw_http.chunk(body[half:])]
    return {"whole": [*pieces, raw_http.chunk(b"")],
            "before the last chunk": pieces,
            "mid-chunk": [pieces[0], pieces[1][:len(pieces[1]) // 2]],
            "before the end": [*pieces, b"0\r\n"]}[cut]


@pytest.mark.parametrize("cut", ["before the last chunk", "mid-chunk", "before the end", "whole"])
async def test_a_chunked_body_cut_short_by_the_half_close_gets_400_at_once_and_a_whole_one_200(
        run_http: Any, cut: str) -> None:
    """aiohttp serves a chunked request (the lean path hands it over); a FIN before its end makes it
    incomplete (RFC 9112 section 8): 400 at the FIN, nothing of it accepted, the close, not a 408
    once ``body_timeout`` has passed (an hour here: the test's read gives up long before). A body
    whole at the FIN, its last chunk written on its own, is accepted and answered 200 (then aiohttp
    closes the connection once idle for ``keepalive_timeout``)."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl", body_timeout=3600, keepalive_timeout=1.0)
    body, payloads = events(1, 4)
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, chunked_in_pieces(body, cut), 1)
    assert closed
    if cut == "whole":
        assert [accepted(answer) for answer in answers] == [(200, {"accepted": 4})]
        await assert_committed_and_delivered(running, receiver, payloads)
        return
    assert [answer.status for answer in answers] == [400]
    assert orjson.loads(answers[0].body)["error"] == CUT_AT_THE_FIN
    assert answers[0].headers["connection"] == "close"
    await assert_committed_and_delivered(running, receiver, [])


@pytest.mark.parametrize("shape", ["chunked, cut plain", "plain, cut chunked", "chunked, cut chunked"])
async def test_a_request_cut_short_by_the_half_close_after_one_served_by_aiohttp_gets_400_after_its_200(
        run_http: Any, shape: str) -> None:
    """On a connection aiohttp serves, a request incomplete at the FIN (a body short of its
    ``Content-Length``, or a chunked one without its last chunk), sent at once with a whole request
    before it, is answered 400 at once after that request's 200, whether the FIN came before aiohttp
    had the connection (behind a plain request the lean path answers) or after."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl", body_timeout=3600)
    (first, p1), (second, _) = events(1, 2), events(5, 3)
    whole = {"chunked": raw_http.chunked_head("/events") + raw_http.chunk(first) + raw_http.chunk(b""),
             "plain": raw_http.with_length("/events", first)}
    cut = {"plain": raw_http.with_length("/events", second)[:-5],
           "chunked": raw_http.chunked_head("/events") + raw_http.chunk(second)}
    before, after = shape.split(", cut ")
    answers, closed = await asyncio.to_thread(half_closed_after, running.port, [whole[before] + cut[after]], 2)
    assert [answer.status for answer in answers] == [200, 400]
    assert accepted(answers[0]) == (200, {"accepted": 2})
    assert orjson.loads(answers[1].body)["error"] == CUT_AT_THE_FIN
    assert closed
    await assert_committed_and_delivered(running, receiver, p1)


def continued_then_half_closed(port: int, head: bytes, body: bytes) -> tuple[bytes, raw_http.Answer]:
    """Write ``head`` (with ``Expect: 100-continue``), read the interim answer's status line, write
    ``body``, end the writing side (FIN): that status line and the answer, once the server closed."""
    with raw_http.connect(port) as connection, connection.makefile("rb") as stream:
        connection.sendall(head)
        interim = stream.readline()
        assert stream.readline() == b"\r\n"
        connection.sendall(body)
        connection.shutdown(socket.SHUT_WR)
        status = int(stream.readline().split()[1])
        headers = {}
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        answer = raw_http.Answer(status, headers, stream.read(int(headers["content-length"])))
        assert stream.read() == b"", "the server sent more after its answer"
        return interim.rstrip(), answer


async def test_a_body_after_100_continue_cut_short_by_the_half_close_gets_400_at_once(run_http: Any) -> None:
    """``Expect: 100-continue`` (curl sends it for a body over 1 KiB) is aiohttp's to answer; the body
    that follows, short of its ``Content-Length`` at the FIN, is answered 400 then, not 408 at
    ``body_timeout`` (an hour), and nothing of it is accepted."""
    receiver = recording()
    running = await run_http(receiver, format="jsonl", body_timeout=3600)
    body, _ = events(1, 3)
    head = raw_http.head("/events", [("Expect", "100-continue"), ("Content-Length", str(len(body)))])
    interim, answer = await asyncio.to_thread(continued_then_half_closed, running.port, head, body[:-5])
    assert interim == b"HTTP/1.1 100 Continue"
    assert answer.status == 400
    assert orjson.loads(answer.body)["error"] == CUT_AT_THE_FIN
    await assert_committed_and_delivered(running, receiver, [])


async def test_a_token_file_that_cannot_be_read_stops_the_start_naming_the_parameter_and_the_file(
        tmp_path: Path) -> None:
    message = await start_refused(HttpSourceParameters(port=free_port(), bearer_token_file="absent.txt"), tmp_path)
    assert message == (f"http source 'hooks': parameters/bearer_token_file: file {tmp_path / 'absent.txt'} "
                                 "cannot be read (No such file or directory): write the token there or name "
                                 "another file")


async def test_a_token_file_is_read_from_the_specs_folder_without_its_surrounding_whitespace(tmp_path: Path) -> None:
    (tmp_path / "token.txt").write_text("  hook-token-1234\n")
    port = free_port()
    source = HttpSource("hooks", HttpSourceParameters(port=port, bearer_token_file="token.txt"), STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=False)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/events"
            async with session.post(url, data=b'{"id": 1}', headers={"Authorization": "Bearer wrong"}) as refused:
                assert refused.status == 401
            accepted = asyncio.create_task(session.post(url, data=b'{"id": 2}',
                                                        headers={"Authorization": "Bearer hook-token-1234"}))
            records = await source.take(10, 5.0)
            assert records is not None
            assert [r.row["id"] for r in records] == [2]
            source.committed()
            async with await accepted as response:
                assert response.status == 200
    finally:
        await source.close()


async def test_a_host_not_of_this_machine_stops_the_start_naming_the_host_parameter() -> None:
    message = await start_refused(HttpSourceParameters(host="192.0.2.1", port=free_port()))
    assert message.endswith("(cannot assign requested address): change sources/hooks/parameters/host to "
                                      "an address of this machine (127.0.0.1: this machine only)")


def continued(connection: socket.socket, head: bytes) -> bytes:
    """Write ``head`` (with ``Expect: 100-continue``) and read the interim answer's status line:
    once it is there, the request's handler runs and waits for the body."""
    connection.sendall(head)
    with connection.makefile("rb") as stream:
        interim = stream.readline()
        assert stream.readline() == b"\r\n"
    return interim.rstrip()


async def test_a_stop_is_not_held_by_a_client_stalled_mid_body_on_aiohttps_path(run_http: Any) -> None:
    """A handler waiting for a body that does not come (``body_timeout``: an hour) is given up
    ``STOP_GRACE`` seconds into the stop, not aiohttp's default minute, and nothing of it is accepted."""
    running = await run_http(recording(), format="jsonl", body_timeout=3600)
    head = raw_http.chunked_head("/events", [("Expect", "100-continue")])
    with raw_http.connect(running.port) as connection:
        assert await asyncio.to_thread(continued, connection, head) == b"HTTP/1.1 100 Continue"
        started = time.monotonic()
        await running.stop()
        assert time.monotonic() - started < STOP_GRACE + 10, "the stop waited for the stalled body"
    assert running.pipeline.metrics.total("egress_source_rows_total") == 0
