"""The throttler service's page (``egress throttler serve``, at ``/``): each throttler's granted rate
against its limit, its queue and the share of each class against its weight
(:mod:`egress.observe.dashboard`)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from egress.observe.dashboard import Dashboard
from egress.throttler.controller import ThrottlerController


def add_dashboard(app: web.Application, controller: ThrottlerController, registry: CollectorRegistry) -> None:
    """Serve the page and ``/dashboard.json`` of ``controller`` (its sensors on ``registry``)."""

    def limits() -> dict[str, float | None]:
        return {throttler_id: controller.spec(throttler_id).rate for throttler_id in controller.throttler_ids}

    Dashboard(registry, controller.clock, title="throttler service", limits=limits).add_routes(app)
