"""Unit-testing process functions: one function on a virtual clock, no storage, exact timestamps.

This is what upstream's process-function unit tests do with a mocked runtime context, with the
real egress runtime pieces instead of mocks: the same state clients, timer queue and output checks
a partition job uses. Example (upstream ``RequestProcessorRetriesUntilSuccess``)::

    harness = ProcessFunctionHarness(RequestProcessor, now=100)
    await harness.process_message({"request_id": 1, "key": "k", "request": "abc"}, key=("k",))
    assert harness.timers() == [(("k",), 105.0)]
    outputs = await harness.advance(5)          # fires the timer at 105 (fails again: next at 110)
    outputs = await harness.advance(5)          # fires at 110 and succeeds
    assert outputs[0].row == {"request_id": 1, "key": "k", "length": 3}

Everything a call changes is applied at once (there are no epochs here); errors are the same
:class:`~egress.errors.ProcessFunctionError` a pipeline raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egress.clock import VirtualClock
from egress.keys import decode_key, derived_message_id, encode_key, source_message_id
from egress.rows import encode_row, unstorable_row_error
from egress.runtime.api import InitContext, Message, ProcessFunction, RuntimeContext, Timer
from egress.runtime.invoke import Invoker, Output
from egress.runtime.plan import validate_function_parameters
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerDomain, TimerQueue, timer_message_id
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
        self.watermark: float | None = None
        self.outputs: list[Emitted] = []
        self._messages = 0
        self.function.init(InitContext(self.clock, 0, self.store, parameters, lambda: self._dynamic,
                                       lambda: self.watermark))
        context = RuntimeContext(self.clock, 0, parameters, lambda: self._dynamic, lambda: self.watermark)
        self.invoker = Invoker(computation_id, self.function, context, self.store, self.timer_queue,
                               output_stream_ids, streams)

    def set_dynamic_parameters(self, dynamic_parameters: Any) -> None:
        """Change the dynamic parameters, as a DynamicSpec reload does (dicts are validated)."""
        if dynamic_parameters is None or isinstance(dynamic_parameters, dict):
            dynamic_parameters = validate_function_parameters(
                type(self.function), dynamic_parameters or {}, dynamic=True, prefix="processing_function_parameters")
        self._dynamic = dynamic_parameters

    def _collect(self, outputs: list[Output], parent_id: bytes) -> list[Emitted]:
        """Record ``outputs`` of the call for message or timer ``parent_id``; a row that a pipeline
        could not store raises the ``RowEncodingError`` its commit would."""
        for index, output in enumerate(outputs):
            try:
                encode_row(output.row)
            except TypeError:
                raise unstorable_row_error(f"computation {self.invoker.computation_id!r} partition 0",
                                           output.stream_id, derived_message_id(parent_id, index), output.row) from None
        emitted = [Emitted(o.stream_id, o.row, decode_key(o.key)) for o in outputs]
        self.outputs.extend(emitted)
        self.store.take_writes()
        self.timer_queue.take_changes()
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
        self._messages += 1
        if event_timestamp is not None and (self.watermark is None or event_timestamp > self.watermark):
            self.watermark = event_timestamp
        message = Message(stream_id, tuple(key), row, message_id, event_timestamp)
        return self._collect(await self.invoker.message(message, encode_key(key)), message_id)

    async def process_timer(self, key: tuple[Any, ...], trigger_timestamp: float,
                            domain: TimerDomain = "processing") -> list[Emitted]:
        """Call ``process_timer`` for ``key`` at ``trigger_timestamp`` now, whatever the clock says
        (as upstream tests call ``ProcessTimer`` directly); a pending timer equal to it is removed."""
        encoded = encode_key(key)
        self.timer_queue.discard(encoded, float(trigger_timestamp), domain)
        return await self._fire(encoded, float(trigger_timestamp), domain)

    async def _fire(self, key: bytes, trigger: float, domain: str) -> list[Emitted]:
        timer = Timer(decode_key(key), trigger, domain)  # type: ignore[arg-type]
        return self._collect(await self.invoker.timer(timer, key),
                             timer_message_id(self.invoker.computation_id, key, trigger, domain))

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
            for key, at, domain in self.timer_queue.pop_due(self.clock.now(), None, 1):
                emitted += await self._fire(key, at, domain)
        await self.clock.advance(max(0.0, target - self.clock.now()))
        return emitted

    async def advance_watermark(self, watermark: float) -> list[Emitted]:
        """Raise the event-time watermark to ``watermark`` and fire the event-time timers it makes due."""
        self.watermark = max(watermark, self.watermark if self.watermark is not None else watermark)
        emitted: list[Emitted] = []
        while due := self.timer_queue.pop_due(float("-inf"), self.watermark, 1):
            for key, at, domain in due:
                emitted += await self._fire(key, at, domain)
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
