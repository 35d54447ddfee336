"""The epoch step (egress.runtime.epoch): timers fire before the batch, outputs get their derived ids
and dense ``seq`` numbers, go to the outbox or the log by stream, and the commit record carries the
new positions, state, timers and watermark; an epoch that changed nothing has no commit."""

from __future__ import annotations

import dataclasses

import pytest

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.clock import VirtualClock
from egress.engines import LogMessage, SinkProgress
from egress.keys import derived_message_id, encode_key, partition_of
from egress.runtime.epoch import EpochStep
from egress.runtime.invoke import Invoker
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue, timer_message_id


class Echo(ProcessFunction):
    """Each message goes to ``delivered`` (a sink's stream) and ``audit`` (read downstream); a timer
    at now + 5 is set; a timer emits one ``delivered`` message."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("delivered", dict(message.row), key=message.key)
        output.add_message("audit", dict(message.row), key=message.key)
        output.add_timer(ctx.now() + 5)

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("delivered", {"n": -1}, key=timer.key)


def make_step(clock: VirtualClock, timers: TimerQueue, *, watermark: float | None = None,
              committed_progress: dict[str, SinkProgress] | None = None) -> EpochStep:
    store = StateStore(0, 4)
    context = RuntimeContext(clock, 0, None, lambda: None, lambda: None)
    invoker = Invoker("deliver", Echo(), context, store, timers, ["delivered", "audit"])
    return EpochStep(invoker, 0, 4, sink_streams={"delivered"}, logged_streams=frozenset({"audit"}),
                     positions={("input", 0): 7}, next_seq=11, watermark=watermark,
                     committed_progress=committed_progress)


def log_message(offset: int, key: str, timestamp: float) -> LogMessage:
    return LogMessage("input", 0, offset, f"id-{offset}".encode(), encode_key([key]), timestamp, {"n": offset})


async def test_timers_fire_before_the_batch_and_outputs_are_routed_with_derived_ids_and_dense_seqs() -> None:
    clock, timers = VirtualClock(100), TimerQueue()
    step = make_step(clock, timers, watermark=50.0)
    key = encode_key(["a"])
    output = await step.invoke([log_message(7, "a", 60.0), log_message(8, "b", 55.0)], [(key, 100.0, "processing")])
    timer_id = timer_message_id("deliver", key, 100.0, "processing")
    assert [(m.seq, m.message_id) for m in output.outbox] == [
        (11, derived_message_id(timer_id, 0)), (12, derived_message_id(b"id-7", 0)),
        (13, derived_message_id(b"id-8", 0))]
    assert [(a[0], a[1], a[2]) for a in output.log_appends] == [
        ("audit", partition_of(encode_key(["a"]), 4), derived_message_id(b"id-7", 1)),
        ("audit", partition_of(encode_key(["b"]), 4), derived_message_id(b"id-8", 1))]
    commit = step.record(3, output, {"http": SinkProgress()})
    assert commit is not None
    assert (commit.consumer, commit.partition, commit.generation) == ("deliver", 0, 3)
    assert commit.input_positions == {("input", 0): 9}
    assert commit.watermark == 60.0  # raised by the first message, not lowered by the second
    assert sorted(t[0] for t in commit.timers_set) == [encode_key(["a"]), encode_key(["b"])]
    assert commit.outbox_acknowledged_seq == 0
    assert step.next_seq == 14


async def test_an_epoch_that_changed_nothing_has_no_commit_and_new_sink_progress_has_one() -> None:
    clock, timers = VirtualClock(100), TimerQueue()
    committed = {"http": SinkProgress("", b"m", 4)}
    step = make_step(clock, timers, committed_progress=committed)
    nothing = await step.invoke([], [])
    assert step.record(1, nothing, dict(committed)) is None
    advanced = {"http": SinkProgress("", b"n", 6)}
    commit = step.record(1, nothing, advanced)
    assert commit is not None
    assert (commit.outbox, commit.log_appends, commit.watermark) == ([], [], None)
    assert commit.outbox_acknowledged_seq == 6
    step.committed(commit)
    assert step.record(1, nothing, dict(advanced)) is None


async def test_the_function_sees_each_message_as_its_fields_say() -> None:
    """Messages are built without the frozen dataclass's __init__ (per message): each is equal to,
    and as frozen as, the one ``Message(...)`` builds."""
    seen: list[Message] = []

    class Keep(ProcessFunction):
        async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
            seen.append(message)

    clock, timers = VirtualClock(100), TimerQueue()
    invoker = Invoker("deliver", Keep(), RuntimeContext(clock, 0), StateStore(0, 4), timers, [])
    step = EpochStep(invoker, 0, 4, sink_streams=set(), logged_streams=None, positions={("input", 0): 7})
    await step.invoke([log_message(7, "a", 60.0)], [])
    assert seen == [Message("input", ("a",), {"n": 7}, b"id-7", 60.0)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].row = {}  # type: ignore[misc]
