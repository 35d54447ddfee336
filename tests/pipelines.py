"""Process functions used by the tests' pipelines."""

from __future__ import annotations

from typing import Any, ClassVar

from egress import InitContext, MapFunction, Message, OutputCollector, ProcessFunction, RuntimeContext


class Passthrough(ProcessFunction):
    """Emits the input's ``payload`` column to ``requests`` unchanged (null stays null)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("requests", {"payload": message.row["payload"]})


class PassthroughMap(MapFunction):
    """:class:`Passthrough` as a map: the same ids, keys and payloads through the map path."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        return {"payload": row["payload"]}


class BlocksTheLoop(MapFunction):
    """A map that blocks the event loop's thread (a slow synchronous call, ``time.sleep``) for an
    hour, after saying so on stderr: the run's signal handling must not need the loop to turn."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        import sys
        import time

        print("blocking the loop", file=sys.stderr, flush=True)
        time.sleep(3600)
        return {"payload": row["payload"]}


class MapToNowhere(PassthroughMap):
    output_stream_id = "nowhere"


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


def binary_payload(index: int) -> bytes:
    """Message ``index``'s payload: all 256 byte values (NUL, and 0x80-0xFF, which alone are invalid
    UTF-8, included) rotated by ``index``, then ``index`` as 4 bytes, so every payload differs."""
    start = index % 256
    return bytes(range(start, 256)) + bytes(range(start)) + index.to_bytes(4, "big")


def expected_body(index: int) -> bytes:
    """What a sink must send for :class:`EmitsBinary`'s message ``index``: the bytes as they are,
    text as its UTF-8."""
    payload = binary_payload(index)
    return payload.decode("latin-1").encode() if index % 10 == 0 else payload


class EmitsBinary(ProcessFunction):
    """Emits :func:`binary_payload` of the input's ``id`` as ``bytes`` to ``requests`` (Flow's string
    is a byte string), except every tenth id, whose payload is those bytes decoded as ``latin-1``
    text (one character per byte), so that text and bytes share a stream: :func:`expected_body`."""

    output_stream = "requests"

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        index = message.row["id"]
        payload = binary_payload(index)
        output.add_message(self.output_stream, {"payload": payload.decode("latin-1") if index % 10 == 0 else payload})


class EmitsBinaryToLog(EmitsBinary):
    """:class:`EmitsBinary` to stream ``binary``, which another computation reads through the log."""

    output_stream = "binary"


class EmitsSurrogates(ProcessFunction):
    """Emits text with a lone surrogate (what ``surrogateescape`` decoding leaves) for id 3: a value
    that no encoding can store; the other ids pass their payload on."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        payload = b"\xff\xfe".decode("utf-8", "surrogateescape") if message.row["id"] == 3 else message.row["payload"]
        output.add_message("requests", {"payload": payload})


class RemembersBinary(EmitsBinary):
    """:class:`EmitsBinary`, keeping each payload in the external state table ``/payloads`` too
    (column ``payload``, a string column: text or bytes), keyed by the input's key."""

    def init(self, ctx: InitContext) -> None:
        self.table = ctx.external_state_client("/payloads", {"payload": str})

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        self.table.get(message.key).set_column("payload", binary_payload(message.row["id"]))
        await super().process_message(message, output, ctx)


class PassthroughToVip(ProcessFunction):
    """Emits the input's ``payload`` to ``requests_vip`` (one computation per quota class)."""

    stream = "requests_vip"

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message(self.stream, {"payload": message.row["payload"]})


class PassthroughToRegular(PassthroughToVip):
    stream = "requests_regular"


class PassthroughToBulk(PassthroughToVip):
    stream = "requests_bulk"


class Drops(ProcessFunction):
    """Emits nothing: a pipeline that only ingests (``benchmarks/ingest.py``'s ingest-only phases)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        return None


class RecordsStreams(ProcessFunction):
    """Emits nothing; appends ``(stream id, key, row)`` of each message it is given to :attr:`seen`
    (in the test's process: an embedded run), so a test sees what the function saw, in its order."""

    seen: ClassVar[list[tuple[str, tuple[Any, ...], dict[str, Any]]]] = []

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        RecordsStreams.seen.append((message.stream_id, message.key, message.row))


class SlowCountingRows(ProcessFunction):
    """Counts in internal state how often it processed each key and emits ``"<payload>:<count>"``
    (a row processed twice into state shows as ``:2``). Each call blocks the loop's thread for
    ``EGRESS_TEST_SECONDS_PER_ROW`` seconds (a slow synchronous call; default 0); after the third
    row it creates the file ``EGRESS_TEST_STARTED_FILE`` names, if any (a test's positive signal
    that the run is mid-epoch)."""

    def init(self, ctx: InitContext) -> None:
        import os

        self.times = ctx.state_client("times", int)
        self.seconds = float(os.environ.get("EGRESS_TEST_SECONDS_PER_ROW", "0"))
        self.started = os.environ.get("EGRESS_TEST_STARTED_FILE")
        self.rows = 0

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        import time
        from pathlib import Path

        time.sleep(self.seconds)  # noqa: ASYNC251 - the slow synchronous call this function stands for
        times = self.times.get(message.key)
        times.set(times.value + 1)
        output.add_message("requests", {"payload": f"{message.row['payload']}:{times.value}"})
        self.rows += 1
        if self.rows == 3 and self.started:
            Path(self.started).touch()  # noqa: ASYNC240 - once, a test's signal


class PassthroughUrl(ProcessFunction):
    """Emits the input's ``url`` and ``payload`` columns to ``requests`` (a webhook sink's ``url_column``)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("requests", {"url": message.row["url"], "payload": message.row["payload"]})
