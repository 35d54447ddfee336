"""The JetStream operations the NATS engine needs and nats-py has no helper for: atomic batch
publish, direct gets (one message, or every message of a filter from a sequence on), the subjects
of a filter, and purge of a filter below a sequence.

Atomic batch publish follows ADR-50 (nats-server 2.12+): every message carries ``Nats-Batch-Id``
and ``Nats-Batch-Sequence`` (1, 2, …); the first is a request (the server answers with an empty
message, or an error), the middle ones are plain publishes, the last carries
``Nats-Batch-Commit: 1`` and gets the PubAck (``seq`` of the last message; the batch's messages
have the ``count`` sequences up to it). A batch is stored whole or not at all; at most
:data:`MAX_BATCH` messages. Direct gets (``$JS.API.DIRECT.GET.<stream>``, ADR-31) need the
stream's ``allow_direct``; a batch get ends with a ``204 EOB`` status message carrying
``Nats-Num-Pending``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsClientError

from egress.engines.nats.errors import JetStreamRequestError, NatsEngineError

MAX_BATCH = 1000
"""Messages one atomic batch may hold (the server's default limit)."""

WRONG_LAST_SEQUENCE = 10071
"""The error code of a failed ``Nats-Expected-Last-Subject-Sequence`` check."""

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


class JetStream:
    """Raw JetStream requests against one stream over one connection (to ``url``); ``timeout`` in
    seconds. A refusal raises :class:`JetStreamRequestError`, no answer or a lost connection
    :class:`NatsEngineError` naming the URL and what was asked."""

    def __init__(self, connection: Client, stream: str, timeout: float, url: str) -> None:
        self._nc = connection
        self.stream = stream
        self.timeout = timeout
        self.url = url

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

    async def publish_batch(self, messages: Sequence[Outgoing]) -> int:
        """Publish ``messages`` (1 … :data:`MAX_BATCH`) as one atomic batch and return the stream
        sequence of the last; raises :class:`JetStreamRequestError` when the server refuses it."""
        async with self.answering(f"an atomic batch of {len(messages)} messages"):
            return await self._publish_batch(messages)

    async def _publish_batch(self, messages: Sequence[Outgoing]) -> int:
        batch_id = uuid.uuid4().hex
        last = len(messages)
        for index, message in enumerate(messages, 1):
            headers = dict(message.headers or {})
            headers["Nats-Batch-Id"] = batch_id
            headers["Nats-Batch-Sequence"] = str(index)
            if index == last:
                headers["Nats-Batch-Commit"] = "1"
                reply = await self._nc.request(message.subject, message.payload, timeout=self.timeout,
                                               headers=headers)
                return int(_answer(reply.data)["seq"])
            if index == 1:
                reply = await self._nc.request(message.subject, message.payload, timeout=self.timeout,
                                               headers=headers)
                if reply.data:
                    _answer(reply.data)
            else:
                await self._nc.publish(message.subject, message.payload, headers=headers)
        raise ValueError("an atomic batch needs at least one message")

    async def publish(self, message: Outgoing) -> int:
        """Publish one message and return its stream sequence; raises
        :class:`JetStreamRequestError` when the server refuses it (e.g. :data:`WRONG_LAST_SEQUENCE`)."""
        async with self.answering(f"a message on {message.subject}"):
            reply = await self._nc.request(message.subject, message.payload, timeout=self.timeout,
                                           headers=message.headers)
        return int(_answer(reply.data)["seq"])

    async def last(self, subject: str) -> Stored | None:
        """The last message on ``subject`` (wildcards allowed), or ``None``."""
        async with self.answering(f"the last message on {subject}"):
            reply = await self._nc.request(f"$JS.API.DIRECT.GET.{self.stream}",
                                           json.dumps({"last_by_subj": subject}).encode(), timeout=self.timeout)
        return _stored(reply)

    async def get(self, seq: int) -> Stored | None:
        """The message at stream sequence ``seq``, or ``None``."""
        async with self.answering(f"message {seq}"):
            reply = await self._nc.request(f"$JS.API.DIRECT.GET.{self.stream}", json.dumps({"seq": seq}).encode(),
                                           timeout=self.timeout)
        return _stored(reply)

    async def scan(self, subject_filter: str, start: int = 1, limit: int | None = None) -> list[Stored]:
        """The messages on ``subject_filter`` from stream sequence ``start`` on, in sequence order:
        every one, or the first ``limit``."""
        found: list[Stored] = []
        while limit is None or len(found) < limit:
            batch = _SCAN_BATCH if limit is None else min(_SCAN_BATCH, limit - len(found))
            async with self.answering(f"the messages on {subject_filter}"):
                page, pending = await self._direct_batch({"seq": start, "next_by_subj": subject_filter,
                                                          "batch": batch, "max_bytes": _SCAN_BYTES})
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

    async def purge(self, subject_filter: str, before: int) -> int:
        """Remove the messages on ``subject_filter`` with a sequence below ``before``; returns how many."""
        answer = await self._api("STREAM.PURGE", {"filter": subject_filter, "seq": before})
        return int(answer.get("purged", 0))

    async def _api(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        async with self.answering(operation):
            reply = await self._nc.request(f"$JS.API.{operation}.{self.stream}", json.dumps(request).encode(),
                                           timeout=self.timeout)
        return _answer(reply.data)

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
            await self._nc.publish(f"$JS.API.DIRECT.GET.{self.stream}", json.dumps(request).encode(), reply=inbox)
            status = await asyncio.wait_for(ended, self.timeout)
        finally:
            await subscription.unsubscribe()
        code = status.get("Status")
        if code == "404":
            return [], 0
        if code != "204":
            raise JetStreamRequestError(0, f"direct get: status {code} {status.get('Description', '')}".strip())
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
        raise JetStreamRequestError(0, f"direct get: status {status} {headers.get('Description', '')}".strip())
    return _as_stored(reply)


def _as_stored(message: Msg) -> Stored:
    headers = message.headers or {}
    return Stored(headers["Nats-Subject"], int(headers["Nats-Sequence"]), headers, message.data)
