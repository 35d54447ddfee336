"""Unit-testing process functions: one function on a virtual clock, no storage, exact timestamps.

This is what upstream's process-function unit tests do with a mocked runtime context, with the
real egress runtime pieces instead of mocks: the same state clients, timer queue and output checks
a partition job uses, and the same epoch step (:class:`egress.runtime.epoch.EpochStep`: message
and timer ids, watermark, commit record), one message or timer per epoch. Example (upstream
``RequestProcessorRetriesUntilSuccess``)::

    harness = ProcessFunctionHarness(RequestProcessor, now=100)
    await harness.process_message({"request_id": 1, "key": "k", "request": "abc"}, key=("k",))
    assert harness.timers() == [(("k",), 105.0)]
    outputs = await harness.advance(5)          # fires the timer at 105 (fails again: next at 110)
    outputs = await harness.advance(5)          # fires at 110 and succeeds
    assert outputs[0].row == {"request_id": 1, "key": "k", "length": 3}

Everything a call changes is applied at once (each call is one epoch, committed nowhere); errors are the same
:class:`~egress.errors.ProcessFunctionError` a pipeline raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egress.clock import VirtualClock
from egress.engines import LogMessage
from egress.keys import decode_key, encode_key, source_message_id
from egress.rows import encode_row, unstorable_row_error
from egress.runtime.api import InitContext, ProcessFunction, RuntimeContext
from egress.runtime.epoch import DueTimer, EpochStep
from egress.runtime.invoke import Invoker
from egress.runtime.plan import validate_function_parameters
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerDomain, TimerQueue
from egress.spec import StreamSpec

__all__ = ["Emitted", "ProcessFunctionHarness"]


@dataclass(frozen=True, slots=True)
class Emitted:
    """A message the function emitted: ``stream_id``, ``row``, ``key`` (the tuple it is keyed by:
    the explicit key given to ``add_message``, else the stream's ``group_by`` values when
    ``streams`` were given, else ``()``)."""

    stream_id: str
    row: dict[str, Any]
    key: tuple[Any, ...]


class ProcessFunctionHarness:
    """Runs ``function`` (a class or an instance) as partition 0 of one partition, on ``clock``.

    ``now``: the virtual clock's start (seconds) when no ``clock`` is given. ``parameters`` and
    ``dynamic_parameters`` are the ``processing_function_parameters`` (dicts validated with the
    function's models, or model instances). ``output_stream_ids`` limits where it may emit (any
    stream when ``None``); ``streams`` (stream id → :class:`~egress.spec.StreamSpec`) adds the
    schema checks and ``group_by`` keys of a pipeline. ``outputs`` accumulates every emitted
    message; each call also returns its own.
    """

    def __init__(
        self,
        function: ProcessFunction | type[ProcessFunction],
        *,
        now: float = 0.0,
        clock: VirtualClock | None = None,
        parameters: Any = None,
        dynamic_parameters: Any = None,
        output_stream_ids: list[str] | None = None,
        streams: dict[str, StreamSpec] | None = None,
        computation_id: str = "computation",
    ) -> None:
        self.function = function() if isinstance(function, type) else function
        self.clock = clock or VirtualClock(now)
        kind = type(self.function)
        if parameters is None or isinstance(parameters, dict):
            parameters = validate_function_parameters(kind, parameters or {}, dynamic=False,
                                                      prefix="processing_function_parameters")
        self._dynamic: Any = None
        self.set_dynamic_parameters(dynamic_parameters)
        self.store = StateStore()
        self.timer_queue = TimerQueue()
        self.outputs: list[Emitted] = []
        self._messages = 0
        self.function.init(InitContext(self.clock, 0, self.store, parameters, lambda: self._dynamic,
                                       lambda: self.watermark))
        context = RuntimeContext(self.clock, 0, parameters, lambda: self._dynamic, lambda: self.watermark)
        self.invoker = Invoker(computation_id, self.function, context, self.store, self.timer_queue,
                               output_stream_ids, streams)
        # Every emitted message goes to the log side of the record, in emission order: that is what a test reads.
        self.step = EpochStep(self.invoker, 0, 1, sink_streams=frozenset(), logged_streams=None, positions={})

    @property
    def watermark(self) -> float | None:
        """The event-time watermark (seconds): the largest event timestamp processed so far."""
        return self.step.watermark

    @watermark.setter
    def watermark(self, watermark: float | None) -> None:
        self.step.watermark = watermark

    def set_dynamic_parameters(self, dynamic_parameters: Any) -> None:
        """Change the dynamic parameters, as a DynamicSpec reload does (dicts are validated)."""
        if dynamic_parameters is None or isinstance(dynamic_parameters, dict):
            dynamic_parameters = validate_function_parameters(
                type(self.function), dynamic_parameters or {}, dynamic=True, prefix="processing_function_parameters")
        self._dynamic = dynamic_parameters

    async def _epoch(self, batch: list[LogMessage], due: list[DueTimer]) -> list[Emitted]:
        """Run one epoch of the step and return what it emitted; a row that a pipeline could not
        store raises the ``RowEncodingError`` its commit would."""
        output = await self.step.invoke(batch, due)
        commit = self.step.record(0, output, {})
        assert commit is not None  # a message or a timer always makes a record
        for stream_id, _, message_id, _, _, row in commit.log_appends:
            try:
                encode_row(row)
            except TypeError:
                raise unstorable_row_error(f"computation {self.invoker.computation_id!r} partition 0",
                                           stream_id, message_id, row) from None
        emitted = [Emitted(stream_id, row, decode_key(key)) for stream_id, _, _, key, _, row in commit.log_appends]
        self.outputs.extend(emitted)
        return emitted

    async def process_message(
        self,
        row: dict[str, Any],
        *,
        key: tuple[Any, ...] = (),
        stream_id: str = "input",
        event_timestamp: float | None = None,
        message_id: bytes | None = None,
    ) -> list[Emitted]:
        """Call ``process_message`` with a message of ``stream_id`` keyed by ``key``; returns what
        it emitted. ``message_id`` defaults to a source id of position 0, 1, 2, ... ."""
        if message_id is None:
            message_id = source_message_id("testing", 0, self._messages)
        message = LogMessage(stream_id, 0, self._messages, message_id, encode_key(key), event_timestamp, row)
        self._messages += 1
        return await self._epoch([message], [])

    async def process_timer(self, key: tuple[Any, ...], trigger_timestamp: float,
                            domain: TimerDomain = "processing") -> list[Emitted]:
        """Call ``process_timer`` for ``key`` at ``trigger_timestamp`` now, whatever the clock says
        (as upstream tests call ``ProcessTimer`` directly); a pending timer equal to it is removed."""
        encoded = encode_key(key)
        self.timer_queue.discard(encoded, float(trigger_timestamp), domain)
        return await self._epoch([], [(encoded, float(trigger_timestamp), domain)])

    async def advance(self, seconds: float) -> list[Emitted]:
        """Move the virtual clock forward by ``seconds``, firing every processing-time timer that
        becomes due, in trigger order, each at its own time (timers set while firing fire too when
        due). Returns what the fired timers emitted."""
        target = self.clock.now() + seconds
        emitted: list[Emitted] = []
        while True:
            trigger = self.timer_queue.next_processing_trigger()
            if trigger is None or trigger > target:
                break
            await self.clock.advance(max(0.0, trigger - self.clock.now()))
            emitted += await self._epoch([], self.timer_queue.pop_due(self.clock.now(), None, 1))
        await self.clock.advance(max(0.0, target - self.clock.now()))
        return emitted

    async def advance_watermark(self, watermark: float) -> list[Emitted]:
        """Raise the event-time watermark to ``watermark`` and fire the event-time timers it makes due."""
        self.watermark = max(watermark, self.watermark if self.watermark is not None else watermark)
        emitted: list[Emitted] = []
        while due := self.timer_queue.pop_due(float("-inf"), self.watermark, 1):
            emitted += await self._epoch([], due)
        return emitted

    async def close(self) -> None:
        """Call the function's ``close`` (stop its background work), as a stopping job does."""
        await self.function.close()

    def timers(self, key: tuple[Any, ...] | None = None, domain: TimerDomain | None = None) -> list[
            tuple[tuple[Any, ...], float]]:
        """Pending timers as ``(key, trigger)`` in trigger order (of ``key`` / ``domain`` when given)."""
        encoded = None if key is None else encode_key(key)
        return [(decode_key(k), t) for k, t, d in self.timer_queue.pending(encoded) if domain in (None, d)]

    def state(self, name: str, key: tuple[Any, ...]) -> Any:
        """The internal state ``name`` of ``key`` (the model instance), or ``None``."""
        return self.store.internal[name].peek(key)

    def set_state(self, name: str, key: tuple[Any, ...], value: Any) -> None:
        """Give ``key`` a stored value before a call (as a restarted job finds it)."""
        self.store.internal[name]._set(tuple(key), value)

    def external_state(self, table: str, key: tuple[Any, ...]) -> dict[str, Any] | None:
        """The row of ``key`` in external state ``table`` (column → value), or ``None``."""
        row = self.store.external[table].peek(key)
        return None if row is None else dict(row)
