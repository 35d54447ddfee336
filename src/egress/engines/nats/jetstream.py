"""The JetStream operations the NATS engine needs and nats-py has no helper for: atomic batch
publish, direct gets (one message, or every message of a filter from a sequence on), the subjects
of a filter, and purge of a filter below a sequence.

Atomic batch publish follows ADR-50 (nats-server 2.12+): every message carries ``Nats-Batch-Id``
and ``Nats-Batch-Sequence`` (1, 2, …); all but the last are plain publishes, the last carries
``Nats-Batch-Commit: 1`` and gets the PubAck (``seq`` of the last message; the batch's messages
have the ``count`` sequences up to it) or the error that made the server abandon the batch (any
message's failed expectation: measured on 2.15.1, the same answer as when the first message is a
request, which only adds a round trip). A batch is stored whole or not at all; at most
:data:`MAX_BATCH` messages. Direct gets (``$JS.API.DIRECT.GET.<stream>``, ADR-31) need the
stream's ``allow_direct``; a batch get ends with a ``204 EOB`` status message carrying
``Nats-Num-Pending``.

Outages: every request here waits out a lost connection or a server that cannot answer yet
(restarting, JetStream recovering, a stream leader being elected) and tries again, for up to
``outage_timeout`` seconds, then raises :class:`NatsUnavailableError`. That is safe because each
request is idempotent: reads and purges trivially, and a batch because its first message carries a
``Nats-Msg-Id`` that stays the same across the attempts: the server stores at most one of them and
rejects a replay whole with ``err_code`` 10201 (checked before any expected-sequence header,
measured on nats-server 2.15.1), which :meth:`JetStream.publish_batch` reports as "stored by an
earlier attempt".

Reads are monotonic and see this process's own writes, on a cluster too: with ``allow_direct``
any replica answers a direct get, and one that lags could return an older checkpoint to a job that
just took a partition over. Every direct get carries ``min_last_seq`` (ADR-53, nats-server 2.12):
the highest stream sequence this process has seen stored (a PubAck, a lease revision); a replica
that has not applied that far answers 412 and the request is tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from nats import errors as client_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsClientError
from nats.js.errors import APIError, NoStreamResponseError

from egress.engines.nats.errors import JetStreamRequestError, NatsEngineError, NatsUnavailableError

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_BATCH = 1000
"""Messages one atomic batch may hold (the server's default limit)."""

WRONG_LAST_SEQUENCE = 10071
"""The error code of a failed ``Nats-Expected-Last-Subject-Sequence`` check."""

DUPLICATE_MESSAGE_ID = 10201
"""The error code of an atomic batch holding a ``Nats-Msg-Id`` the stream has stored already
(within its ``duplicate_window``): nothing of the batch is stored."""

TRANSIENT_CODES = frozenset({
    412,    # a direct get's "min last sequence": the replica asked is behind what this process has seen
    503,    # a direct get's or an API request's "no responders" / "JetStream not ready" status
    10008,  # JetStream system temporarily unavailable (a stream leader being elected, a restart)
    10009,  # JetStream not in clustered mode ... yet (a cluster node starting)
    10074,  # stream is not current (a replica catching up)
    10202,  # too many atomic batches in flight (abandoned attempts time out after 10 s)
})
"""JetStream ``err_code`` (or status) values that say "not now": the request is tried again."""

_TRANSIENT_CLIENT_ERRORS = (
    client_errors.TimeoutError, client_errors.NoRespondersError, client_errors.OutboundBufferLimitError,
    client_errors.StaleConnectionError, client_errors.ConnectionReconnectingError, TimeoutError, ConnectionError,
    NoStreamResponseError,  # a KV put or update answered by no stream: its leader is being elected
)
_FIRST_RETRY_DELAY = 0.05  # seconds; doubled after each failed attempt up to _LAST_RETRY_DELAY
_LAST_RETRY_DELAY = 1.0

TOMBSTONE = {"KV-Operation": "DEL"}
"""Headers of a deleted key: KV's delete marker, without a TTL. It replaces the value (the stream
keeps one message per subject) and stays while its generation is live: a marker that lapses or is
purged lets nats-server 2.15.1 bring the replaced value back after a SIGKILL and restart
(docs/cluster.md, "Retention"). A compaction drops a generation's markers with the generation."""

EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"

_SCAN_BATCH = 1000
_SCAN_BYTES = 8 * 1024 * 1024


class Outgoing(NamedTuple):
    """A message to publish: full subject, payload, headers (``None`` for none)."""

    subject: str
    payload: bytes
    headers: dict[str, str] | None = None


class Stored(NamedTuple):
    """A stored message as a direct get returns it: subject, stream sequence, headers, payload."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes


def expect_last(sequence: int, subject: str) -> dict[str, str]:
    """Headers that make a publish (or a whole batch) fail unless ``subject`` (a filter may have
    wildcards) last had a message at ``sequence`` (0: never one)."""
    return {EXPECTED_LAST_SUBJECT_SEQUENCE: str(sequence), EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: subject}


def is_deleted(stored: Stored) -> bool:
    """Whether ``stored`` is a KV delete or purge marker (a released lease, a member gone)."""
    return stored.headers.get("KV-Operation") in ("DEL", "PURGE")


def ttl_headers(ttl: float) -> dict[str, str]:
    """The per-message TTL of a message that should live ``ttl`` seconds: whole seconds (the
    server's granularity), rounded up so that it never lapses early, at least 1."""
    return {"Nats-TTL": f"{max(1, math.ceil(ttl))}s"}


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` says the server cannot answer now (connection lost or reconnecting, no
    answer in time, JetStream or the stream leader not ready), so the same request may succeed later."""
    if isinstance(error, _TRANSIENT_CLIENT_ERRORS):
        return True
    if isinstance(error, JetStreamRequestError):
        return error.code in TRANSIENT_CODES
    if isinstance(error, APIError):
        return getattr(error, "err_code", None) in TRANSIENT_CODES or getattr(error, "code", None) == 503
    return False


class Link:
    """The state of one connection as nats-py's callbacks report it (:meth:`dropped`,
    :meth:`restored`, :meth:`closed`): :attr:`up` is set while it is connected (or closed: nothing
    to wait for), and :meth:`lost` resolves when it drops. A request whose connection drops is not
    answered on the next one, and nats-py would let it wait out its whole timeout."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.up.set()
        self._lost: asyncio.Future[None] | None = None

    def lost(self) -> asyncio.Future[None]:
        """A future that resolves when the connection drops (resolved already while it is down)."""
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
            if not self.up.is_set():
                self._lost.set_result(None)
        return self._lost

    def dropped(self) -> None:
        self.up.clear()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def restored(self) -> None:
        self.up.set()
        if self._lost is not None and self._lost.done():
            self._lost = None

    def closed(self) -> None:
        self.dropped()
        self.up.set()


class JetStream:
    """Raw JetStream requests against one stream over one connection (to ``url``); ``timeout`` in
    seconds per request. A request the server cannot answer now (:func:`is_transient`), or whose
    connection dropped while it waited (``link``, when given, tells), is tried again once the
    connection is back, for up to ``outage_timeout`` seconds in all; then :class:`NatsUnavailableError`. A refusal
    raises :class:`JetStreamRequestError`, any other transport error :class:`NatsEngineError`,
    both naming the URL and what was asked."""

    def __init__(self, connection: Client, stream: str, timeout: float, url: str, *,
                 outage_timeout: float = 60.0, link: Link | None = None) -> None:
        self._nc = connection
        self.stream = stream
        self.timeout = timeout
        self.url = url
        self.outage_timeout = outage_timeout
        self._link = link
        self.read_floor = 0

    def observed(self, seq: int) -> None:
        """Record that the stream stored a message at ``seq`` (a PubAck, a KV revision): later
        direct gets are answered only by a replica that has applied it."""
        self.read_floor = max(self.read_floor, seq)

    def _floored(self, request: dict[str, Any]) -> bytes:
        return json.dumps({**request, "min_last_seq": self.read_floor} if self.read_floor else request).encode()

    @contextlib.asynccontextmanager
    async def answering(self, what: str) -> AsyncIterator[None]:
        """Turn nats-py's transport errors inside into a :class:`NatsEngineError` about ``what``."""
        try:
            yield
        except (NatsClientError, TimeoutError, OSError) as error:
            detail = str(error) or type(error).__name__
            raise NatsEngineError(f"{self.url}: stream {self.stream}: {what}: {detail} (no answer within "
                                  f"{self.timeout:g} s, or the connection is lost); check that the server is up"
                                  ) from None

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``, tried again while it fails with a transient error (:func:`is_transient`):
        after the connection is back and a short pause (50 ms doubling up to 1 s), until
        ``outage_timeout`` seconds have passed since the first attempt; then raises
        :class:`NatsUnavailableError` about ``what``. Other errors pass through unchanged. Only for
        a ``call`` that may run twice: every request of this class, a KV get, a KV update
        expecting a revision."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.outage_timeout
        delay = _FIRST_RETRY_DELAY
        attempt = 1
        while True:
            try:
                return await self._attempt(call)
            except (NatsClientError, TimeoutError, OSError, JetStreamRequestError) as error:
                if not is_transient(error):
                    raise
                remaining = deadline - loop.time()
                if remaining <= 0:
                    detail = str(error) or type(error).__name__
                    raise NatsUnavailableError(
                        f"{self.url}: stream {self.stream}: {what}: no usable answer for {self.outage_timeout:g} s "
                        f"({attempt} attempts; last: {detail}); check that the server is up, then run again: "
                        "what was committed is kept") from None
                logger.info("NATS %s: %s: %s; trying again", self.url, what, str(error) or type(error).__name__)
            await self._until_connected(remaining)
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, _LAST_RETRY_DELAY)
            attempt += 1

    async def _attempt(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``; raises ``ConnectionReconnectingError`` as soon as the connection drops
        under it (the call is cancelled: its answer, if any, would never come)."""
        if self._link is None:
            return await call()
        lost = self._link.lost()
        if lost.done():
            raise client_errors.ConnectionReconnectingError
        attempt = asyncio.ensure_future(call())
        racing: set[asyncio.Future[Any]] = {attempt, lost}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
        if attempt.cancelled():
            raise client_errors.ConnectionReconnectingError
        return attempt.result()

    async def _until_connected(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the connection to be up again (at once when it is)."""
        if self._link is not None and not self._link.up.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._link.up.wait(), seconds)

    async def publish_batch(self, messages: Sequence[Outgoing], message_id: str | None = None) -> int | None:
        """Publish ``messages`` (1 … :data:`MAX_BATCH`) as one atomic batch and return the stream
        sequence of the last; raises :class:`JetStreamRequestError` when the server refuses it.

        The first message carries ``Nats-Msg-Id: message_id`` (a fresh one when ``None``; the
        caller gives the same id to every batch that stands for the same change). The batch is
        sent again while the server cannot answer (:meth:`retrying`): then the answer to an
        earlier attempt may have been lost after the server stored it, and the replay is refused
        as a duplicate; ``None`` is returned then: an attempt of this batch is stored, at
        sequences this call does not know.

        One message goes as a plain publish, atomic by itself and with the same expectations: a
        batch on a stream of one replica in file storage costs the server a store of its own on
        disk (a directory, a synced file, removed at the end), most of its CPU per commit. Its
        replay comes back as a duplicate carrying the stored sequence, which is returned; the
        server checks a plain publish's expected sequences before its id, so a replay after the
        lease moved on is refused as :data:`WRONG_LAST_SEQUENCE` (the caller's fence check then
        says fenced, and the new owner has the commit)."""
        message_id = message_id or uuid.uuid4().hex
        first = messages[0]
        headers = {**(first.headers or {}), "Nats-Msg-Id": message_id}
        messages = [first._replace(headers=headers), *messages[1:]]
        if len(messages) == 1:
            return await self.publish(messages[0])
        what = f"an atomic batch of {len(messages)} messages"
        try:
            async with self.answering(what):
                return await self.retrying(what, lambda: self._publish_batch(messages))
        except JetStreamRequestError as error:
            if error.code == DUPLICATE_MESSAGE_ID:
                return None
            raise

    async def _publish_batch(self, messages: Sequence[Outgoing]) -> int:
        """Every message but the last as a plain publish (in order on the one connection; the
        server reports a refusal of any of them in its answer to the last), the last as the
        request that commits the batch: one round trip per batch."""
        batch_id = uuid.uuid4().hex  # per attempt: a batch abandoned half-sent must not merge with its retry
        last = len(messages)
        for index, message in enumerate(messages, 1):
            headers = dict(message.headers or {})
            headers["Nats-Batch-Id"] = batch_id
            headers["Nats-Batch-Sequence"] = str(index)
            if index == last:
                headers["Nats-Batch-Commit"] = "1"
                reply = await self._nc.request(message.subject, message.payload, timeout=self.timeout,
                                               headers=headers)
                seq = int(_answer(reply.data)["seq"])
                self.observed(seq)
                return seq
            await self._nc.publish(message.subject, message.payload, headers=headers)
        raise ValueError("an atomic batch needs at least one message")

    async def publish(self, message: Outgoing) -> int:
        """Publish one message and return its stream sequence; raises
        :class:`JetStreamRequestError` when the server refuses it (e.g. :data:`WRONG_LAST_SEQUENCE`).
        Sent again while the server cannot answer (:meth:`retrying`): a message expecting a last
        sequence whose first attempt was stored then comes back refused with
        :data:`WRONG_LAST_SEQUENCE` (the caller reads the subject back); one without expectations
        is stored again (a KV put of the same value)."""
        async def send() -> int:
            reply = await self._nc.request(message.subject, message.payload, timeout=self.timeout,
                                           headers=message.headers)
            return int(_answer(reply.data)["seq"])

        what = f"a message on {message.subject}"
        async with self.answering(what):
            seq = await self.retrying(what, send)
        self.observed(seq)
        return seq

    async def last(self, subject: str) -> Stored | None:
        """The last message on ``subject`` (wildcards allowed), or ``None``."""
        return await self._direct_get(f"the last message on {subject}", {"last_by_subj": subject})

    async def get(self, seq: int) -> Stored | None:
        """The message at stream sequence ``seq``, or ``None``."""
        return await self._direct_get(f"message {seq}", {"seq": seq})

    async def _direct_get(self, what: str, request: dict[str, Any]) -> Stored | None:
        async def get() -> Stored | None:
            return _stored(await self._nc.request(f"$JS.API.DIRECT.GET.{self.stream}", self._floored(request),
                                                  timeout=self.timeout))

        async with self.answering(what):
            return await self.retrying(what, get)

    async def scan(self, subject_filter: str, start: int = 1, limit: int | None = None) -> list[Stored]:
        """The messages on ``subject_filter`` from stream sequence ``start`` on, in sequence order:
        every one, or the first ``limit``."""
        found: list[Stored] = []
        while limit is None or len(found) < limit:
            batch = _SCAN_BATCH if limit is None else min(_SCAN_BATCH, limit - len(found))
            request = {"seq": start, "next_by_subj": subject_filter, "batch": batch, "max_bytes": _SCAN_BYTES}
            what = f"the messages on {subject_filter}"
            async with self.answering(what):
                page, pending = await self.retrying(what, functools.partial(self._direct_batch, request))
            found.extend(page)
            if not page or not pending:
                break
            start = page[-1].seq + 1
        return found

    async def subjects(self, subject_filter: str) -> dict[str, int]:
        """The subjects matching ``subject_filter`` that hold messages, with their message counts."""
        subjects: dict[str, int] = {}
        while True:
            answer = await self._api("STREAM.INFO", {"subjects_filter": subject_filter, "offset": len(subjects)})
            page = answer.get("state", {}).get("subjects") or {}
            subjects.update(page)
            if not page or len(subjects) >= int(answer.get("total", 0)):
                return subjects

    async def purge(self, subject_filter: str, before: int | None) -> int:
        """Remove the messages on ``subject_filter`` with a sequence below ``before`` (every one for
        ``None``); returns how many."""
        request: dict[str, Any] = {"filter": subject_filter}
        if before is not None:
            request["seq"] = before
        answer = await self._api("STREAM.PURGE", request)
        return int(answer.get("purged", 0))

    async def _api(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            reply = await self._nc.request(f"$JS.API.{operation}.{self.stream}", json.dumps(request).encode(),
                                           timeout=self.timeout)
            return _answer(reply.data)

        async with self.answering(operation):
            return await self.retrying(operation, ask)

    async def _direct_batch(self, request: dict[str, Any]) -> tuple[list[Stored], int]:
        """One batch direct get: the messages and how many more match after them."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[dict[str, str]] = loop.create_future()
        page: list[Stored] = []

        async def on_message(message: Msg) -> None:
            headers = message.headers or {}
            if "Status" not in headers:
                page.append(_as_stored(message))
            elif not ended.done():
                ended.set_result(headers)

        inbox = self._nc.new_inbox()
        subscription = await self._nc.subscribe(inbox, cb=on_message)
        try:
            await self._nc.publish(f"$JS.API.DIRECT.GET.{self.stream}", self._floored(request), reply=inbox)
            status = await asyncio.wait_for(ended, self.timeout)
        finally:
            await subscription.unsubscribe()
        code = status.get("Status")
        if code == "404":
            return [], 0
        if code != "204":
            raise JetStreamRequestError(_status_code(code),
                                        f"direct get: status {code} {status.get('Description', '')}".strip())
        return page, int(status.get("Nats-Num-Pending", "0"))


def _answer(data: bytes) -> dict[str, Any]:
    """A JSON API answer or PubAck; raises :class:`JetStreamRequestError` for an error answer."""
    answer: dict[str, Any] = json.loads(data)
    error = answer.get("error")
    if error:
        raise JetStreamRequestError(int(error.get("err_code", 0)), str(error.get("description", error)))
    return answer


def _stored(reply: Msg) -> Stored | None:
    headers = reply.headers or {}
    status = headers.get("Status")
    if status == "404":
        return None
    if status is not None:
        raise JetStreamRequestError(_status_code(status),
                                    f"direct get: status {status} {headers.get('Description', '')}".strip())
    return _as_stored(reply)


def _status_code(status: str | None) -> int:
    """A direct get's status header as a code for :class:`JetStreamRequestError` (0 when not a number)."""
    return int(status) if status is not None and status.isdigit() else 0


def _as_stored(message: Msg) -> Stored:
    headers = message.headers or {}
    return Stored(headers["Nats-Subject"], int(headers["Nats-Sequence"]), headers, message.data)
