"""``egress receiver --protocol firehose``: a strict Firehose HTTP endpoint for users and tests.

It serves :class:`egress.firehose.FirehoseReceiver` with a handler that counts what it accepts
(records, request ids, repeated request ids, i.e. retried or replayed batches) and, with
``--record FILE``, appends one JSON line per accepted request. ``GET /stats`` answers the counts,
``GET /health`` 200. Faults are injected before the receiver runs: a share ``fail_rate`` of POSTs
is answered ``fail_status`` with a protocol-shaped JSON error body, after ``delay`` seconds.

Access keys come only from environment variables named with ``--access-key-env`` (repeat it to
accept several keys during a rotation); they are never printed or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any

import orjson
import typer
from aiohttp import web
from rich.console import Console
from rich.text import Text

from egress.cli.addresses import cannot_serve
from egress.errors import SecretUnavailable
from egress.firehose import FirehoseReceiver, ReceiverOptions, serve
from egress.firehose import protocol as p
from egress.http_body import RequestBodyError, closing, read_body
from egress.secret_references import read_secret, variable

STATS_PATH = "/stats"
console = Console(stderr=True, soft_wrap=True)


class RecordingHandler:
    """A receiver handler that keeps counts and optionally appends a JSON line per accepted request.

    A line holds ``time`` (s), ``requestId``, ``records`` (count), ``bytes`` (sum of record sizes),
    ``sha256`` (over the records, each prefixed by its length as 8 bytes big-endian) and
    ``commonAttributes``. The file is line-buffered so a killed receiver loses nothing it answered.
    """

    def __init__(self, record: Path | None = None) -> None:
        self.record_path = record
        self.request_ids: Counter[str] = Counter()
        self.records = 0
        self.record_bytes = 0
        self._file: IO[str] | None = None

    def open(self) -> None:
        if self.record_path is not None:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.record_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def __call__(self, request_id: str, records: list[bytes], common_attributes: dict[str, str]) -> None:
        digest = hashlib.sha256()
        size = 0
        for record in records:
            digest.update(len(record).to_bytes(8, "big"))
            digest.update(record)
            size += len(record)
        self.request_ids[request_id] += 1
        self.records += len(records)
        self.record_bytes += size
        if self._file is not None:
            self._file.write(orjson.dumps({
                "time": time.time(), "requestId": request_id, "records": len(records), "bytes": size,
                "sha256": digest.hexdigest(), "commonAttributes": common_attributes,
            }).decode() + "\n")

    def stats(self) -> dict[str, Any]:
        return {
            "distinct_request_ids": len(self.request_ids),
            "repeated_request_ids": sum(1 for count in self.request_ids.values() if count > 1),
            "records": self.records,
            "record_bytes": self.record_bytes,
        }


def build_app(
    receiver: FirehoseReceiver,
    recorder: RecordingHandler,
    *,
    fail_rate: float = 0.0,
    fail_status: int = 503,
    delay: float = 0.0,
    seed: int | None = None,
) -> web.Application:
    """The CLI's application: ``GET /stats``, fault injection on POSTs, then the receiver."""
    rng = random.Random(seed)

    @web.middleware
    async def faults(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        if delay > 0:
            await asyncio.sleep(delay)
        if fail_rate > 0 and rng.random() < fail_rate:
            status, message, refused = fail_status, "injected failure", False
            options = receiver.options
            try:  # the whole body first, as the receiver would read it
                await read_body(request, max_bytes=options.max_body_bytes, max_seconds=options.body_timeout)
            except RequestBodyError as error:
                status, message, refused = error.status, str(error), True
            request_id = request.headers.get(p.HEADER_REQUEST_ID, "")
            receiver.stats.requests += 1
            receiver.stats.by_status[status] += 1
            body = p.response_body(request_id, int(time.time() * 1000), message)
            response = web.Response(status=status, body=body, content_type=p.CONTENT_TYPE_JSON)
            return closing(response) if refused else response
        return await handler(request)

    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({**receiver.stats.as_json(), **recorder.stats()}),
                            content_type=p.CONTENT_TYPE_JSON)

    app = web.Application(middlewares=[faults])
    app.router.add_get(STATS_PATH, stats)
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    return app


def access_keys_from_environment(names: Sequence[str]) -> tuple[str, ...]:
    """The values of the environment variables ``names``, in order.

    Raises ``ValueError`` naming (never showing) a variable that is unset, empty or over 4096 bytes.
    """
    keys = []
    for name in names:
        value = ""
        with contextlib.suppress(SecretUnavailable):  # unset: the same as empty below
            value = read_secret(env=name) or ""
        if not value:
            raise ValueError(f"{variable(name)} (an access key) is not set or empty: export it before "
                             "starting the receiver")
        if len(value.encode()) > p.MAX_ACCESS_KEY_BYTES:
            raise ValueError(f"{variable(name)} holds more than {p.MAX_ACCESS_KEY_BYTES} bytes")
        keys.append(value)
    return tuple(keys)


def run_firehose_receiver(
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    access_key_env: Sequence[str] = (),
    record: Path | None = None,
    fail_rate: float = 0.0,
    fail_status: int = 503,
    delay: float = 0.0,
    seed: int | None = None,
    path: str | None = None,
) -> None:
    """Serve the Firehose receiver until SIGINT or SIGTERM; prints the URL once listening.

    ``port`` 0 picks a free port (printed). Raises ``typer.Exit(2)`` when an access-key variable is
    missing and ``typer.Exit(1)`` when it cannot listen.
    """
    try:
        keys = access_keys_from_environment(access_key_env)
    except ValueError as error:
        console.print(Text(f"egress: {error}", style="red"))
        raise typer.Exit(2) from None
    handler = RecordingHandler(record)
    receiver = FirehoseReceiver(handler, ReceiverOptions(access_keys=keys, path=path))
    app = build_app(receiver, handler, fail_rate=fail_rate, fail_status=fail_status, delay=delay, seed=seed)

    def ready(bound: int) -> None:
        auth = f"{len(keys)} access key(s)" if keys else "no access key"
        print(f"egress firehose receiver listening on http://{host}:{bound}/ ({auth}; GET /health, GET /stats)",
              flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        handler.open()
        try:
            await serve(receiver, host, port, ready=ready, stop=stop, app=app)
        finally:
            handler.close()

    try:
        asyncio.run(main())
    except OSError as error:
        console.print(Text(cannot_serve(host, port, error), style="red"))
        raise typer.Exit(1) from None
