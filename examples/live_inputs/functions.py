"""The process function of the live_inputs examples: an event row becomes its JSON payload."""

from __future__ import annotations

from typing import Any

import orjson

from egress import MapFunction, RuntimeContext


class EventToJson(MapFunction):
    """A map (``egress.MapFunction``): one payload per event, to the computation's only output stream."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        text = {key: value.decode(errors="replace") if isinstance(value, bytes) else value
                for key, value in row.items()}
        return {"payload": orjson.dumps(text).decode()}
