"""The process function of the http_delivery example: a flight row becomes a JSON payload.

A cancelled flight (no ``dep_time``) gives a null payload, which the async HTTP sink acknowledges
in order without a request.
"""

from __future__ import annotations

from typing import Any

import orjson

from egress import MapFunction, RuntimeContext


class FlightToJson(MapFunction):
    """A map (``egress.MapFunction``): one output row per flight, to the computation's only output stream."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        return {"payload": None if row["dep_time"] is None else orjson.dumps(row).decode()}
