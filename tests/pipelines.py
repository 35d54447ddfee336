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


class CallsApiPolitely(ProcessFunction):
    """Takes one unit of throttler ``api`` per message (manual throttling), then passes the payload on."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        await ctx.get_throttler_or_throw("api").throttle(1)
        output.add_message("requests", {"payload": message.row["payload"]})


class AsksForAnUnknownThrottler(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        assert ctx.try_get_throttler("nope") is None
        ctx.get_throttler_or_throw("nope")
