"""One call of a process function, checked: what the partition job and ``egress.testing`` share.

:class:`Invoker` calls ``process_message`` or ``process_timer`` with a fresh
:class:`OutputCollector`, then checks what the call did: every emitted row against its stream
(known output stream, schema columns and types), every timer against the clock (no trigger in the
past), and serialises the state it touched. Any problem, or an exception from the function,
raises :class:`ProcessFunctionError` naming the computation, the message or timer, its key and the
partition; the partition job then stops without committing the batch.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from egress.engines.protocols import LogMessage
from egress.errors import ProcessFunctionError
from egress.keys import EMPTY_KEY, decode_key, encode_key
from egress.runtime.api import (
    MapFunction,
    Message,
    OutputCollector,
    ProcessFunction,
    RuntimeContext,
    Timer,
    map_output_stream,
)
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue
from egress.spec import StreamSpec

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str, bytes),
    "int64": (int,),
    "double": (float, int),
    "boolean": (bool,),
}


# Exactly the types a column's value may be without further checks: bool is an int to isinstance,
# but not an int64 or a double here; a subclass of a column's type is checked the long way.
_EXACT: dict[str, frozenset[type]] = {
    "string": frozenset({str, bytes}),
    "int64": frozenset({int}),
    "double": frozenset({float, int}),
    "boolean": frozenset({bool}),
}

_Schema = tuple[frozenset[str], list[tuple[str, str, bool, tuple[type, ...], frozenset[type]]], list[str]]


class EmittedMessage(NamedTuple):
    """A checked emitted message: ``stream_id``, ``row`` and its encoded ``key``."""

    stream_id: str
    row: dict[str, Any]
    key: bytes


_new_output = tuple.__new__
"""``_new_output(EmittedMessage, (stream_id, row, key))``: an :class:`EmittedMessage` without the
NamedTuple's Python-level ``__new__`` (0.45 against 0.8 µs; once per emitted message)."""


class Invoker:
    """Runs ``function`` of computation ``computation_id`` for one partition.

    ``streams`` (stream id → spec) enables the schema checks of emitted rows; without it only the
    output stream ids are checked (none when ``output_stream_ids`` is ``None``) and the output key
    is the explicit ``key`` or ``()``.
    """

    def __init__(
        self,
        computation_id: str,
        function: ProcessFunction,
        context: RuntimeContext,
        store: StateStore,
        timers: TimerQueue,
        output_stream_ids: list[str] | None,
        streams: dict[str, StreamSpec] | None = None,
        input_lanes: dict[str, str] | None = None,
    ) -> None:
        self.computation_id = computation_id
        self.input_lanes = None if input_lanes is None or all(n == s for n, s in input_lanes.items()) else input_lanes
        """Each log stream read → the input stream it is a lane of (``egress.runtime.lanes``), or
        ``None`` when every lane read is its stream itself: the function sees the stream, never a lane."""
        self.function = function
        self.context = context
        self.store = store
        self.timers = timers
        self.output_stream_ids = output_stream_ids
        self._outputs = None if output_stream_ids is None else frozenset(output_stream_ids)
        self.streams = streams
        self._schemas: dict[str, _Schema] = {}
        self.map_stream_id: str | None = None
        """The output stream of a :class:`MapFunction` (the runtime then calls its ``map``), else ``None``."""
        self.map_row: Callable[[dict[str, Any], RuntimeContext], Any] | None = None
        """A :class:`MapFunction`'s bound ``map``, else ``None``."""
        self.check_map_row: Callable[[Any, LogMessage], bytes] = self._checked_map_row
        """``check(row, message)`` of :meth:`_map_row_checker`, built once (for a map)."""
        if isinstance(function, MapFunction):
            self.map_stream_id = self._map_stream()
            self.map_row = function.map
            self.check_map_row = self._map_row_checker()

    def _map_stream(self) -> str:
        """The stream a :class:`MapFunction` emits to (:func:`~egress.runtime.api.map_output_stream`).
        Raises ``ProcessFunctionError`` when there is none to choose, or when the function obtained
        state clients (a map keeps none)."""
        function = self.function
        assert isinstance(function, MapFunction)
        name = type(function).__name__
        if self.store.internal or self.store.external:
            raise ProcessFunctionError(
                f"process function {name} of computation {self.computation_id!r} is a MapFunction, which keeps no "
                "state, but its init obtained state clients: derive it from ProcessFunction instead")
        try:
            return map_output_stream(type(function), self.output_stream_ids)
        except ValueError as error:
            raise ProcessFunctionError(f"computation {self.computation_id!r}: {error}") from None

    def _where(self, message_id: bytes, stream_id: str, key: tuple[Any, ...]) -> str:
        return (f"message {message_id.hex().upper()} of stream {stream_id!r} with key {list(key)!r} "
                f"(partition {self.context.partition})")

    def _where_log_message(self, message: LogMessage) -> str:
        lanes = self.input_lanes
        stream = message.stream if lanes is None else lanes.get(message.stream, message.stream)
        return self._where(message.message_id, stream, decode_key(message.key))

    def map_failed(self, message: LogMessage, error: Exception) -> ProcessFunctionError:
        """The error for ``map`` raising ``error`` on ``message``."""
        return self._raised(self._where_log_message(message), error)

    def _map_row_checker(self) -> Callable[[Any, LogMessage], bytes]:
        """``check(row, message)``: the encoded key of ``row``, which ``map`` returned for ``message``,
        checked as an emitted row of :attr:`map_stream_id`; raises ``ProcessFunctionError`` as
        :meth:`message`'s checks do. A row whose every column holds a value of exactly one of its
        type's own Python types (the common case) is accepted in one pass; any other goes through
        the full check, which accepts or refuses it as for a process function's output."""
        assert self.map_stream_id is not None
        schema = self._schema(self.map_stream_id)
        full = self._checked_map_row
        if schema is None:
            return full
        names, columns, group_by = schema
        exact_types = [(name, exact) for name, _, _, _, exact in columns]
        is_superset = names.issuperset

        def check(row: Any, message: LogMessage) -> bytes:
            if type(row) is not dict or not is_superset(row):
                return full(row, message)
            for name, exact in exact_types:
                if type(row.get(name)) not in exact:
                    return full(row, message)
            if not group_by:
                return EMPTY_KEY
            try:
                return encode_key([row.get(column) for column in group_by])
            except TypeError:
                return full(row, message)

        return check

    def _checked_map_row(self, row: Any, message: LogMessage) -> bytes:
        assert self.map_stream_id is not None
        if type(row) is not dict:
            raise ProcessFunctionError(
                f"{type(self.function).__name__}.map of computation {self.computation_id!r} returned "
                f"{type(row).__name__}, not a dict or None, for {self._where_log_message(message)}: a map returns "
                "one row or None; a function that emits several rows per message is a ProcessFunction")
        return self._checked(self.map_stream_id, row, None, self._where_log_message, message).key

    def _where_message(self, message: Message) -> str:
        return self._where(message.message_id, message.stream_id, message.key)

    def _where_timer(self, timer: Timer) -> str:
        return (f"{timer.domain} timer at {timer.trigger_timestamp!r} of key {list(timer.key)!r} "
                f"(partition {self.context.partition})")

    async def message(self, message: Message, encoded_key: bytes) -> list[EmittedMessage]:
        """Call ``process_message``; returns the checked outputs."""
        collector = OutputCollector()
        stateful = self._stateful()
        if stateful:
            self.store.begin(message.key)
        try:
            await self.function.process_message(message, collector, self.context)
        except Exception as error:
            self.store.discard()
            raise self._raised(self._where_message(message), error) from error
        # Where it happened is only spelled out when something is wrong: the text costs per message.
        return self._finish(collector, encoded_key, stateful, self._where_message, message)

    async def timer(self, timer: Timer, encoded_key: bytes) -> list[EmittedMessage]:
        """Call ``process_timer``; returns the checked outputs."""
        collector = OutputCollector()
        self.store.begin(timer.key)
        try:
            await self.function.process_timer(timer, collector, self.context)
        except Exception as error:
            self.store.discard()
            raise self._raised(self._where_timer(timer), error) from error
        return self._finish(collector, encoded_key, self._stateful(), self._where_timer, timer)

    def _raised(self, where: str, error: Exception) -> ProcessFunctionError:
        return ProcessFunctionError(
            f"process function of computation {self.computation_id!r} raised on {where}; nothing from this "
            "batch was committed:\n" + "".join(traceback.format_exception(error)))

    def _stateful(self) -> bool:
        """Whether the function has state clients (they are all created in ``init``): without
        any, a call touches no state and the store's bracketing is skipped (per message)."""
        return bool(self.store.internal or self.store.external)

    def _finish(self, collector: OutputCollector, encoded_key: bytes, stateful: bool,
                describe: Callable[[Any], str], subject: Any) -> list[EmittedMessage]:
        """Check what the call of ``subject`` (a message or timer; ``describe(subject)`` says which,
        in errors only) emitted and set; ``stateful``: the store bracketed the call."""
        if stateful:
            self.store.end(functools.partial(describe, subject))
        if collector.timers:
            now = self.context.now()
            watermark = self.context.watermark()
            for trigger, domain in collector.timers:
                limit = now if domain == "processing" else watermark
                if limit is not None and trigger < limit:
                    raise ProcessFunctionError(
                        f"computation {self.computation_id!r} set a {domain} timer in the past: {trigger!r} < "
                        f"{'now' if domain == 'processing' else 'watermark'} {limit!r}, while handling "
                        f"{describe(subject)}")
                self.timers.add(encoded_key, trigger, domain)
        checked = self._checked
        return [checked(emitted.stream_id, emitted.row, emitted.key, describe, subject)
                for emitted in collector.messages]

    def _checked(self, stream_id: str, row: dict[str, Any], key: tuple[Any, ...] | None,
                 describe: Callable[[Any], str], subject: Any) -> EmittedMessage:
        if self._outputs is not None and stream_id not in self._outputs:
            raise ProcessFunctionError(
                f"computation {self.computation_id!r} emitted to unknown output stream {stream_id!r} while "
                f"handling {describe(subject)}; its output_stream_ids are {self.output_stream_ids}")
        schema = self._schemas.get(stream_id) or self._schema(stream_id)
        if schema is None:
            try:
                return EmittedMessage(stream_id, row, EMPTY_KEY if key is None else encode_key(key))
            except TypeError as error:
                raise self._key_error(stream_id, None, describe(subject), error) from None
        names, columns, group_by = schema
        if not names.issuperset(row):
            name = next(name for name in row if name not in names)
            raise ProcessFunctionError(
                f"row for stream {stream_id!r} has column {name!r}, which its schema lacks ({describe(subject)})")
        for name, kind, required, types, exact in columns:
            value = row.get(name)
            if type(value) in exact:
                continue  # a value of one of the column's own types exactly (the common case, one lookup)
            if value is None:
                if required:
                    raise ProcessFunctionError(
                        f"row for stream {stream_id!r} has null in required column {name!r} ({describe(subject)})")
                continue
            if not isinstance(value, types) or (kind != "boolean" and isinstance(value, bool)):
                raise ProcessFunctionError(
                    f"row for stream {stream_id!r}: column {name!r} is {kind}, got {type(value).__name__} "
                    f"({describe(subject)})")
        if key is None and not group_by:
            return _new_output(EmittedMessage, (stream_id, row, EMPTY_KEY))
        try:
            encoded = encode_key(key if key is not None else [row.get(c) for c in group_by])
            return EmittedMessage(stream_id, row, encoded)
        except TypeError as error:
            raise self._key_error(stream_id, None if key is not None else group_by, describe(subject), error) from None

    def _key_error(self, stream_id: str, group_by: list[str] | None, where: str,
                   error: TypeError) -> ProcessFunctionError:
        """The error for an emitted row whose ``group_by`` columns (``None``: its explicit key) cannot be a key."""
        what = "explicit key" if group_by is None else f"group_by column(s) {group_by}"
        return ProcessFunctionError(
            f"computation {self.computation_id!r} emitted a row for stream {stream_id!r} whose {what} cannot "
            f"be a key ({error}) while handling {where}")

    def _schema(self, stream_id: str) -> _Schema | None:
        """The checks of ``stream_id``'s schema, built once: column names, (name, type, required,
        Python types) per column, and the ``group_by`` columns."""
        found = self._schemas.get(stream_id)
        if found is None and self.streams is not None and stream_id in self.streams:
            stream = self.streams[stream_id]
            found = (frozenset(c.name for c in stream.columns),
                     [(c.name, c.type, c.required, _TYPES[c.type], _EXACT[c.type]) for c in stream.columns],
                     list(stream.group_by))
            self._schemas[stream_id] = found
        return found
