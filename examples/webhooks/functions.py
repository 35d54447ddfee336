"""The process function of the webhooks example: a flight becomes an event for its airline's endpoint.

Each airline (``carrier``) is one endpoint of the DynamicSpec's endpoint table; the event's key is
the plane (``tailnum``), so one plane's events reach its airline in order. Flights after
``max_day`` of the month are dropped (the demo sends the first week).
"""

from __future__ import annotations

from typing import Any

import orjson

from egress import MapFunction, RuntimeContext


class FlightToWebhook(MapFunction):
    """One event per flight: ``{"airline", "tailnum", "payload"}`` (``None`` after ``max_day``)."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        if row["day"] > int(ctx.parameters.get("max_day", 31)):
            return None
        event = {"type": "flight.departed" if row["dep_time"] is not None else "flight.cancelled",
                 "flight": f"{row['carrier']}{row['flight']}", "day": row["day"], "sched_dep_time":
                 row["sched_dep_time"], "origin": row["origin"], "dest": row["dest"], "tailnum": row["tailnum"]}
        return {"airline": row["carrier"], "tailnum": row["tailnum"], "payload": orjson.dumps(event).decode()}
