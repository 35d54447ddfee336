"""A strict Firehose HTTP endpoint as an aiohttp application that endpoint authors use as a library.

You write one coroutine, ``async def handle(request_id, records, common_attributes) -> None``, that
stores ``records`` (a ``list[bytes]``, decoded, in request order) and returns, or raises
:class:`~egress.firehose.errors.PermanentError` (answered 400) or
:class:`~egress.firehose.errors.TransientError` (answered 503). :class:`FirehoseReceiver` does the
rest: the decision table of ``docs/firehose.md`` in its order (first failing rule wins), caps on
the received and the decompressed size (gzip bombs), access keys compared in constant time (several
at once, for rotation), a health path, and a JSON body on every answer,
``{"requestId", "timestamp" (ms), "errorMessage" (errors only)}`` (Firehose HTTP endpoint spec,
"Response format").

Mount it: ``parent.add_subapp("/firehose", FirehoseReceiver(handle).app)``, or route a path of your
own to :meth:`FirehoseReceiver.handle`. Served with ``web.AppRunner(app, auto_decompress=False)``
(what :func:`serve` does) the receiver decompresses gzip itself and both caps are exact; under
aiohttp's default automatic decompression it still enforces both caps on the stream aiohttp hands it
(but aiohttp then skips the gzip trailer check and answers unknown encodings itself, in plain text).
:meth:`FirehoseReceiver.answer` is the framework-neutral core; :mod:`egress.firehose.asgi` serves it
to ASGI servers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from egress.clock import Clock, RealClock
from egress.firehose import protocol as p
from egress.firehose.errors import PermanentError, RequestRejected, TransientError
from egress.http_body import (
    BodyTimeoutError,
    ClientClosedError,
    UnreadableBodyError,
    closing,
    request_chunks,
)
from egress.http_expect import expect_handler

Handler = Callable[[str, list[bytes], dict[str, str]], Awaitable[None]]
"""``handle(request_id, records, common_attributes)``: ``request_id`` is the
``X-Amz-Firehose-Request-Id`` (the same on every retry of a batch: deduplicate on it), ``records``
the decoded ``records[].data`` in order (possibly empty, possibly empty byte strings),
``common_attributes`` the ``X-Amz-Firehose-Common-Attributes`` map (empty when absent). Return once
the records are stored; raise :class:`PermanentError` (400) or :class:`TransientError` (503)."""

log = logging.getLogger("egress.firehose.receiver")

DEFAULT_HEALTH_PATH = "/health"
_OWS = " \t"  # HTTP's optional white space


@dataclass(frozen=True)
class ReceiverOptions:
    """What the receiver accepts.

    ``access_keys``: keys accepted in ``X-Amz-Firehose-Access-Key`` (several during a rotation);
    empty means no key is required. ``path``: the one path that receives records (``None``: every
    path except the health path). ``health_path``: answers 200 to GET and HEAD.
    ``max_body_bytes``: cap on the body as received (compressed when gzip'd), checked against
    Content-Length first and while reading;
    ``max_decompressed_bytes``: cap on the body after gunzip (default both 64 MiB, the protocol's
    body limit). ``max_records`` and ``max_record_bytes``: the protocol's limits (10,000 records,
    1,024,000 bytes each); above them the answer is 413. ``body_timeout``: seconds the body may take
    to arrive whole, from the end of its headers (default 180: Firehose waits that long for an answer,
    so a slower body fails anyway); then the answer is 408 and the connection is closed.
    """

    access_keys: tuple[str, ...] = ()
    path: str | None = None
    health_path: str = DEFAULT_HEALTH_PATH
    max_body_bytes: int = p.MAX_REQUEST_BODY_BYTES
    max_decompressed_bytes: int = p.MAX_REQUEST_BODY_BYTES
    max_records: int = p.MAX_RECORDS_PER_REQUEST
    max_record_bytes: int = p.MAX_RECORD_BYTES
    body_timeout: float = p.RESPONSE_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        keys: object = self.access_keys
        if isinstance(keys, str):
            raise TypeError("access_keys is a sequence of keys, not one string")
        object.__setattr__(self, "access_keys", tuple(self.access_keys))
        for name in ("max_body_bytes", "max_decompressed_bytes", "max_records", "max_record_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.body_timeout > 0:
            raise ValueError("body_timeout must be > 0 (seconds)")

    def __repr__(self) -> str:  # never show the keys
        return (f"ReceiverOptions(access_keys=<{len(self.access_keys)} key(s)>, path={self.path!r}, "
                f"health_path={self.health_path!r}, max_body_bytes={self.max_body_bytes}, "
                f"max_decompressed_bytes={self.max_decompressed_bytes}, body_timeout={self.body_timeout})")


@dataclass
class ReceiverStats:
    """Counters: requests by status, records and received (raw) body bytes of accepted requests."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    records_accepted: int = 0
    bytes_accepted: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
                "records_accepted": self.records_accepted, "bytes_accepted": self.bytes_accepted}


class _KeyChecker:
    """Constant-time membership of a key among several: every configured key is compared, always,
    on SHA-256 digests so neither the position of a difference nor the key lengths leak."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, given: str | None) -> bool:
        candidate = hashlib.sha256((given or "").encode("utf-8", "surrogateescape")).digest()
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(candidate, digest)
        return matched and given is not None


class FirehoseReceiver:
    """The receiver: ``app`` is the aiohttp application, ``handle`` its request handler.

    ``handler`` is the user's coroutine (see :data:`Handler`); ``clock`` gives the response
    ``timestamp`` (ms since the epoch). Exceptions of the handler other than :class:`PermanentError`
    and :class:`TransientError` are logged and answered 500 (a bug to fix, retried by the sender).
    """

    def __init__(self, handler: Handler, options: ReceiverOptions | None = None, *, clock: Clock | None = None) -> None:
        self.options = options or ReceiverOptions()
        self.stats = ReceiverStats()
        self._handler = handler
        self._clock = clock or RealClock()
        self._keys = _KeyChecker(self.options.access_keys)
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle, expect_handler=expect_handler)

    async def handle(self, request: web.Request) -> web.Response:
        """The aiohttp handler: answer one request following the decision table; never raises."""
        stream = request.content

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in request_chunks(request, self.options.body_timeout):
                    yield chunk
            except ClientClosedError as error:  # counted; nobody will read the answer
                raise RequestRejected(error.status, str(error)) from None

        incoming = Incoming(request.method, _path(request), request.content_length, request.headers, chunks,
                            lambda: getattr(stream, "total_compressed_bytes", None))
        status, body = await self.answer(incoming)
        response = web.Response(status=status, body=body, content_type=p.CONTENT_TYPE_JSON)
        if status == 405:
            response.headers["Allow"] = "POST"
        if status in (408, 413):  # the rest of the body may still be on its way: the connection is not reused
            closing(response)
        return response

    async def answer(self, incoming: Incoming) -> tuple[int, bytes]:
        """The framework-neutral core: the status and JSON body for one request; never raises."""
        request_id = incoming.headers.get(p.HEADER_REQUEST_ID, "")
        try:
            status, message, raw_bytes, records = await self._decide(incoming, request_id)
        except RequestRejected as rejected:
            status, message, raw_bytes, records = rejected.status, rejected.message, 0, 0
        except Exception:  # a bug in this module must still answer JSON
            log.exception("firehose request %.200r: unexpected error", request_id)
            status, message, raw_bytes, records = 500, "internal error", 0, 0
        self._count(status, request_id, message, raw_bytes, records)
        return status, p.response_body(request_id, int(self._clock.now() * 1000), message)

    async def _decide(self, incoming: Incoming, request_id: str) -> tuple[int, str | None, int, int]:
        """The status, message, received bytes and accepted records of one request, in the decision
        table's order: what the request line and the headers decide, then the body, then the handler.
        Raises :class:`RequestRejected` for a rule the request fails."""
        if incoming.method != "POST":
            if incoming.method in ("GET", "HEAD") and incoming.path == self.options.health_path:
                return 200, None, 0, 0
            raise RequestRejected(405, p.MSG_METHOD_NOT_ALLOWED)
        self._check_request_line(incoming, request_id)
        gzipped = self._check_headers(incoming.headers)
        body, raw_bytes = await self._read_body(incoming, gzipped=gzipped)
        records = p.decode_request_body(body, request_id, max_records=self.options.max_records,
                                        max_record_bytes=self.options.max_record_bytes)
        attributes_header = incoming.headers.getall(p.HEADER_COMMON_ATTRIBUTES, [])
        if len(attributes_header) > 1:
            raise RequestRejected(400, "invalid common attributes header: sent more than once")
        attributes = p.parse_common_attributes(attributes_header[0]) if attributes_header else {}
        status, message = await self._handle_records(request_id, records, attributes)
        return status, message, raw_bytes, len(records) if status == 200 else 0

    def _check_request_line(self, incoming: Incoming, request_id: str) -> None:
        """Raise :class:`RequestRejected` for a POST to another path (404), a declared body over
        the cap (413), no request id (400) or an access key not accepted (401)."""
        options = self.options
        if options.path is not None and incoming.path != options.path:
            raise RequestRejected(404, p.MSG_NOT_FOUND)
        if incoming.content_length is not None and incoming.content_length > options.max_body_bytes:
            raise RequestRejected(413, p.MSG_PAYLOAD_TOO_LARGE)
        if not request_id:
            raise RequestRejected(400, p.MSG_MISSING_HEADER_REQUEST_ID)
        if self._keys.enabled:
            given = incoming.headers.getall(p.HEADER_ACCESS_KEY, [])
            if not self._keys.accepts(given[0] if len(given) == 1 else None):
                raise RequestRejected(401, p.MSG_INVALID_ACCESS_KEY)

    @staticmethod
    def _check_headers(headers: MultiMapping[str]) -> bool:
        """Whether the body is gzipped; raises :class:`RequestRejected` for another protocol
        version (400), content type or content encoding (415)."""
        version = headers.get(p.HEADER_PROTOCOL_VERSION)
        if version is not None and version.strip(_OWS) != p.PROTOCOL_VERSION:
            raise RequestRejected(400, p.MSG_UNSUPPORTED_PROTOCOL_VERSION)
        content_type = headers.get("Content-Type", "")
        if content_type.split(";", 1)[0].strip(_OWS).lower() != p.CONTENT_TYPE_JSON:
            raise RequestRejected(415, p.MSG_UNSUPPORTED_CONTENT_TYPE)
        encodings = headers.getall("Content-Encoding", [])
        if len(encodings) > 1 or (encodings and encodings[0].strip(_OWS).lower() != "gzip"):
            raise RequestRejected(415, p.MSG_UNSUPPORTED_CONTENT_ENCODING)
        return bool(encodings)

    async def _handle_records(self, request_id: str, records: list[bytes],
                              attributes: dict[str, str]) -> tuple[int, str | None]:
        """Call the handler: 200, or 400 / 503 / 500 with the message for what it raised."""
        try:
            await self._handler(request_id, records, attributes)
        except PermanentError as error:
            return 400, str(error) or "permanent error"
        except TransientError as error:
            return 503, str(error) or "transient error"
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("firehose request %.200r: the handler raised", request_id)
            return 500, "internal error while handling the records"
        return 200, None

    async def _read_body(self, incoming: Incoming, *, gzipped: bool) -> tuple[bytes, int]:
        """The body, decompressed; and its size as received. Raises RequestRejected 400/413."""
        options = self.options
        # Under aiohttp's automatic decompression the stream already yields gunzipped bytes and
        # counts the received ones (compressed_bytes() is not None).
        server_gunzips = gzipped and incoming.compressed_bytes() is not None
        limit = options.max_decompressed_bytes if server_gunzips else options.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in incoming.chunks():
                size += len(chunk)
                received = (incoming.compressed_bytes() or 0) if server_gunzips else size
                if size > limit or received > options.max_body_bytes:
                    raise RequestRejected(413, p.MSG_PAYLOAD_TOO_LARGE)
                chunks.append(chunk)
        except UnreadableBodyError:
            raise RequestRejected(400, p.MSG_CORRUPT_GZIP if gzipped else "unable to read the request body") from None
        except BodyTimeoutError:
            raise RequestRejected(408, p.MSG_REQUEST_TIMEOUT) from None
        body = b"".join(chunks)
        raw_bytes = (incoming.compressed_bytes() or 0) if server_gunzips else size
        if not gzipped:
            return body, raw_bytes
        if server_gunzips:
            if not body:
                raise RequestRejected(400, p.MSG_CORRUPT_GZIP)
            return body, raw_bytes
        return p.gunzip(body, options.max_decompressed_bytes), raw_bytes

    def _count(self, status: int, request_id: str, message: str | None, raw_bytes: int, records: int) -> None:
        stats = self.stats
        stats.requests += 1
        stats.by_status[status] += 1
        if status == 200:
            stats.records_accepted += records
            stats.bytes_accepted += raw_bytes
            log.debug("firehose request %.200r: accepted %d record(s)", request_id, records)
        else:
            log.info("firehose request %.200r: %d %s", request_id, status, message)


@dataclass(frozen=True)
class Incoming:
    """One request as :meth:`FirehoseReceiver.answer` needs it, whatever the server framework.

    ``headers`` are case-insensitive (a ``multidict.CIMultiDict``, as aiohttp's, values without
    surrounding white space); ``path`` is the path inside the receiver's application;
    ``content_length`` the declared body size in bytes (``None`` when chunked); ``chunks()`` yields
    the body as received; ``compressed_bytes()`` is ``None`` unless the server already gunzipped the
    body, then the bytes it received so far.
    ``chunks()`` may raise :class:`egress.http_body.UnreadableBodyError` for a body the server could not
    decode.
    """

    method: str
    path: str
    content_length: int | None
    headers: MultiMapping[str]
    chunks: Callable[[], AsyncIterator[bytes]]
    compressed_bytes: Callable[[], int | None]


def _path(request: web.Request) -> str:
    """The path inside this application (mounted as a sub-application, the part after the prefix)."""
    tail = request.match_info.get("tail")
    return request.path if tail is None else "/" + tail


async def serve(
    receiver: FirehoseReceiver,
    host: str,
    port: int,
    *,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    app: web.Application | None = None,
) -> None:
    """Serve ``receiver.app`` (or ``app``, an application that routes to ``receiver``) on
    ``host:port`` until ``stop`` is set, or forever.

    aiohttp's own request decompression is off, so the receiver gunzips itself and both size caps
    are exact. ``port`` 0 picks a free port; ``ready`` is called with the bound port once the server
    listens. Raises ``OSError`` if it cannot listen.
    """
    runner = web.AppRunner(app if app is not None else receiver.app, access_log=None, auto_decompress=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        if ready is not None:
            ready(int(runner.addresses[0][1]))
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await runner.cleanup()
