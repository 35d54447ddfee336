"""Timers: trigger order per key, processing vs event time, timers set from timers, and timers in
the past rejected; on the virtual clock, each timer fires exactly at its trigger."""

from __future__ import annotations

import pytest

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.errors import ProcessFunctionError
from egress.runtime.timers import TimerQueue
from egress.testing import ProcessFunctionHarness


def test_due_timers_come_in_trigger_order_and_each_once() -> None:
    queue = TimerQueue()
    queue.load([(b"a", 3.0, "processing"), (b"b", 1.0, "processing")])
    queue.add(b"a", 2.0, "processing")
    queue.add(b"a", 2.0, "processing")  # setting it again changes nothing
    queue.add(b"a", 1.5, "event")
    assert queue.pop_due(now=2.5, watermark=None, limit=10) == [(b"b", 1.0, "processing"), (b"a", 2.0, "processing")]
    assert queue.pop_due(now=10, watermark=1.5, limit=1) == [(b"a", 1.5, "event")]
    assert queue.pop_due(now=10, watermark=1.5, limit=10) == [(b"a", 3.0, "processing")]
    assert len(queue) == 0
    set_, deleted = queue.take_changes()
    assert set_ == [(b"a", 2.0, "processing"), (b"a", 1.5, "event")]
    assert len(deleted) == 4


class Chain(ProcessFunction):
    """On a message: a timer at ``now + row["after"]``; on each timer: record it and, while fewer
    than ``row["times"]`` fired, set the next one ``after`` later (a timer set from a timer)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        self.after, self.times = message.row["after"], message.row["times"]
        self.fired = 0
        output.add_timer(ctx.now() + self.after, message.row.get("domain", "processing"))

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        self.fired += 1
        output.add_message("fired", {"key": list(timer.key), "trigger": timer.trigger_timestamp, "now": ctx.now()})
        if self.fired < self.times:
            output.add_timer(timer.trigger_timestamp + self.after)


async def test_timers_set_from_timers_fire_exactly_at_their_triggers() -> None:
    h = ProcessFunctionHarness(Chain, now=1000)
    await h.process_message({"after": 2.5, "times": 3}, key=("k",))
    outputs = await h.advance(60)
    assert [(o.row["trigger"], o.row["now"]) for o in outputs] == [(1002.5, 1002.5), (1005.0, 1005.0),
                                                                  (1007.5, 1007.5)]
    assert h.timers() == []


async def test_timers_of_several_keys_fire_in_trigger_order() -> None:
    h = ProcessFunctionHarness(Chain, now=0)
    await h.process_message({"after": 3, "times": 1}, key=("late",))
    await h.process_message({"after": 1, "times": 1}, key=("early",))
    assert h.timers() == [(("early",), 1.0), (("late",), 3.0)]
    outputs = await h.advance(5)
    assert [o.row["key"] for o in outputs] == [["early"], ["late"]]


async def test_event_time_timers_fire_when_the_watermark_passes() -> None:
    h = ProcessFunctionHarness(Chain, now=0)
    await h.process_message({"after": 0, "times": 1, "domain": "event"}, key=("k",), event_timestamp=0)
    await h.process_message({"after": 10, "times": 1, "domain": "event"}, key=("k",), event_timestamp=5)
    assert h.timers(domain="event") == [(("k",), 0.0), (("k",), 10.0)]
    assert await h.advance(1000) == []  # processing time does not fire event-time timers
    fired = await h.advance_watermark(100)
    assert [o.row["trigger"] for o in fired] == [0.0, 10.0]


class Past(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_timer(ctx.now() - 1)


async def test_a_timer_in_the_past_is_a_clear_error() -> None:
    h = ProcessFunctionHarness(Past, now=50)
    with pytest.raises(ProcessFunctionError, match=r"set a processing timer in the past: 49.0 < now 50"):
        await h.process_message({}, key=("k",))
    with pytest.raises(ValueError, match="timer domain must be"):
        OutputCollector().add_timer(1.0, "wall")  # type: ignore[arg-type]


class RaisesOnTimer(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_timer(ctx.now() + 1)

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        raise RuntimeError("no luck")


async def test_a_raising_timer_names_its_key_and_trigger_with_the_traceback() -> None:
    h = ProcessFunctionHarness(RaisesOnTimer, now=7, computation_id="retry")
    await h.process_message({}, key=("k", 1))
    with pytest.raises(ProcessFunctionError) as raised:
        await h.advance(1)
    text = str(raised.value)
    assert "computation 'retry' raised on processing timer at 8.0 of key ['k', 1] (partition 0)" in text
    assert "RuntimeError: no luck" in text
    assert "Traceback" in text
