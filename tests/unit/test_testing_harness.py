"""egress.testing itself: outputs with keys from the stream schema, schema errors as in a pipeline,
calling a pending timer directly, and dynamic parameters changed between calls."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.errors import ProcessFunctionError
from egress.spec import StreamSpec
from egress.testing import Emitted, ProcessFunctionHarness

OUT = StreamSpec.model_validate({"schema": [{"name": "city", "type": "string", "required": True},
                                            {"name": "n", "type": "int64"}], "group_by": ["city"]})


class Limits(BaseModel):
    factor: int = 1


class Scale(ProcessFunction):
    dynamic_parameters_model = Limits

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"city": message.row["city"], "n": message.row["n"] * ctx.dynamic_parameters.factor})
        output.add_timer(ctx.now() + 10)

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"city": "timer", "n": int(timer.trigger_timestamp)})


async def test_outputs_are_keyed_by_group_by_and_parameters_change_live() -> None:
    h = ProcessFunctionHarness(Scale, now=0, output_stream_ids=["out"], streams={"out": OUT})
    assert await h.process_message({"city": "Oslo", "n": 2}) == [Emitted("out", {"city": "Oslo", "n": 2}, ("Oslo",))]
    h.set_dynamic_parameters({"factor": 3})
    assert (await h.process_message({"city": "Rome", "n": 2}))[0].row["n"] == 6
    assert len(h.outputs) == 2
    assert h.timers() == [((), 10.0)]
    assert await h.process_timer((), 10.0) == [Emitted("out", {"city": "timer", "n": 10}, ("timer",))]
    assert h.timers() == []  # the pending timer was the one called


async def test_schema_errors_are_the_pipeline_errors() -> None:
    h = ProcessFunctionHarness(Scale, output_stream_ids=["out"], streams={"out": OUT})
    with pytest.raises(ProcessFunctionError, match="column 'n' is int64, got str"):
        await h.process_message({"city": "Oslo", "n": "2"})
    with pytest.raises(ProcessFunctionError, match="unknown output stream 'out'"):
        await ProcessFunctionHarness(Scale, output_stream_ids=["elsewhere"]).process_message({"city": "x", "n": 1})


BINARY = StreamSpec.model_validate({"schema": [{"name": "city", "type": "string", "required": True},
                                               {"name": "payload", "type": "string"}], "group_by": ["city"]})


class EmitsRaw(ProcessFunction):
    """Emits the input's ``city`` and ``payload`` as they are (text or bytes)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"city": message.row["city"], "payload": message.row["payload"]})


async def test_bytes_for_a_string_column_pass_the_checks_and_a_utf8_key_is_its_text() -> None:
    h = ProcessFunctionHarness(EmitsRaw, output_stream_ids=["out"], streams={"out": BINARY})
    every_byte = bytes(range(256))
    assert await h.process_message({"city": b"Oslo", "payload": every_byte}) == [
        Emitted("out", {"city": b"Oslo", "payload": every_byte}, ("Oslo",))]


async def test_a_value_no_encoding_can_store_raises_the_error_a_pipeline_commit_would() -> None:
    from egress.errors import RowEncodingError
    from egress.keys import derived_message_id, source_message_id

    h = ProcessFunctionHarness(EmitsRaw, output_stream_ids=["out"], streams={"out": BINARY}, computation_id="raw")
    with pytest.raises(RowEncodingError) as raised:
        await h.process_message({"city": "Oslo", "payload": "\udcff"})
    key = derived_message_id(source_message_id("testing", 0, 0), 0).hex().upper()
    assert str(raised.value).startswith(f"computation 'raw' partition 0 emitted message {key} to stream 'out' whose "
                                        "column 'payload' cannot be stored (string contains surrogates")
    assert h.outputs == []


async def test_a_group_by_value_of_bytes_that_are_not_utf8_fails_the_message_naming_the_column() -> None:
    h = ProcessFunctionHarness(EmitsRaw, output_stream_ids=["out"], streams={"out": BINARY}, computation_id="raw")
    with pytest.raises(ProcessFunctionError) as raised:
        await h.process_message({"city": b"\xff", "payload": None})
    assert str(raised.value).startswith(
        "computation 'raw' emitted a row for stream 'out' whose group_by column(s) ['city'] cannot be a key "
        "(a key value must be text; these bytes are not UTF-8")
    assert "while handling message " in str(raised.value)


TYPED = StreamSpec.model_validate({"schema": [{"name": "n", "type": "int64"}, {"name": "x", "type": "double"},
                                              {"name": "flag", "type": "boolean"}]})


class EmitsRow(ProcessFunction):
    """Emits the input row as it is."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", dict(message.row))


@pytest.mark.parametrize(("row", "error"), [
    ({"n": True}, "column 'n' is int64, got bool"),
    ({"x": False}, "column 'x' is double, got bool"),
    ({"flag": 1}, "column 'flag' is boolean, got int"),
    ({"n": 1.0}, "column 'n' is int64, got float"),
])
async def test_a_value_of_a_near_type_is_refused(row: dict[str, object], error: str) -> None:
    """The exact-type check of emitted rows (one lookup per column) lets through only the column's
    own types: a bool is an int to Python, not an int64 or a double here."""
    h = ProcessFunctionHarness(EmitsRow, output_stream_ids=["out"], streams={"out": TYPED})
    with pytest.raises(ProcessFunctionError, match=error):
        await h.process_message(row)


async def test_subclasses_and_ints_are_values_of_their_columns() -> None:
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    h = ProcessFunctionHarness(EmitsRow, output_stream_ids=["out"], streams={"out": TYPED})
    emitted = await h.process_message({"n": Level.HIGH, "x": 2, "flag": True})
    assert emitted[0].row == {"n": 3, "x": 2, "flag": True}
