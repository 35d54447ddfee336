"""The public API a process function is written against, in Flow's names.

A process function is a class with ``init`` (once per partition job), ``process_message`` (once per
input message) and ``process_timer``. It emits through an :class:`OutputCollector` and reads time
and parameters from a :class:`RuntimeContext`. The Spec names it ``package.module:ClassName``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel

from egress.clock import Clock
from egress.runtime.state import ExternalStateClient, StateClient, StateStore
from egress.runtime.timers import DOMAINS, TimerDomain
from egress.throttler.errors import ThrottlerNotConfiguredError

if TYPE_CHECKING:
    from egress.throttler.factory import ThrottlerFactory, ThrottlerHandle

M = TypeVar("M")


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
    """A timer that fired for ``key`` at ``trigger_timestamp`` (seconds since the Unix epoch);
    ``domain`` is ``"processing"`` (clock time) or ``"event"`` (watermark)."""

    key: tuple[Any, ...]
    trigger_timestamp: float
    domain: TimerDomain = "processing"


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
    timers: list[tuple[float, TimerDomain]] = field(default_factory=list)

    def add_message(self, stream_id: str, row: dict[str, Any], key: tuple[Any, ...] | None = None) -> None:
        """Emit ``row`` to output stream ``stream_id``.

        ``key`` overrides the key taken from the stream's ``group_by`` columns. The stream and
        row are checked against the Spec when the call returns; a stream not in the
        computation's ``output_stream_ids`` or a row not matching the schema raises
        ``ProcessFunctionError`` there, naming the input message.
        """
        self.messages.append(EmittedMessage(stream_id, row, key))

    def add_timer(self, trigger_timestamp: float, domain: TimerDomain = "processing") -> None:
        """Ask for ``process_timer`` at ``trigger_timestamp`` (seconds since the Unix epoch) for the
        current key (upstream ``AddTimer``). ``domain="processing"`` fires when ``ctx.now()`` reaches
        it, ``"event"`` when the watermark does. A trigger earlier than now (or the watermark) raises
        ``ProcessFunctionError`` when the call returns."""
        if domain not in DOMAINS:
            raise ValueError(f"timer domain must be 'processing' or 'event', got {domain!r}")
        self.timers.append((float(trigger_timestamp), domain))


class RuntimeContext:
    """What a process function may ask while it runs: time, watermark and parameters.

    ``parameters`` are the computation's static ``processing_function_parameters`` from the Spec,
    ``dynamic_parameters`` those of the DynamicSpec (applied live: read them on every call rather
    than caching them in ``init``). Each is an instance of the function's ``parameters_model`` /
    ``dynamic_parameters_model`` when it declares one, else a ``dict``. ``throttlers`` is the job's
    throttler factory (``None`` when the run has no throttlers): it serves ``get_throttler_or_throw``
    and ``try_get_throttler``.
    """

    def __init__(
        self,
        clock: Clock,
        partition: int,
        parameters: Any = None,
        dynamic_parameters: Callable[[], Any] | None = None,
        watermark: Callable[[], float | None] | None = None,
        throttlers: ThrottlerFactory | None = None,
    ) -> None:
        self._clock = clock
        self._throttlers = throttlers
        self.partition = partition
        self._parameters = {} if parameters is None else parameters
        self._dynamic = dynamic_parameters or dict
        self._watermark = watermark or (lambda: None)

    def now(self) -> float:
        """Processing time, seconds since the Unix epoch, from the pipeline's clock (upstream
        ``GetCurrentTimestamp``)."""
        return self._clock.now()

    @property
    def clock(self) -> Clock:
        """The pipeline's clock, for background work a function starts (sleep through it, never
        through ``asyncio.sleep``, so that tests on a virtual clock stay exact)."""
        return self._clock

    def watermark(self) -> float | None:
        """The event-time watermark: the largest event timestamp of the input this partition job
        has processed (seconds), or ``None`` before any."""
        return self._watermark()

    @property
    def parameters(self) -> Any:
        return self._parameters

    @property
    def dynamic_parameters(self) -> Any:
        return self._dynamic()

    def try_get_throttler(self, throttler_id: str) -> ThrottlerHandle | None:
        """The handle of DynamicSpec throttler ``throttler_id`` (``await handle.throttle(amount)``),
        or ``None`` when it is not configured (upstream ``TryGetThrottler``)."""
        return self._throttlers.try_get_throttler(throttler_id) if self._throttlers is not None else None

    def get_throttler_or_throw(self, throttler_id: str) -> ThrottlerHandle:
        """The handle of DynamicSpec throttler ``throttler_id``; raises ``ThrottlerNotConfiguredError``
        (``Throttler "X" is not configured for this client``) when it is not configured (upstream
        ``GetThrottlerOrThrow``). A handle stays valid across reconfigurations."""
        if self._throttlers is None:
            raise ThrottlerNotConfiguredError(f'Throttler "{throttler_id}" is not configured for this client')
        return self._throttlers.get_throttler_or_throw(throttler_id)


class InitContext(RuntimeContext):
    """The context given to ``ProcessFunction.init``: the :class:`RuntimeContext` accessors plus the
    state clients (upstream ``IRuntimeInitContext::InitClient`` / ``InitExternalStateClient``)."""

    def __init__(self, clock: Clock, partition: int, store: StateStore, parameters: Any = None,
                 dynamic_parameters: Callable[[], Any] | None = None,
                 watermark: Callable[[], float | None] | None = None,
                 throttlers: ThrottlerFactory | None = None) -> None:
        super().__init__(clock, partition, parameters, dynamic_parameters, watermark, throttlers)
        self._store = store

    def state_client(self, name: str, model: type[M]) -> StateClient[M]:
        """Keyed internal state ``name`` whose values are ``model`` (a pydantic model or a
        dataclass), stored by egress and committed with each epoch. Raises ``ValueError`` when
        ``name`` is initialised twice."""
        return self._store.state_client(name, model)

    def external_state_client(self, table: str, columns: Mapping[str, type]) -> ExternalStateClient:
        """The external state table ``table`` (any name, e.g. upstream's ``"/state"``) with
        ``columns`` (name → ``int``/``float``/``str``/``bool``), one row per key, committed with
        each epoch and printed by ``egress state dump``."""
        return self._store.external_state_client(table, columns)


class ProcessFunction:
    """Base class of user process functions (Flow's ``IProcessFunction``).

    ``parameters_model`` / ``dynamic_parameters_model`` (pydantic models, optional) type and
    validate the computation's static and dynamic ``processing_function_parameters``; errors name
    ``computations/<id>/processing_function_parameters/<field>`` in the Spec or DynamicSpec file.
    """

    parameters_model: ClassVar[type[BaseModel] | None] = None
    dynamic_parameters_model: ClassVar[type[BaseModel] | None] = None

    def init(self, ctx: InitContext) -> None:
        """Called once per partition job before any message; obtain state clients here."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        """Handle one input message; emit through ``output``. Must be overridden."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_message")

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        """Handle a fired timer of ``timer.key``; the default does nothing."""

    async def close(self) -> None:
        """Called once when the partition job stops (after its last commit, or after a failure):
        stop background tasks the function started. An egress addition; the default does nothing."""


class MapFunction(ProcessFunction):
    """A stateless process function that maps each input row to at most one output row: the
    cheap form for the common transform (an event to the request a sink sends). egress calls
    :meth:`map` for every input message, in read order, and emits what it returns to the
    computation's output stream, with the key that stream's ``group_by`` gives (or ``()``).

    ``output_stream_id`` names the stream; ``None`` (the default) means the computation's only
    output stream. A map is synchronous, keeps no state and sets no timers: a function that needs
    any of these, several outputs per message, an explicit key or ``await`` (a throttler, an HTTP
    call) is a :class:`ProcessFunction`. Errors, each a ``ProcessFunctionError`` at the job's
    start or for the message: ``output_stream_id`` not one of the computation's output streams (or
    ``None`` with several); a state client obtained in ``init``; ``map`` raising or returning a
    row the output stream's schema refuses (nothing of that batch is committed).

    Per message it costs a call and the row's check, without the ``Message``, the
    ``OutputCollector`` and the coroutine of :meth:`ProcessFunction.process_message`.
    """

    output_stream_id: ClassVar[str | None] = None

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        """The output row for input ``row`` (column → value), or ``None`` to emit nothing. Must be
        overridden; ``ctx`` gives time, watermark and parameters as to any process function."""
        raise NotImplementedError(f"{type(self).__name__} must implement map")

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        """:meth:`map` of ``message.row``, emitted to :attr:`output_stream_id` (which must be set
        to call this directly: the runtime resolves ``None`` itself and calls :meth:`map`)."""
        if self.output_stream_id is None:
            raise TypeError(f"{type(self).__name__}.process_message needs output_stream_id; the runtime calls map")
        row = self.map(message.row, ctx)
        if row is not None:
            output.add_message(self.output_stream_id, row)


class IdentityMap(MapFunction):
    """The map that emits each row unchanged: a computation that only carries its input to its
    sinks (``processing_function: egress:IdentityMap``). Its output stream must have the input's
    columns. It declares itself ``byte_level``: where the records are lines kept as bytes (the
    ``lines`` source, ``docs/architecture.md`` "Byte chunks") the runtime then carries a chunk of
    them to the sinks without making a row of any record; everywhere else it is the plain map."""

    byte_level: ClassVar[bool] = True
    """Declares that the function changes no record: the runtime may pass chunks of records through."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any] | None:
        """``row`` itself."""
        return row


def map_output_stream(function_class: type[MapFunction], output_stream_ids: list[str] | None) -> str:
    """The stream ``function_class`` (a :class:`MapFunction`) emits to in a computation whose
    ``output_stream_ids`` are given (``None``: not known, as in ``egress.testing`` without them):
    its ``output_stream_id``, or the computation's only output stream. Raises ``ValueError``
    saying what is wrong and the fix when there is none to choose, the named one is not an output
    of the computation, or ``map`` is a coroutine function (a map is synchronous). Checked by
    ``egress validate`` and again when a partition job starts."""
    name = function_class.__name__
    if inspect.iscoroutinefunction(function_class.map):
        raise ValueError(f"{name}.map is async: a MapFunction's map is a plain (synchronous) def; a function that "
                         "awaits (a throttler, an HTTP call) is a ProcessFunction with async process_message")
    stream_id = function_class.output_stream_id
    if stream_id is None:
        if output_stream_ids and len(output_stream_ids) == 1:
            return output_stream_ids[0]
        if output_stream_ids:
            raise ValueError(f"MapFunction {name} does not say its output stream and the computation has "
                             f"{len(output_stream_ids)} output_stream_ids ({output_stream_ids}): set "
                             f"{name}.output_stream_id to one of them")
        raise ValueError(f"MapFunction {name} does not say its output stream and the computation has no "
                         "output_stream_ids: add the stream it emits to the computation's output_stream_ids "
                         "(egress.testing.ProcessFunctionHarness: pass output_stream_ids=[...])")
    if output_stream_ids is not None and stream_id not in output_stream_ids:
        raise ValueError(f"MapFunction {name} emits to output_stream_id {stream_id!r}, which is not one of the "
                         f"computation's output_stream_ids {output_stream_ids}: add {stream_id!r} to them, or set "
                         f"{name}.output_stream_id to one of them")
    return stream_id
