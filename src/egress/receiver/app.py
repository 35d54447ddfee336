"""``egress receiver``: a local HTTP endpoint that records and counts what it is sent.

For users trying egress and for tests: every request is recorded (time, method, path, headers,
body sha256 and length, idempotency key) as a JSON line when a record file is given; duplicates
are counted per idempotency key; faults can be injected (a failure rate with a status, a delay).
``GET /stats`` answers the counts as JSON. Only requests that got a 2xx count as delivered.

A hold stops answering at a chosen count, so a test or a demo can act while a run is provably
mid-way whatever the machine's speed: ``hold_after`` N answers N requests, then reads and holds
every further one unanswered; ``POST /hold?after=M`` answers M more (those held first) and holds
again; ``POST /release`` answers the held and every later request. Both answer the stats, whose
``held`` counts the requests held now. A held request is recorded when it is answered, with the
time it was read; held requests are answered when the receiver stops.

``fail_paths`` (``--fail-path``) are paths answered ``fail_status`` (an endpoint that is down);
``POST /fail-path?path=P`` adds one on a running receiver, ``POST /fail-path?path=P&up=1`` removes it.

With ``verify_keys`` (``egress receiver --verify-secret FILE``) every request must carry a valid
Standard Webhooks signature by one of the keys, its timestamp within 5 minutes
(``egress.webhook_signatures.verify``, constant-time comparisons); one that does not is answered
``401`` with the reason, counted in ``signature_failures`` and not delivered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from egress.http_body import DEFAULT_BODY_TIMEOUT, RequestBodyError, closing, read_body
from egress.http_expect import expect_handler
from egress.webhook_signatures import DEFAULT_TOLERANCE, verify

STATS_PATH = "/stats"
HOLD_PATH = "/hold"
RELEASE_PATH = "/release"
FAIL_PATH = "/fail-path"


@dataclass
class ReceiverConfig:
    """``fail_rate`` in [0, 1]: share of requests answered ``fail_status`` instead of 200;
    ``delay`` seconds before answering; ``fail_first``: the first N requests of each idempotency
    key are answered ``fail_status`` (a deterministic transient failure); ``idempotency_header``
    names the key header;
    ``record`` is a JSONL file path (appended to) or ``None``; ``seed`` makes faults repeatable;
    ``hold_after``: answer this many requests, then hold every further one until released
    (``None``: never hold);
    a body over ``max_body_bytes`` is answered ``413``, one not whole within ``body_timeout``
    seconds ``408`` (:func:`egress.http_body.read_body`; neither is counted nor recorded)."""

    fail_rate: float = 0.0
    fail_status: int = 503
    delay: float = 0.0
    fail_first: int = 0
    idempotency_header: str = "Idempotency-Key"
    record: Path | None = None
    seed: int | None = None
    hold_after: int | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    verify_keys: tuple[bytes, ...] = ()
    verify_tolerance: float = DEFAULT_TOLERANCE
    fail_paths: set[str] = field(default_factory=set)


class Hold:
    """Answers ``remaining`` more requests, then holds each further one until :meth:`answer_more`
    (``remaining`` ``None``: answers every request); ``held`` counts the requests waiting now."""

    def __init__(self, after: int | None) -> None:
        self.remaining = after
        self.held = 0
        self._opened = asyncio.Event()
        if after is None:
            self._opened.set()

    def answer_more(self, count: int | None) -> None:
        """Answer ``count`` more requests (the held ones wake first), then hold again; ``None``: hold no more."""
        self.remaining = count
        opened, self._opened = self._opened, asyncio.Event()
        opened.set()
        if count is None:
            self._opened.set()

    async def turn(self) -> None:
        """Return when this request may be answered."""
        while self.remaining is not None:
            if self.remaining > 0:
                self.remaining -= 1
                return
            self.held += 1
            try:
                await self._opened.wait()
            finally:
                self.held -= 1


@dataclass
class ReceiverStats:
    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    delivered_keys: Counter[str] = field(default_factory=Counter)
    attempts_by_key: Counter[str] = field(default_factory=Counter)
    requests_without_key: int = 0
    bytes_received: int = 0
    first_request_at: float | None = None
    last_request_at: float | None = None
    signature_failures: int = 0
    verified: int = 0

    def as_json(self, held: int = 0) -> dict[str, Any]:
        duplicates = sum(count - 1 for count in self.delivered_keys.values())
        return {
            "requests": self.requests,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "delivered": sum(self.delivered_keys.values()),
            "distinct_keys": len(self.delivered_keys),
            "duplicates": duplicates,
            "duplicate_keys": sum(1 for c in self.delivered_keys.values() if c > 1),
            "requests_without_key": self.requests_without_key,
            "bytes_received": self.bytes_received,
            "first_request_at": self.first_request_at,
            "last_request_at": self.last_request_at,
            "held": held,
            "signature_failures": self.signature_failures,
            "verified": self.verified,
        }


class Receiver:
    """The aiohttp application and its counters; ``app`` is mountable in another application."""

    def __init__(self, config: ReceiverConfig | None = None) -> None:
        self.config = config or ReceiverConfig()
        self.stats = ReceiverStats()
        self._random = random.Random(self.config.seed)
        self._record: IO[str] | None = None
        self.hold = Hold(self.config.hold_after)
        self.app = web.Application()
        self.app.router.add_get(STATS_PATH, self._stats, expect_handler=expect_handler)
        self.app.router.add_post(HOLD_PATH, self._hold, expect_handler=expect_handler)
        self.app.router.add_post(RELEASE_PATH, self._release, expect_handler=expect_handler)
        self.app.router.add_post(FAIL_PATH, self._fail_path, expect_handler=expect_handler)
        self.app.router.add_route("*", "/{tail:.*}", self._receive, expect_handler=expect_handler)
        self.app.on_startup.append(self._open)
        self.app.on_cleanup.append(self._close)

    async def _open(self, app: web.Application) -> None:
        if self.config.record is not None:
            self.config.record.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: a record survives the receiver being killed, which tests of crashes rely on.
            self._record = open(self.config.record, "a", encoding="utf-8", buffering=1)  # noqa: SIM115, ASYNC230

    async def _close(self, app: web.Application) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.as_json(self.hold.held))

    async def _hold(self, request: web.Request) -> web.Response:
        after = request.query.get("after", "0")
        if not (after.isascii() and after.isdecimal()):
            return web.Response(status=400, text=f"after={after!r}: give a count of requests, "
                                                 f"e.g. {HOLD_PATH}?after=100\n")
        self.hold.answer_more(int(after))
        return await self._stats(request)

    async def _release(self, request: web.Request) -> web.Response:
        self.hold.answer_more(None)
        return await self._stats(request)

    async def _fail_path(self, request: web.Request) -> web.Response:
        path = request.query.get("path", "")
        if not path.startswith("/"):
            return web.Response(status=400, text=f"path={path!r}: give the path to fail, e.g. "
                                                 f"{FAIL_PATH}?path=/hooks/a (add &up=1 to answer it again)\n")
        if request.query.get("up") == "1":
            self.config.fail_paths.discard(path)
        else:
            self.config.fail_paths.add(path)
        return await self._stats(request)

    async def _receive(self, request: web.Request) -> web.Response:
        config = self.config
        try:
            body = await read_body(request, max_bytes=config.max_body_bytes, max_seconds=config.body_timeout)
        except RequestBodyError as error:  # e.g. Content-Encoding: gzip over a body that is not
            return closing(web.Response(status=error.status, text=f"{error}\n"))
        now = time.time()
        await self.hold.turn()
        stats = self.stats
        if config.verify_keys:
            refused = verify(config.verify_keys, request.headers, body, time.time(), config.verify_tolerance)
            if refused is not None:
                stats.signature_failures += 1
                return web.Response(status=401, text=f"signature refused: {refused}\n")
            stats.verified += 1
        if config.delay > 0:
            await asyncio.sleep(config.delay)
        status = 200
        if config.fail_rate > 0 and self._random.random() < config.fail_rate:
            status = config.fail_status
        if config.fail_paths and request.path in config.fail_paths:
            status = config.fail_status
        key = request.headers.get(config.idempotency_header)
        if key is not None and config.fail_first:
            stats.attempts_by_key[key] += 1
            if stats.attempts_by_key[key] <= config.fail_first:
                status = config.fail_status
        stats.requests += 1
        stats.by_status[status] += 1
        stats.bytes_received += len(body)
        stats.first_request_at = stats.first_request_at or now
        stats.last_request_at = now
        if key is None:
            stats.requests_without_key += 1
        elif 200 <= status <= 299:
            stats.delivered_keys[key] += 1
        if self._record is not None:
            self._record.write(json.dumps({
                "time": now,
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body_sha256": hashlib.sha256(body).hexdigest(),
                "body_bytes": len(body),
                "idempotency_key": key,
                "status": status,
            }) + "\n")
        return web.Response(status=status, text="ok\n" if status == 200 else "injected failure\n")


async def serve(config: ReceiverConfig, host: str, port: int, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve a :class:`Receiver` on ``host:port`` until ``stop`` is set (or forever)."""
    receiver = Receiver(config)
    runner = web.AppRunner(receiver.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    if ready is not None:
        ready.set()
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        receiver.hold.answer_more(None)  # shutting down waits for the handlers: answer the held first
        if receiver._record is not None:
            receiver._record.flush()
        await runner.cleanup()
