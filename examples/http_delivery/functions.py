"""The process function of the http_delivery example: a flight row becomes a JSON payload.

A cancelled flight (no ``dep_time``) gives a null payload, which the async HTTP sink acknowledges
in order without a request.
"""

from __future__ import annotations

import orjson

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext


class FlightToJson(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        row = message.row
        payload = None if row["dep_time"] is None else orjson.dumps(row).decode()
        output.add_message("requests", {"payload": payload})
