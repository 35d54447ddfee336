"""MapFunction (egress.runtime.api): the epoch step's map path emits exactly what the equivalent
ProcessFunction emits (ids, seq numbers, keys, partitions, rows, positions, watermark), and refuses
what a map cannot do with errors naming the computation, the message and the fix."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress import InitContext, MapFunction, Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.clock import VirtualClock
from egress.engines import EpochCommit, LogMessage, SinkProgress
from egress.errors import ProcessFunctionError
from egress.keys import encode_key, source_message_id
from egress.runtime.epoch import EpochStep
from egress.runtime.invoke import Invoker
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue
from egress.spec import StreamSpec
from egress.testing import ProcessFunctionHarness

STREAMS = {
    "requests": StreamSpec.model_validate({
        "group_by": ["carrier"],
        "columns": [{"name": "carrier", "type": "string", "required": True}, {"name": "n", "type": "int64"}]}),
}


def doubled(row: dict[str, Any]) -> dict[str, Any] | None:
    """The transform under test: odd ``n`` dropped, even ones doubled, keyed by carrier; a negative
    even ``n`` gives a row without ``n`` (optional), 0 one with ``n`` null, 2 one with ``n`` a bool
    (refused: the epoch fails), 4 one with ``n`` a float (refused)."""
    n = row["n"]
    if n % 2:
        return None
    special: dict[int, dict[str, Any]] = {0: {"n": None}, 2: {"n": True}, 4: {"n": 4.0}}
    if n < 0:
        return {"carrier": row["carrier"]}
    return {"carrier": row["carrier"], **special.get(n, {"n": n * 2})}


class DoubleMap(MapFunction):
    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        return doubled(row)


class DoubleProcess(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        row = doubled(message.row)
        if row is not None:
            output.add_message("requests", row)


def make_step(function: ProcessFunction, *, sink: bool, logged: bool) -> EpochStep:
    clock = VirtualClock(100)
    store, timers = StateStore(0, 4), TimerQueue()
    context = RuntimeContext(clock, 0, None, lambda: None, lambda: None)
    invoker = Invoker("deliver", function, context, store, timers, ["requests"], STREAMS)
    return EpochStep(invoker, 0, 4, sink_streams={"requests"} if sink else set(),
                     logged_streams=None if logged else frozenset(), positions={("input", 0): 3},
                     next_seq=5, watermark=10.0)


def batch_of(rows: list[tuple[str, int, float | None]], first_offset: int = 3) -> list[LogMessage]:
    return [LogMessage("input", 0, first_offset + i, source_message_id("test", 0, first_offset + i),
                       encode_key([i]), timestamp, {"carrier": carrier, "n": n})
            for i, (carrier, n, timestamp) in enumerate(rows)]


async def commit_of(function: ProcessFunction, batch: list[LogMessage], *, sink: bool,
                    logged: bool) -> EpochCommit | str:
    """The epoch's commit record, or the text of the ``ProcessFunctionError`` that failed it."""
    step = make_step(function, sink=sink, logged=logged)
    try:
        commit = step.record(2, await step.invoke(batch, []), {"http": SinkProgress()})
    except ProcessFunctionError as error:
        return str(error).split(" (message ")[0]  # the rest names the handling call: says "map" or not
    assert commit is not None
    return commit


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["AA", "B6", "UA", "DL"]), st.integers(-5, 40),
                               st.one_of(st.none(), st.floats(0, 100, allow_nan=False))), max_size=30),
       sink=st.booleans(), logged=st.booleans())
async def test_the_map_path_commits_exactly_what_the_equivalent_process_function_commits(
        rows: list[tuple[str, int, float | None]], sink: bool, logged: bool) -> None:
    batch = batch_of(rows)
    assert await commit_of(DoubleMap(), batch, sink=sink, logged=logged) == \
        await commit_of(DoubleProcess(), batch, sink=sink, logged=logged)


async def test_a_map_returning_none_emits_nothing_and_still_advances_the_position() -> None:
    commit = await commit_of(DoubleMap(), batch_of([("AA", 1, None), ("AA", 3, None)]), sink=True, logged=False)
    assert isinstance(commit, EpochCommit)
    assert (commit.outbox, commit.log_appends) == ([], [])
    assert commit.input_positions == {("input", 0): 5}


class Raising(MapFunction):
    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        raise KeyError("tailnum")


class WrongColumn(MapFunction):
    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        return {"carrier": "AA", "n": "seven"}


class NotADict(MapFunction):
    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> Any:
        return [row]


@pytest.mark.parametrize(("function", "says"), [
    (Raising(), "process function of computation 'deliver' raised on message "),
    (WrongColumn(), "column 'n' is int64, got str (message "),
    (NotADict(), "NotADict.map of computation 'deliver' returned list, not a dict or None, for message "),
    (NotADict(), "a map returns one row or None; a function that emits several rows per message is a ProcessFunction"),
])
async def test_a_map_that_raises_or_returns_a_bad_row_fails_the_batch_naming_the_message(
        function: MapFunction, says: str) -> None:
    batch = batch_of([("AA", 2, None)])
    with pytest.raises(ProcessFunctionError) as raised:
        await make_step(function, sink=True, logged=False).invoke(batch, [])
    assert says in str(raised.value)
    assert batch[0].message_id.hex().upper() in str(raised.value)
    assert "with key [0] (partition 0)" in str(raised.value)


class AsyncMap(MapFunction):
    async def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:  # type: ignore[override]
        return row


class ToAudit(DoubleMap):
    output_stream_id = "audit"


class Stateful(DoubleMap):
    def init(self, ctx: InitContext) -> None:
        ctx.state_client("seen", dict)  # type: ignore[arg-type]


def invoker_for(function: ProcessFunction, outputs: list[str] | None) -> Invoker:
    """The invoker a partition job makes for ``function`` in a computation with ``outputs``."""
    store = StateStore(0, 4)
    context = InitContext(VirtualClock(0), 0, store)
    function.init(context)
    return Invoker("deliver", function, context, store, TimerQueue(), outputs)


@pytest.mark.parametrize(("function", "outputs", "says"), [
    (DoubleMap(), ["requests", "audit"], "does not say its output stream and the computation has 2 output_stream_ids "
                                         "(['requests', 'audit']): set DoubleMap.output_stream_id to one of them"),
    (DoubleMap(), [], "has no output_stream_ids: add the stream it emits to the computation's output_stream_ids "
                      "(egress.testing.ProcessFunctionHarness: pass output_stream_ids=[...])"),
    (DoubleMap(), None, "has no output_stream_ids"),
    (AsyncMap(), ["requests"], "AsyncMap.map is async: a MapFunction's map is a plain (synchronous) def"),
    (ToAudit(), ["requests"], "emits to output_stream_id 'audit', which is not one of the computation's "
                              "output_stream_ids ['requests']: add 'audit' to them, or set ToAudit.output_stream_id"),
    (Stateful(), ["requests"], "is a MapFunction, which keeps no state, but its init obtained state clients: "
                               "derive it from ProcessFunction instead"),
])
def test_a_map_whose_output_stream_is_ambiguous_or_that_keeps_state_is_refused_at_start(
        function: ProcessFunction, outputs: list[str] | None, says: str) -> None:
    with pytest.raises(ProcessFunctionError, match="computation 'deliver'") as raised:
        invoker_for(function, outputs)
    assert says in str(raised.value)


def test_a_map_names_its_stream_when_the_computation_has_several() -> None:
    assert invoker_for(ToAudit(), ["requests", "audit"]).map_stream_id == "audit"
    assert invoker_for(DoubleMap(), ["requests"]).map_stream_id == "requests"
    assert invoker_for(DoubleProcess(), ["requests"]).map_stream_id is None


async def test_the_testing_harness_drives_a_map_function_as_a_pipeline_would() -> None:
    harness = ProcessFunctionHarness(DoubleMap, output_stream_ids=["requests"], streams=STREAMS)
    emitted = await harness.process_message({"carrier": "B6", "n": 6})
    assert [(e.stream_id, e.row, e.key) for e in emitted] == [("requests", {"carrier": "B6", "n": 12}, ("B6",))]
    assert await harness.process_message({"carrier": "B6", "n": 5}) == []


async def test_process_message_of_a_map_with_its_stream_named_emits_the_mapped_row() -> None:
    output = OutputCollector()
    await ToAudit().process_message(Message("input", (), {"carrier": "AA", "n": 6}, b"id"), output,
                                    RuntimeContext(VirtualClock(0), 0))
    assert [(m.stream_id, m.row) for m in output.messages] == [("audit", {"carrier": "AA", "n": 12})]
    with pytest.raises(TypeError, match="needs output_stream_id; the runtime calls map"):
        await DoubleMap().process_message(Message("input", (), {"carrier": "AA", "n": 6}, b"id"), output,
                                          RuntimeContext(VirtualClock(0), 0))
