"""The public API a process function is written against, in Flow's names.

A process function is a class with ``init`` (once per partition job), ``process_message`` (once per
input message) and ``process_timer``. It emits through an :class:`OutputCollector` and reads time
and parameters from a :class:`RuntimeContext`. The Spec names it ``package.module:ClassName``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egress.clock import Clock


@dataclass(frozen=True, slots=True)
class Message:
    """An input message: ``stream_id``, ``key`` (the ``group_by`` values, a tuple), ``row`` (column →
    value), ``message_id`` (stable bytes), ``event_timestamp`` (seconds since the Unix epoch or None)."""

    stream_id: str
    key: tuple[Any, ...]
    row: dict[str, Any]
    message_id: bytes
    event_timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer that fired for ``key`` at ``trigger_timestamp`` (seconds since the Unix epoch)."""

    key: tuple[Any, ...]
    trigger_timestamp: float


@dataclass(slots=True)
class EmittedMessage:
    stream_id: str
    row: dict[str, Any]
    key: tuple[Any, ...] | None


@dataclass(slots=True)
class OutputCollector:
    """Collects what a process function emits while handling one message or timer.

    Nothing is visible outside the partition job until the epoch commits; if the function raises,
    everything it emitted for that batch is discarded.
    """

    messages: list[EmittedMessage] = field(default_factory=list)
    timers: list[float] = field(default_factory=list)

    def add_message(self, stream_id: str, row: dict[str, Any], key: tuple[Any, ...] | None = None) -> None:
        """Emit ``row`` to output stream ``stream_id``.

        ``key`` overrides the key taken from the stream's ``group_by`` columns. The stream and
        row are checked against the Spec when the message is committed; a stream not in the
        computation's ``output_stream_ids`` or a row not matching the schema raises
        ``ProcessFunctionError`` there, naming the input message.
        """
        self.messages.append(EmittedMessage(stream_id, row, key))

    def add_timer(self, trigger_timestamp: float) -> None:
        """Ask for ``process_timer`` at ``trigger_timestamp`` (seconds) for the current key."""
        self.timers.append(trigger_timestamp)


class RuntimeContext:
    """What a process function may ask while it runs: time and parameters.

    ``parameters`` are the computation's ``processing_function_parameters`` (static merged with
    dynamic, the dynamic ones applied live). Throttler accessors arrive with the throttler.
    """

    def __init__(self, clock: Clock, parameters: Callable[[], dict[str, Any]], partition: int) -> None:
        self._clock = clock
        self._parameters = parameters
        self.partition = partition

    def now(self) -> float:
        """Processing time, seconds since the Unix epoch, from the pipeline's clock."""
        return self._clock.now()

    @property
    def parameters(self) -> dict[str, Any]:
        return self._parameters()

    def try_get_throttler(self, throttler_id: str) -> None:
        """The throttler handle for ``throttler_id``, or ``None`` when none is configured (no
        throttlers exist yet in this version, so this is always ``None``)."""
        return None

    def get_throttler_or_throw(self, throttler_id: str) -> None:
        """Raises ``KeyError``: ``Throttler "X" is not configured for this client``."""
        raise KeyError(f'Throttler "{throttler_id}" is not configured for this client')


class InitContext(RuntimeContext):
    """The context given to ``ProcessFunction.init`` (same accessors as :class:`RuntimeContext`)."""


class ProcessFunction:
    """Base class of user process functions (Flow's ``IProcessFunction``)."""

    def init(self, ctx: InitContext) -> None:
        """Called once per partition job before any message; obtain state clients here."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        """Handle one input message; emit through ``output``. Must be overridden."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_message")

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        """Handle a fired timer (timers arrive with keyed state)."""
