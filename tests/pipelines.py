"""Process functions used by the tests' pipelines."""

from __future__ import annotations

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext


class Passthrough(ProcessFunction):
    """Emits the input's ``payload`` column to ``requests`` unchanged (null stays null)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("requests", {"payload": message.row["payload"]})


class FailsOnSeven(ProcessFunction):
    """Raises on the message whose ``id`` is 7, to test error reporting and atomic batches."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        if message.row["id"] == 7:
            raise ValueError("cannot handle seven")
        output.add_message("requests", {"payload": message.row["payload"]})


class EmitsToUnknownStream(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("nowhere", {"payload": "x"})
