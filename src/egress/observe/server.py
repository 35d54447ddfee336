"""The operator's HTTP endpoint of a running pipeline: ``/metrics``, ``/status``, ``/healthz``,
``/readyz``, and the live page at ``/`` with its ``/dashboard.json``.

``/metrics`` is the Prometheus text format of the run's registry; ``/status`` is JSON produced by
the runtime (status tree, partitions with their lag, the DynamicSpec's state); ``/healthz``
(liveness) answers ``ok`` while the process serves; ``/readyz`` (readiness) answers 200 with
``{"ready": true, "reasons": []}`` while the run is ready (``egress.observe.status.readiness``:
engine open, no sink blocked by a terminal failure, the DynamicSpec file valid), else 503 with the
reasons. Served by aiohttp on loopback unless told otherwise; every route, and a catch-all one
answering 404 and 405, has :func:`egress.http_expect.expect_handler` (no 500 for any ``Expect``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from egress.http_expect import expect_handler, unrouted_handler
from egress.observe.dashboard import Dashboard
from egress.observe.metrics import Metrics
from egress.observe.status import readiness

StatusProvider = Callable[[], Awaitable[dict[str, Any]]]
Refresh = Callable[[], Awaitable[None]]
ResumeEndpoint = Callable[[str], Awaitable[int]]


def status_application(metrics: Metrics, status: StatusProvider, refresh: Refresh | None = None,
                       dashboard: Dashboard | None = None,
                       resume_endpoint: ResumeEndpoint | None = None) -> web.Application:
    """An aiohttp application serving ``metrics`` (after ``refresh()`` updated the gauges computed on
    demand) and the JSON from ``status()``; with ``dashboard``, its page at ``/`` and its
    ``/dashboard.json`` (:mod:`egress.observe.dashboard`); with ``resume_endpoint``, ``POST
    /endpoints/{name}/resume`` (``egress endpoint resume``), answering ``{"resumed": N}`` (the sink
    instances that knew it; 404 when none did)."""

    async def get_metrics(request: web.Request) -> web.Response:
        if refresh is not None:
            await refresh()
        response = web.Response(body=metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def get_status(request: web.Request) -> web.Response:
        return web.json_response(await status())

    async def get_health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def get_ready(request: web.Request) -> web.Response:
        document = await status()
        ready = document.get("ready") or readiness(document)
        return web.json_response(ready, status=200 if ready["ready"] else 503)

    app = web.Application()
    routes = {"/metrics": get_metrics, "/status": get_status, "/healthz": get_health, "/readyz": get_ready}
    for path, handler in routes.items():
        app.router.add_get(path, handler, expect_handler=expect_handler)
    if dashboard is not None:
        dashboard.add_routes(app)
    if resume_endpoint is not None:
        async def post_resume(request: web.Request) -> web.Response:
            resumed = await resume_endpoint(request.match_info["name"])
            return web.json_response({"resumed": resumed}, status=200 if resumed else 404)

        app.router.add_post("/endpoints/{name}/resume", post_resume, expect_handler=expect_handler)
    allowed = {resource.canonical: "POST" if resource.canonical.startswith("/endpoints/") else "GET, HEAD"
               for resource in app.router.resources()}
    app.router.add_route("*", "/{tail:.*}", unrouted_handler(allowed), expect_handler=expect_handler)
    return app


class StatusServer:
    """Starts and stops :func:`status_application` on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, metrics: Metrics, status: StatusProvider, host: str = "127.0.0.1", port: int = 0,
                 refresh: Refresh | None = None, dashboard: Dashboard | None = None,
                 resume_endpoint: ResumeEndpoint | None = None) -> None:
        self._app = status_application(metrics, status, refresh, dashboard, resume_endpoint)
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        """Raises ``OSError`` when the address cannot be bound."""
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        self.port = server.sockets[0].getsockname()[1] if server is not None else self._port  # type: ignore[attr-defined]

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
