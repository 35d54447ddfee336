"""The standalone throttler service: a controller behind HTTP/JSON (``egress throttler serve``).

Endpoints (aiohttp): ``POST /v1/request_quota`` with ``{"throttler_id", "client_id", "amount",
"timestamp", "quota_class_id", "hold"}`` answers ``200 {"amount", "lease", "waited"}`` once the
amount is granted (units granted, seconds left of their lease, seconds the request was held here),
``400 {"error", "code"}`` with ``code`` ``unknown_throttler`` or ``invalid_amount`` (upstream texts)
or ``bad_request`` (so do ``413``, a body over :data:`MAX_CALL_BYTES`, and ``408``, one not whole
within 30 s, :func:`egress.http_body.read_body`), ``503`` while closing; a
client that disconnects cancels its request, which refunds it. ``GET /metrics`` (the throttler
sensors), ``GET /healthz``, the page at ``GET /`` with its ``GET /dashboard.json``
(:mod:`egress.throttler.dashboard`). The DynamicSpec file is re-read every ``reload_period``
seconds and applied live; an invalid file is reported and the last good configuration kept.

Restarts keep the envelope: with ``state_file`` the controller resumes from its restart horizon;
without one it starts as after a restart at an unknown time (every bucket empty and closed for one
lease). Every lease gets ``REPLY_ALLOWANCE`` seconds more for the reply's travel to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from egress.clock import Clock
from egress.errors import SpecError
from egress.http_body import DEFAULT_BODY_TIMEOUT, RequestBodyError, closing, read_body
from egress.http_expect import expect_handler
from egress.spec.models import load_dynamic_spec
from egress.throttler.controller import ThrottlerController
from egress.throttler.dashboard import add_dashboard
from egress.throttler.models import ThrottlerSpec, validate_dynamic_throttlers
from egress.throttler.sensors import ControllerCollector
from egress.throttler.wire import BadRequestError, answer_call, decode_call

log = logging.getLogger("egress.throttler.service")

REQUEST_QUOTA_PATH = "/v1/request_quota"
REPLY_ALLOWANCE = 0.05
"""Seconds added to every lease the service grants: a reply reaching its client later than that
after the grant is used on arrival, beyond what the bucket counted."""
MAX_CALL_BYTES = 1 << 20
"""The largest ``RequestQuota`` body read (a call is a few hundred bytes)."""


def load_throttlers(path: str | Path) -> dict[str, ThrottlerSpec]:
    """Load a DynamicSpec file and validate its ``throttlers``; raises :class:`SpecError`."""
    return validate_dynamic_throttlers(load_dynamic_spec(path), file=str(path))


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def make_app(controller: ThrottlerController, registry: CollectorRegistry | None = None, *,
             body_timeout: float = DEFAULT_BODY_TIMEOUT) -> web.Application:
    """The aiohttp application serving ``controller`` (mountable in another app); a call's body not
    whole within ``body_timeout`` seconds is answered ``408``."""
    registry = registry or CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(controller))

    async def request_quota(request: web.Request) -> web.Response:
        arrived = controller.clock.monotonic()
        try:
            call = decode_call(await read_body(request, max_bytes=MAX_CALL_BYTES, max_seconds=body_timeout))
        except BadRequestError as error:
            return _json(400, {"error": str(error), "code": "bad_request"})
        except RequestBodyError as error:
            return closing(_json(error.status, {"error": str(error), "code": "bad_request"}))
        granted, answer = await answer_call(controller, call, arrived)
        return _json(200 if granted else 503 if answer["code"] == "unavailable" else 400, answer)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def healthz(_: web.Request) -> web.Response:
        return _json(200, {"throttlers": controller.throttler_ids})

    allowed = {REQUEST_QUOTA_PATH: "POST", "/metrics": "GET, HEAD", "/healthz": "GET, HEAD"}

    async def elsewhere(request: web.Request) -> web.Response:
        """Any other method or path (a route, so that :func:`expect_handler` answers its ``Expect``)."""
        methods = allowed.get(request.path)
        if methods is not None:
            return web.Response(status=405, headers={"Allow": methods})
        return _json(404, {"error": f"no {request.method} {request.path!r}: POST {REQUEST_QUOTA_PATH}",
                           "code": "not_found"})

    app = web.Application()
    app.router.add_post(REQUEST_QUOTA_PATH, request_quota, expect_handler=expect_handler)
    app.router.add_get("/metrics", metrics, expect_handler=expect_handler)
    app.router.add_get("/healthz", healthz, expect_handler=expect_handler)
    add_dashboard(app, controller, registry)
    app.router.add_route("*", "/{tail:.*}", elsewhere, expect_handler=expect_handler)
    return app


class ThrottlerService:
    """A controller serving HTTP on ``host:port`` (0 = a free port), configured from a DynamicSpec file.

    ``state_file`` keeps the restart horizon (see :mod:`~egress.throttler.horizon`); without it the
    controller starts every bucket empty after one lease, as after a restart it cannot date.
    """

    def __init__(self, dynamic_spec: str | Path, clock: Clock, *, host: str = "127.0.0.1", port: int = 0,
                 reload_period: float = 1.0, state_file: str | Path | None = None) -> None:
        self.path = Path(dynamic_spec)
        self.clock = clock
        self.host, self.port = host, port
        self.reload_period = reload_period
        throttlers = load_throttlers(self.path)  # a missing or unreadable file is a SpecError naming it
        self._text = self.path.read_bytes()
        self.controller = ThrottlerController(throttlers, clock, state_file=state_file,
                                              assume_restart=True, allowance=REPLY_ALLOWANCE)
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Listen and start watching the file; returns the base URL."""
        self._runner = web.AppRunner(make_app(self.controller), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if server is not None:
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._reloader = asyncio.get_running_loop().create_task(self._watch())
        return self.url

    def reload(self) -> bool:
        """Re-read the DynamicSpec file; apply it when it changed and is valid. Returns whether applied."""
        try:
            text = self.path.read_bytes()
        except OSError as error:
            log.warning("cannot read %s: %s", self.path, error)
            return False
        if text == self._text:
            return False
        try:
            throttlers = load_throttlers(self.path)
        except SpecError as error:
            log.warning("keeping the last good throttlers: %s", error.format())
            return False
        self._text = text
        self.controller.reconfigure(throttlers)
        log.info("applied throttlers %s from %s", sorted(throttlers), self.path)
        return True

    async def _watch(self) -> None:
        while True:
            await self.clock.sleep(self.reload_period)
            self.reload()

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        await self.controller.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
