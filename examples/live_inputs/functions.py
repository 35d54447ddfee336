"""The process function of the live_inputs examples: an event row becomes its JSON payload."""

from __future__ import annotations

import orjson

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext


class EventToJson(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        row = {key: value.decode(errors="replace") if isinstance(value, bytes) else value
               for key, value in message.row.items()}
        output.add_message("requests", {"payload": orjson.dumps(row).decode()})
