"""The ``http`` source: ``egress run`` accepts events as HTTP POSTs (a webhook relay's input).

A POST to ``host:port`` + ``path`` carries one JSON object (``format: json``), JSON lines
(``jsonl``), or raw bytes into ``payload_column`` (``raw``). Its events are answered ``200`` only
after the epoch that appends them to the log has committed, so a ``200`` means durable: a crash
before it loses nothing a client was told was accepted, and the client, having no answer, sends
again. Other answers: ``400`` with the line and reason for bad JSON (nothing of the body is
accepted), ``401`` without the right bearer token when one is configured (``bearer_token_env`` or
``bearer_token_file``; compared in constant time), ``400`` for a request not whole when the
client ends its side of the connection (a FIN: nothing of it is accepted), ``408`` for a body not
whole within ``body_timeout`` seconds (the client still sending), ``413`` for a body declared or
grown over ``max_body_bytes`` (the body is read whole however it arrives:
:func:`egress.http_body.read_body`; nothing of a refused one is accepted, and its connection is
closed), ``429`` with ``Retry-After`` while the pipeline holds back (more than ``max_backlog``
events committed and not yet delivered downstream,
``egress.runtime.source_reader.downstream_backlog``) or more than ``max_pending_events`` wait for
their commit, ``503`` when the run stops before the events were committed.

Serving: a plain POST is parsed and answered from bytes (:mod:`egress.connectors.sources.http_fast`);
every other request, and every answer but a ``200``, is aiohttp's (the connection handed over).
Concurrent clients' requests are committed together: a batch waits up to :data:`GATHER_SECONDS` for
the next request of each connection the last commit answered, so a commit (its fixed CPU) serves
every client that is sending.

Several readers (``readers: N``): reader ``k`` listens on ``port + k`` under its own unit and lease,
so every worker of a cluster accepts behind a balancer; a keyed request is accepted only by its
key's home reader and sent on there from any other (:mod:`egress.connectors.sources.http_peers`),
so a key is a duplicate on every worker.

Position: the number of events accepted so far; an event's id is
``source_message_id(scope(pipeline, source id, path), k, position)`` for reader ``k`` (0 with one
reader); with several readers a keyed event's is ``source_message_id(scope, KEYED_PARTITION,
keyed_position(key, line))``, the same whichever reader commits it. A client may send
``Idempotency-Key``: a key already committed within ``idempotency_window`` (or being committed) is
answered ``200`` without a second event. The keys commit with the events (internal state
``source_keys`` of the reader, one entry per key, deleted once older than the window), so the
window holds across restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from egress.clock import Clock, RealClock, event_or_timeout
from egress.connectors.base import READERS_LIMIT, SOURCES, SourceRecord
from egress.connectors.sources.bad_records import BadRecordParameters, check_bad_record_parameters
from egress.connectors.sources.http_fast import IngestProtocol, at_fin, json_answer
from egress.connectors.sources.http_peers import FORWARDED, Peers, key_home
from egress.connectors.sources.live import CountedPosition, referenced_file_errors
from egress.connectors.sources.schema import json_row, parse_timestamp, record_error
from egress.errors import EgressError, SecretUnavailable, SourceDataError, SpecError
from egress.http_body import (
    DEFAULT_BODY_TIMEOUT,
    BodyTimeoutError,
    BodyTooLargeError,
    RequestBodyError,
    client_ended,
    closing,
    read_body,
)
from egress.http_expect import expect_handler, unrouted_handler
from egress.keys import decode_key, encode_key, key_in_partition
from egress.lazy import lazy_module
from egress.listen_errors import bind_failure
from egress.observe import tracing
from egress.secret_references import read_secret
from egress.spec import StreamSpec
from egress.spec.sizes import size_within

if TYPE_CHECKING:
    from aiohttp import web
else:
    web = lazy_module("aiohttp.web")  # imported when the source starts its server


MAX_BODY_BYTES = 1 << 30  # the largest body a source may accept: it is held in memory while it is read
GATHER_SECONDS = 0.02
"""How long :meth:`HttpSource.take` gathers at most, once a request is queued, for the next requests
of the connections the last commit answered (concurrent clients, each sending again once answered
``200``): one commit per batch has a fixed CPU cost (the engine's commit, the epochs of the jobs it
wakes), so a batch that takes every client back costs less per event than the two smaller ones the
clients would otherwise split into (those answered while the others were being committed). The
gather ends sooner once each of those connections has a request waiting again (a lone client at
once), or none arrived for :data:`GATHER_GAP`."""
STOP_GRACE = 2.0
"""Seconds a stop waits for the requests aiohttp is still handling (``AppRunner``'s
``shutdown_timeout``, a minute by default) before it cancels them: those committed or refused are
answered within it; one still waiting for a body that does not come (``body_timeout`` may be
minutes) is cut off, its connection closed, nothing of it accepted (its client sends again)."""
GATHER_GAP = 0.005
"""Seconds without a new request after which :meth:`HttpSource.take`'s gather ends: a connection the
last commit answered that does not send again (its client is done, or a balancer gave its next
request to another worker) keeps a batch waiting this long after the last arrival, not
:data:`GATHER_SECONDS`."""


KEEPALIVE_TIMEOUT = 75.0
"""Seconds an idle keep-alive connection stays open by default (aiohttp's ``run_app`` default; its
``AppRunner`` alone would keep one for 3630 s)."""


class HttpSourceError(EgressError):
    """The ``http`` source cannot listen or read its bearer token; raised when the source starts,
    naming the address or the reference and the fix."""


log = logging.getLogger(__name__)


class HttpSourceParameters(BadRecordParameters):
    """``host`` (default loopback), ``port``, ``path``; ``format`` (``json``: one object per POST,
    ``jsonl``: one per line, ``raw``: the body into ``payload_column``); ``max_body_bytes`` (bytes, or
    a size with a unit such as ``16MiB``; at most 1 GiB, held in memory while it is read);
    ``max_backlog`` (events committed and not yet delivered by the computations reading the stream,
    beyond which a POST is answered ``429``; ``None``: never); ``max_pending_events`` (more
    waiting for their commit: ``429``); ``retry_after`` (seconds, the
    ``429``'s ``Retry-After``); ``bearer_token_env`` or ``bearer_token_file`` (a token by reference);
    ``idempotency_window`` (seconds a committed ``Idempotency-Key`` is remembered; 0: not at all);
    ``body_timeout`` (seconds a body may take to arrive whole, from the end of its headers, and
    headers from their first byte; then ``408``); ``keepalive_timeout`` (seconds a connection with
    no request begun stays open: then it is closed, on either path; aiohttp's ``run_app``
    default); ``timestamp_column``; ``readers`` (1 to 1024):
    how many readers accept at once, reader ``k`` on ``port + k`` (units ``source:<id>`` partitions
    ``0 .. readers-1``, spread over a cluster's workers; see the module). ``on_bad_record`` is not
    used: a bad body is answered ``400``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)
    path: str = Field(default="/events", pattern=r"^/")
    format: Literal["json", "jsonl", "raw"] = "json"
    payload_column: str | None = None
    timestamp_column: str | None = None
    max_body_bytes: Annotated[int, size_within(1, MAX_BODY_BYTES)] = 1 << 20
    max_pending_events: int = Field(default=10_000, gt=0)
    max_backlog: int | None = Field(default=10_000, gt=0)
    retry_after: int = Field(default=1, ge=0)
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None
    idempotency_window: float = Field(default=300.0, ge=0)
    body_timeout: float = Field(default=DEFAULT_BODY_TIMEOUT, gt=0)
    keepalive_timeout: float = Field(default=KEEPALIVE_TIMEOUT, gt=0)
    readers: int = Field(default=1, ge=1, le=READERS_LIMIT)

    @property
    def reads(self) -> str:
        """What the source reads: its URL path (it scopes the message ids; host and port may change)."""
        return self.path


class _Waiter(Protocol):
    """Who waits for a request's commit: the aiohttp handler's future, or the lean path's connection
    (:class:`~egress.connectors.sources.http_fast.IngestProtocol`)."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


@dataclass(slots=True)
class _Request:
    rows: list[tuple[dict[str, Any], float | None]]
    key: str | None
    answered: _Waiter
    duplicates: list[asyncio.Future[None]] | None = None  # requests of the same key waiting for this one
    trace_context: str | None = None  # tracing on: its traceparent/tracestate (egress.observe.tracing)


@SOURCES.register("http", "NYT::NFlow::THttpSource")
class HttpSource(CountedPosition):
    """Accepts POSTed events (a :class:`~egress.connectors.base.LiveSource` that also keeps keyed
    state: the idempotency keys)."""

    parameters_model: ClassVar[type[BaseModel]] = HttpSourceParameters

    def __init__(self, source_id: str, parameters: HttpSourceParameters, stream: StreamSpec, base_dir: Path) -> None:
        self.source_id = source_id
        self.parameters = parameters
        self.stream = stream
        self._base_dir = base_dir
        self._columns = [c for c in stream.columns if c.name != parameters.payload_column]
        self._token: bytes | None = None
        self._queue: deque[_Request] = deque()
        self._queued_events = 0
        self._arrived = asyncio.Event()
        self._gathered = asyncio.Event()  # set when the gather may end (_gather)
        self._gathering = 0  # while a take gathers: its limit of events
        self._arrived_at = 0.0  # while a take gathers: when the last request arrived (monotonic)
        self._answered: set[object] = set()  # the lean-path connections the last commit answered
        self._awaited: set[object] = set()  # while a take gathers: those of them with no request waiting
        self._taken: list[_Request] = []
        self._keys: dict[str, float] = {}  # committed keys → accepted at (seconds since the epoch)
        self._pending_keys: dict[str, _Request] = {}
        self._key_writes: dict[bytes, bytes | None] = {}
        self._position = 0
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[IngestProtocol] = set()
        self._answers: dict[int, bytes] = {}  # events accepted → the 200 saying so
        self._until_caught_up = False
        self._backlog = 0  # committed events not yet delivered downstream, as the reader last said
        self._clock: Clock = RealClock()
        self._partition, self._readers = 0, 1
        self._peers: Peers | None = None  # with several readers: sends a keyed request to its key's home
        self._entries: dict[str, bytes] = {}  # key → its state entry's key, with several readers (:meth:`_key_entry`)

    @classmethod
    def reader_count(cls, parameters: HttpSourceParameters) -> int:
        """``readers`` (``egress.connectors.base.reader_count``)."""
        return parameters.readers

    def read_partition(self, index: int, count: int) -> None:
        """Be reader ``index`` of ``count``: listen on ``port + index``, number events in source
        partition ``index``, keep the keys this reader commits (``PartitionedSource``)."""
        self._partition, self._readers = index, count
        if count > 1:
            parameters = self.parameters
            self._peers = Peers(parameters.host, parameters.port, parameters.path, index, parameters.retry_after,
                                parameters.body_timeout + 30.0)

    def _elsewhere(self, key: str | None, forwarded: bool) -> int | None:
        """The home reader of ``key`` when it is another reader (``http_peers``), else ``None``."""
        if key is None or self._readers == 1 or forwarded:
            return None
        home = key_home(key, self._readers)
        return None if home == self._partition else home

    @property
    def port(self) -> int:
        """The port this reader listens on: ``port + k`` for reader ``k`` (``0``: any free one)."""
        return self.parameters.port + self._partition if self.parameters.port else 0

    @classmethod
    def check(cls, parameters: HttpSourceParameters, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        errors = check_bad_record_parameters(parameters, base_dir)
        if parameters.on_bad_record != "fail":
            errors.append(SpecError("the http source answers a bad body 400 (the client fixes it): on_bad_record "
                                    "does not apply", path="parameters/on_bad_record"))
        for name, column in (("payload_column", parameters.payload_column),
                             ("timestamp_column", parameters.timestamp_column)):
            if column is not None and stream.column(column) is None:
                errors.append(SpecError(f'column "{column}" is not in the output stream schema',
                                        path=f"parameters/{name}"))
        if parameters.format == "raw" and parameters.payload_column is None:
            errors.append(SpecError("format raw needs payload_column: the string column the body goes to",
                                    path="parameters/payload_column"))
        if parameters.bearer_token_env is not None and parameters.bearer_token_file is not None:
            errors.append(SpecError("give bearer_token_env or bearer_token_file, not both",
                                    path="parameters/bearer_token_file"))
        errors += referenced_file_errors(base_dir, "bearer_token_file", parameters.bearer_token_file)
        if parameters.readers > 1 and not parameters.port:
            errors.append(SpecError(f"readers {parameters.readers} listen on port + k each and send a keyed request "
                                    "to its key's reader there: give a port (not 0)", path="parameters/port"))
        if parameters.port and parameters.port + parameters.readers - 1 > 65535:
            errors.append(SpecError(f"readers {parameters.readers} listen on ports {parameters.port} to "
                                    f"{parameters.port + parameters.readers - 1}, past 65535: lower parameters/port",
                                    path="parameters/readers"))
        return errors

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> HttpSource:
        return cls(source_id, parameters, stream, base_dir)

    # -- LiveSource --------------------------------------------------------------------------

    def restore_keys(self, entries: dict[bytes, bytes]) -> None:
        """The committed idempotency keys (``source_keys`` state: key → accepted-at seconds; an entry's
        key is ``encode_key([key])``, or with several readers ``encode_key([key, salt])``, see
        :meth:`_key_entry`)."""
        self._keys = {str(decode_key(key)[0]): float(value) for key, value in entries.items()}
        self._entries = {str(decode_key(key)[0]): key for key in entries} if self._readers > 1 else {}

    def use_clock(self, clock: Clock) -> None:
        """The run's clock: the idle wait of :meth:`take` and the idempotency keys' times."""
        self._clock = clock

    def hold_back(self, backlog: int) -> None:
        """``backlog``: events committed and not yet delivered downstream (``HoldsBack``, from the
        reader before each batch): over ``max_backlog``, POSTs are answered ``429``."""
        self._backlog = backlog

    def take_key_writes(self) -> dict[bytes, bytes | None]:
        """The key state to commit with the batch just taken (new keys; expired ones deleted)."""
        writes, self._key_writes = self._key_writes, {}
        return writes

    async def start(self, position: int, source_state: bytes, until_caught_up: bool) -> None:
        """Listen on ``host:port``; with ``until_caught_up`` (``--until-drained``), :meth:`take`
        returns ``None`` whenever nothing is waiting. Raises :class:`HttpSourceError`."""
        parameters = self.parameters
        self._position = position
        self._until_caught_up = until_caught_up
        self._token = self._bearer_token()
        app = web.Application()
        app.router.add_post(parameters.path, self._receive, expect_handler=expect_handler)
        app.router.add_route("*", "/{tail:.*}", unrouted_handler({parameters.path: "POST"}),
                             expect_handler=expect_handler)  # no 500 for a non-UTF-8 Expect, on any path
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               keepalive_timeout=parameters.keepalive_timeout, shutdown_timeout=STOP_GRACE)
        await runner.setup()
        aiohttp_protocol = runner.server
        assert aiohttp_protocol is not None
        stopping = json_answer(503, "Service Unavailable",
                               {"error": "egress stopped before the events were committed: send again"},
                               f"Retry-After: {parameters.retry_after}", "Connection: close")

        def connection() -> IngestProtocol:
            protocol = IngestProtocol(self, aiohttp_protocol, parameters.path, parameters.max_body_bytes,
                                      parameters.body_timeout, stopping, parameters.keepalive_timeout)
            self._connections.add(protocol)
            return protocol

        try:
            self._server = await asyncio.get_running_loop().create_server(
                connection, parameters.host, self.port, reuse_address=True, backlog=1024)
        except OSError as error:
            await runner.cleanup()
            reader = f" (reader {self._partition}: port + {self._partition})" if self._readers > 1 else ""
            kind, reason = bind_failure(error)
            where = f"sources/{self.source_id}/parameters"
            fix = {"in use": f"stop what listens there or change {where}/port (0 picks a free one)",
                   "permission": f"change {where}/port to 1024 or above, or run with the right to bind it",
                   "address": f"change {where}/host to an address of this machine (127.0.0.1: this machine only)"}
            raise HttpSourceError(f"http source {self.source_id!r}: cannot listen on "
                                  f"{parameters.host}:{self.port}{reader} ({reason}): {fix[kind]}") from None
        self._runner = runner
        host, port = self._server.sockets[0].getsockname()[:2]
        log.info("http source %r listening on http://%s:%d%s (POST)", self.source_id, host, port, parameters.path)

    async def take(self, limit: int, wait: float) -> list[SourceRecord] | None:
        """The events of whole requests waiting (at least one request, up to ``limit`` events after
        it), waiting up to ``wait`` seconds for the first, then gathering (:meth:`_gather`; not with
        ``until_caught_up``)."""
        if not self._queue:
            if self._until_caught_up:
                return None
            self._arrived.clear()
            if await event_or_timeout(self._arrived, self._clock, wait):
                return []
        if not self._until_caught_up and self._queued_events < limit:
            await self._gather(limit)
        records: list[SourceRecord] = []
        now = self._clock.now()
        self._expire_keys(now)
        partition, keyed_ids = self._partition, self._readers > 1
        while self._queue and (not records or len(records) + len(self._queue[0].rows) <= limit):
            request = self._queue.popleft()
            self._queued_events -= len(request.rows)
            if keyed_ids and request.key is not None:
                records += (SourceRecord(keyed_position(request.key, line), row, timestamp, KEYED_PARTITION,
                                         request.trace_context)
                            for line, (row, timestamp) in enumerate(request.rows))
                self._position += len(request.rows)
            else:
                for row, timestamp in request.rows:
                    records.append(SourceRecord(self._position, row, timestamp, partition, request.trace_context))
                    self._position += 1
            if request.key is not None and self.parameters.idempotency_window > 0:
                self._key_writes[self._key_entry(request.key)] = repr(now).encode()
            self._taken.append(request)
        return records

    async def _gather(self, limit: int) -> None:
        """Wait for more requests, until each connection the last commit answered has one waiting
        again (or closed) or ``limit`` events wait, none arrived for :data:`GATHER_GAP`, or
        :data:`GATHER_SECONDS` passed (on the clock)."""
        waiting = {request.answered for request in self._queue}
        self._awaited = {c for c in self._answered if c not in waiting and c in self._connections}
        if not self._awaited:
            return
        clock = self._clock
        self._arrived_at = clock.monotonic()  # the gap counts from the gather's start, then from each arrival
        deadline = self._arrived_at + GATHER_SECONDS
        self._gathering = limit
        self._gathered.clear()
        try:
            while True:
                now = clock.monotonic()
                until = min(deadline, self._arrived_at + GATHER_GAP)
                if until <= now or not await event_or_timeout(self._gathered, clock, until - now):
                    return
        finally:
            self._gathering = 0
            self._awaited = set()

    def _arrival(self, waiter: object) -> None:
        """A request of ``waiter`` (a connection, or aiohttp's future) was queued, or a connection closed
        (``waiter``: it): the gather ends once every awaited connection has come back."""
        self._arrived_at = self._clock.monotonic()
        self._awaited.discard(waiter)
        if not self._awaited or self._queued_events >= self._gathering:
            self._gathered.set()

    def _key_entry(self, key: str) -> bytes:
        """The state entry's key of idempotency key ``key``: ``encode_key([key])``; with several
        readers, reader ``k`` loads back only entries whose key hashes to ``k``
        (``partition_of(entry, readers) == k``), so a salt is appended until it does (about
        ``readers`` hashes, once per key)."""
        if self._readers == 1:
            return encode_key([key])
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = key_in_partition([key], self._partition, self._readers)
        return entry

    def committed(self) -> None:
        """The batch taken last is durable: answer its requests ``200``."""
        now = self._clock.now()
        for request in self._taken:
            if request.key is not None:
                self._pending_keys.pop(request.key, None)
                if self.parameters.idempotency_window > 0:
                    self._keys[request.key] = now
            if not request.answered.done():
                request.answered.set_result(None)
            for duplicate in request.duplicates or ():
                if not duplicate.done():
                    duplicate.set_result(None)
        self._answered = {request.answered for request in self._taken}
        self._taken = []

    def unread_records(self) -> int:
        """Exact (``egress.connectors.sources.unread``): the events received and not yet committed
        (queued, or taken into the batch being committed); their POSTs wait for their ``200``."""
        return self._queued_events + sum(len(request.rows) for request in self._taken)

    async def close(self) -> None:
        """Stop listening; requests not committed are answered ``503`` (the client sends again)."""
        for request in [*self._taken, *self._queue]:
            for waiter in [request.answered, *(request.duplicates or ())]:
                if not waiter.done():
                    waiter.set_exception(_Stopping())
        self._taken, self._queue = [], deque()
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            for protocol in list(self._connections):
                protocol.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._peers is not None:
            await self._peers.close()

    # -- requests ----------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> web.Response:
        parameters = self.parameters
        if self._token is not None and not self._authorized(request):
            return web.json_response({"error": "a bearer token is required"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="egress"'})
        try:
            # A client's FIN cuts a body short: 400 at once (aiohttp is not told of the FIN, HalfOpen).
            with at_fin(request.transport, partial(client_ended, request)):
                body = await read_body(request, max_bytes=parameters.max_body_bytes,
                                       max_seconds=parameters.body_timeout)
        except RequestBodyError as error:
            parameter = _LIMITS.get(type(error))
            return closing(web.json_response({"error": f"{error} ({parameter})" if parameter else str(error)},
                                             status=error.status))
        key = request.headers.get("Idempotency-Key")
        home = self._elsewhere(key, FORWARDED in request.headers)
        if home is not None:
            assert self._peers is not None
            return await self._peers.forward(request, body, home)
        if key is not None:
            if key in self._keys:
                return web.json_response({"accepted": 0, "duplicate": True})
            pending = self._pending_keys.get(key)
            if pending is not None:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                if pending.duplicates is None:
                    pending.duplicates = []
                pending.duplicates.append(waiter)
                return await self._answer(waiter, 0, duplicate=True)
        try:
            rows = self._rows(body)
        except SourceDataError as error:
            return web.json_response({"error": str(error)}, status=400)
        if not rows:
            return web.json_response({"accepted": 0})
        refusal = self._holding_back(len(rows))
        if refusal is not None:
            return web.json_response({"error": f"egress is holding back ({refusal}): retry later"}, status=429,
                                     headers={"Retry-After": str(parameters.retry_after)})
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        context = None if tracing.active is None else tracing.context_of_headers(
            request.headers.get(tracing.TRACEPARENT), request.headers.get(tracing.TRACESTATE))
        self._enqueue(rows, key, answered, context)
        return await self._answer(answered, len(rows))

    def _enqueue(self, rows: list[tuple[dict[str, Any], float | None]], key: str | None, waiter: _Waiter,
                 trace_context: str | None = None) -> None:
        request = _Request(rows, key, waiter, None, trace_context)
        if key is not None:
            self._pending_keys[key] = request
        self._queue.append(request)
        self._queued_events += len(rows)
        self._arrived.set()
        if self._gathering:
            self._arrival(waiter)

    # -- the lean path (egress.connectors.sources.http_fast) -----------------------------------

    def accept_plain(self, waiter: IngestProtocol, body: bytes, key: str | None, authorization: bytes | None
                     ) -> tuple[bool, bytes] | None:
        """A plain POST's ``body``, as :meth:`_receive` takes it: ``(now, answer)`` (a duplicate's
        ``200`` now; a ``200`` once ``waiter`` is told of the commit), or ``None`` for aiohttp to
        answer (401, a key being committed, 400, 429: the rare answers, built one way only)."""
        if self._token is not None and not self._authorized_value(authorization):
            return None
        if key is not None:
            if self._readers > 1 and key_home(key, self._readers) != self._partition:
                return None  # aiohttp's path sends it on to its home (or, forwarded to here, accepts it)
            if key in self._keys:
                return True, _DUPLICATE
            if key in self._pending_keys:
                return None
        try:
            rows = self._rows(body)
        except SourceDataError:
            return None
        count = len(rows)
        if not count:
            return True, self._accepted(0)
        if self._holding_back(count) is not None:
            return None
        self._enqueue(rows, key, waiter)
        return False, self._accepted(count)

    def connection_closed(self, protocol: IngestProtocol) -> None:
        """``protocol``'s connection closed, or was handed over to aiohttp."""
        self._connections.discard(protocol)
        self._answered.discard(protocol)
        if self._gathering:
            self._arrival(protocol)

    def _accepted(self, count: int) -> bytes:
        answer = self._answers.get(count)
        if answer is None:
            answer = json_answer(200, "OK", {"accepted": count})
            if len(self._answers) < 1024:
                self._answers[count] = answer
        return answer

    def _authorized_value(self, header: bytes | None) -> bool:
        scheme, _, token = (header or b"").partition(b" ")
        assert self._token is not None
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token)

    async def _answer(self, answered: asyncio.Future[None], count: int, duplicate: bool = False) -> web.Response:
        try:
            await answered
        except _Stopping:
            return web.json_response({"error": "egress stopped before the events were committed: send again"},
                                     status=503, headers={"Retry-After": str(self.parameters.retry_after)})
        return web.json_response({"accepted": count, **({"duplicate": True} if duplicate else {})})

    def _holding_back(self, count: int) -> str | None:
        """Why ``count`` more events are refused now (``None``: they are not). One body is taken
        whatever its size when nothing waits, so a body over a limit is not refused for ever."""
        parameters = self.parameters
        queued = self._queued_events
        if queued and queued + count > parameters.max_pending_events:
            return f"{queued:,} events wait for their commit (max_pending_events {parameters.max_pending_events:,})"
        limit = parameters.max_backlog
        if limit is not None and self._backlog and self._backlog + queued + count > limit:
            return (f"{self._backlog:,} events are not yet delivered downstream "
                    f"(max_backlog {limit:,})")
        return None

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        assert self._token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token)

    def _rows(self, body: bytes) -> list[tuple[dict[str, Any], float | None]]:
        """The events of ``body``; raises ``SourceDataError`` naming the line and the reason."""
        parameters = self.parameters
        if parameters.format == "raw":
            row: dict[str, Any] = {c.name: None for c in self._columns}
            assert parameters.payload_column is not None
            row[parameters.payload_column] = body
            return [(row, None)]
        if parameters.format == "json":
            return [self._event(json_row(body, self._columns, "line 1"), 1)]
        events = []
        for number, line in enumerate(body.split(b"\n"), start=1):
            if line.strip():
                events.append(self._event(json_row(line, self._columns, f"line {number}"), number))
        return events

    def _event(self, row: dict[str, Any], line: int) -> tuple[dict[str, Any], float | None]:
        column = self.parameters.timestamp_column
        if column is None or row.get(column) is None:
            return row, None
        try:
            return row, parse_timestamp(row[column])
        except ValueError as error:
            raise record_error(f"line {line}", column, f"cannot parse {row[column]!r} as a timestamp ({error})"
                               ) from None

    def _expire_keys(self, now: float) -> None:
        window = self.parameters.idempotency_window
        for key in [k for k, at in self._keys.items() if now - at > window]:
            del self._keys[key]
            self._key_writes[self._key_entry(key)] = None
            self._entries.pop(key, None)

    def _bearer_token(self) -> bytes | None:
        """The token the parameters reference (surrounding whitespace stripped), ``None`` without one.
        Raises ``HttpSourceError`` naming the parameter and the variable or file, never the token."""
        parameters = self.parameters
        env, file = parameters.bearer_token_env, parameters.bearer_token_file
        field = "bearer_token_env" if env is not None else "bearer_token_file"
        fix = "export it before egress run" if env is not None else "write the token there or name another file"
        try:
            text = read_secret(env=env, file=None if file is None else self._base_dir / file)
        except SecretUnavailable as error:
            raise HttpSourceError(f"http source {self.source_id!r}: parameters/{field}: {error}: {fix}") from None
        if text is None:
            return None
        token = text.strip()
        if not token:
            raise HttpSourceError(f"http source {self.source_id!r}: parameters/{field}: the token is empty: {fix}")
        return token.encode()


KEYED_PARTITION = 0xFFFFFFFF
"""The source partition of the ids of keyed events when several readers accept (:func:`keyed_position`)."""


def keyed_position(key: str, line: int) -> int:
    """The id position of event ``line`` (0-based) of the request with ``Idempotency-Key`` ``key``
    when several readers accept: ``blake2b(key, line)[:8]`` as a u64, in source partition
    :data:`KEYED_PARTITION`. So a key accepted by two readers (a client sending again through the
    balancer to another worker before the first answered) is one message id, delivered under one
    idempotency key, whichever reader committed it and how often."""
    return int.from_bytes(hashlib.blake2b(f"{line}\n{key}".encode("utf-8", "surrogateescape"),
                                          digest_size=8).digest(), "big")


_DUPLICATE = json_answer(200, "OK", {"accepted": 0, "duplicate": True})
"""The answer to a key already committed (``_answer``'s, as bytes)."""

_LIMITS = {BodyTooLargeError: "max_body_bytes", BodyTimeoutError: "body_timeout"}
"""The parameter a body refusal names (the fix)."""


class _Stopping(Exception):  # not an EgressError: set on a request's future and caught in this module only
    """The run stopped before a request's events were committed."""
