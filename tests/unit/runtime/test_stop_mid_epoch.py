"""A stop asked for in the middle of an epoch (a first Ctrl-C, a job handed over) ends the epoch
after the process function's call in hand: it commits the prefix it processed (positions after its
last message, with that prefix's outputs, state and timers only), and the next run goes on from
there, so every message is processed into state once, in order.

On the virtual clock with exact times: a real :class:`PartitionJob` over an engine in memory that
loads what was committed, and the epoch step alone for timers and maps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from egress import MapFunction, Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.clock import VirtualClock
from egress.engines import Checkpoint, KeyedState, SinkProgress
from egress.keys import encode_key
from egress.runtime.api import InitContext
from egress.runtime.epoch import EpochStep
from egress.runtime.invoke import Invoker
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue
from tests.unit.runtime.test_epoch_step import log_message
from tests.unit.runtime.test_holds import MESSAGES, MemoryEngine, Setup

SECONDS_PER_MESSAGE = 1.0


@dataclasses.dataclass
class CommittedMemoryEngine(MemoryEngine):
    """:class:`MemoryEngine` whose checkpoint and keyed state are what its commits made durable."""

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
        positions: dict[tuple[str, int], int] = {}
        outbox = []
        for commit in self.commits:
            positions.update(commit.input_positions)
            outbox.extend(commit.outbox)
        next_seq = outbox[-1].seq + 1 if outbox else 1
        return Checkpoint(positions, {sink: SinkProgress() for sink in sinks}, outbox, next_seq)

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external: list[str]) -> KeyedState:
        internal: dict[str, dict[bytes, bytes]] = {}
        for commit in self.commits:
            for (name, key), value in commit.state_writes.items():
                assert value is not None
                internal.setdefault(name, {})[key] = value
        return KeyedState(internal, {}, [], None)


def counting(clock: VirtualClock, seconds: float) -> type[ProcessFunction]:
    """A function taking ``seconds`` on ``clock`` per message, counting in state how often it
    processed each key and emitting ``"<payload>:<count>"``."""

    class SlowCounter(ProcessFunction):
        def init(self, ctx: InitContext) -> None:
            self.times = ctx.state_client("times", int)

        async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
            await clock.sleep(seconds)
            times = self.times.get(message.key)
            times.set(times.value + 1)
            output.add_message("requests", {"payload": f"{message.row['payload']}:{times.value}"})

    return SlowCounter


def slow_setup(tmp_path: Path, seconds: float = SECONDS_PER_MESSAGE) -> Setup:
    setup = Setup(tmp_path)  # MESSAGES messages in the log, one epoch's worth
    setup.engine = CommittedMemoryEngine(setup.engine.log, clock=setup.clock)
    setup.computation = dataclasses.replace(setup.computation, function_class=counting(setup.clock, seconds))
    return setup


def emitted(setup: Setup) -> list[str]:
    """Every committed output payload, in seq order."""
    return [m.row["payload"] for commit in setup.engine.commits for m in commit.outbox]


async def test_an_interrupt_mid_epoch_commits_the_processed_prefix_and_ends_the_job_after_the_call_in_hand(
        tmp_path: Path) -> None:
    setup = slow_setup(tmp_path)
    job = setup.job()
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(2.5)  # the one epoch of all MESSAGES is on its third message
    job.stop_request.requested = True  # what a signal handler does (Pipeline.interrupt): a flag only
    await setup.clock.advance(0.49)
    assert not run.done()  # the call in hand is not cut short
    await setup.clock.advance(0.01)
    assert run.done()  # at 3.0, not at MESSAGES seconds
    await run
    assert emitted(setup) == ["p0:1", "p1:1", "p2:1"]
    last = setup.engine.commits[-1]
    assert last.input_positions == {("events", 0): 3}
    assert {key for commit in setup.engine.commits for _, key in commit.state_writes} == \
        {encode_key([i]) for i in range(3)}

    # The next run, fast: it goes on from the committed prefix, with the committed state.
    setup.computation = dataclasses.replace(setup.computation, function_class=counting(setup.clock, 0.0))
    again = setup.job()
    rerun = asyncio.create_task(again.run(generation=2))
    await setup.clock.advance(20.0)  # the sink bounds what the job reads until it acknowledged
    again.stop()
    await setup.clock.advance(0)
    await rerun
    assert emitted(setup) == [f"p{i}:1" for i in range(MESSAGES)]  # each once, in order, counted once


async def test_a_stop_on_the_loop_mid_epoch_ends_it_after_the_call_in_hand_too(tmp_path: Path) -> None:
    """``stop()`` (Ctrl-C once the loop turns, a partition handed over) cuts the epoch short alike."""
    setup = slow_setup(tmp_path)
    job = setup.job()
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(4.2)
    job.stop()
    await setup.clock.advance(0.8)
    assert run.done()
    await run
    assert emitted(setup) == ["p0:1", "p1:1", "p2:1", "p3:1", "p4:1"]
    assert setup.engine.commits[-1].input_positions == {("events", 0): 5}


class Fires(ProcessFunction):
    """A timer emits one message naming its trigger; the test stops the step after the first."""

    def __init__(self, stop: Any = None) -> None:
        self.stop = stop

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"n": message.row["n"]})

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("out", {"n": timer.trigger_timestamp})
        if self.stop is not None:
            self.stop.requested = True  # as a signal landing during this call would


async def test_due_timers_a_stop_left_unfired_stay_pending_and_no_message_is_processed() -> None:
    clock, timers = VirtualClock(100), TimerQueue()
    function = Fires()
    step = EpochStep(Invoker("c", function, RuntimeContext(clock, 0), StateStore(0, 1), timers, ["out"]),
                     0, 1, sink_streams={"out"}, logged_streams=frozenset(), positions={("input", 0): 7})
    function.stop = step.stop
    key = encode_key(["a"])
    for trigger in (10.0, 20.0, 30.0):
        timers.add(key, trigger, "processing")
    timers.take_changes()  # committed before
    due = timers.pop_due(clock.now(), None, 100)
    output = await step.invoke([log_message(7, "a", 60.0)], due)
    assert (output.timers, output.messages) == (1, 0)
    assert [m.row["n"] for m in output.outbox] == [10.0]
    commit = step.record(1, output, {})
    assert commit is not None
    assert commit.timers_deleted == [(key, 10.0, "processing")]  # the fired one only
    assert commit.input_positions == {("input", 0): 7}  # the message is read again
    assert commit.watermark is None
    assert timers.pending() == [(key, 20.0, "processing"), (key, 30.0, "processing")]


class Doubles(MapFunction):
    output_stream_id = "out"

    def __init__(self, stop: Any = None) -> None:
        self.stop = stop

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        if row["n"] == 8:
            self.stop.requested = True
        return {"n": row["n"] * 2}


async def test_a_map_stops_after_the_row_in_hand_with_the_positions_and_watermark_of_the_prefix() -> None:
    clock = VirtualClock(100)
    function = Doubles()
    step = EpochStep(Invoker("c", function, RuntimeContext(clock, 0), StateStore(0, 1), TimerQueue(), ["out"]),
                     0, 1, sink_streams={"out"}, logged_streams=frozenset(), positions={("input", 0): 7})
    function.stop = step.stop
    batch = [log_message(7, "a", 60.0), log_message(8, "b", 61.0), log_message(9, "c", 62.0)]
    output = await step.invoke(batch, [])
    assert output.messages == 2
    assert [m.row["n"] for m in output.outbox] == [14, 16]
    assert step.positions == {("input", 0): 9}
    assert step.watermark == 61.0  # not raised by the message left unprocessed
