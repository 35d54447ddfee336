"""A partition job: one computation's work for one partition, epoch after epoch.

An epoch reads a batch of input messages, runs the process function on each, and commits in one
transaction the new input positions, the emitted messages (outbox for this job's sinks, log for
downstream computations) and the sinks' acknowledged progress. Only committed messages reach the
sinks. On start the job reloads its checkpoint and hands the committed but unacknowledged outbox
to fresh sink instances, which resend it with the same message ids (at-least-once).
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from egress.clock import Clock
from egress.connectors.base import Sink, SinkContext
from egress.engines import EpochCommit, LogMessage, OutboxMessage, SqliteEngine
from egress.errors import ProcessFunctionError
from egress.keys import decode_key, derived_message_id, encode_key, partition_of
from egress.observe import Metrics, StatusTree
from egress.runtime.api import InitContext, Message, OutputCollector, RuntimeContext
from egress.runtime.options import RunOptions
from egress.runtime.plan import ComputationPlan
from egress.spec import StreamSpec

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str, bytes),
    "int64": (int,),
    "double": (float, int),
    "boolean": (bool,),
}


class PartitionJob:
    """Runs ``plan`` for ``partition``. ``wake()`` tells it that input or acknowledgements arrived."""

    def __init__(
        self,
        plan: ComputationPlan,
        partition: int,
        *,
        streams: dict[str, StreamSpec],
        partition_count: int,
        engine: SqliteEngine,
        clock: Clock,
        metrics: Metrics,
        status: StatusTree,
        options: RunOptions,
        notify_downstream: Any,
    ) -> None:
        self.plan = plan
        self.partition = partition
        self._streams = streams
        self._partition_count = partition_count
        self._engine = engine
        self._clock = clock
        self._metrics = metrics
        self._status = status
        self._options = options
        self._notify_downstream = notify_downstream
        self._wakeup = asyncio.Event()
        self._sink_streams = {sink.stream_id for sink in plan.sinks.values()}
        self.sinks: dict[str, Sink] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self.idle = False
        self._processed = metrics.computation_messages.labels(plan.computation_id)
        self._epochs = metrics.epochs.labels(plan.computation_id)

    def wake(self) -> None:
        self.idle = False
        self._wakeup.set()

    @property
    def blocked_error(self) -> str | None:
        """The terminal error of a sink that blocks this job's progress, if any."""
        for sink_id, sink in self.sinks.items():
            if sink.terminal_error is not None:
                return f"{self.plan.computation_id}/{sink_id} partition {self.partition}: {sink.terminal_error}"
        return None

    async def run(self, stop: asyncio.Event) -> None:
        plan, engine, options = self.plan, self._engine, self._options
        cid = plan.computation_id
        epoch = await engine.acquire(cid, self.partition)
        checkpoint = await engine.load_checkpoint(cid, self.partition, list(plan.sinks))
        positions = self._positions = {(s, self.partition): checkpoint.input_positions.get((s, self.partition), 0)
                                       for s in plan.input_stream_ids}
        next_seq = checkpoint.next_seq
        committed = dict(checkpoint.sink_progress)
        for sink_id, sink_plan in plan.sinks.items():
            sink_context = SinkContext(cid, sink_id, self.partition, self._clock, self._metrics, self._status,
                                       self.wake)
            self.sinks[sink_id] = sink_plan.sink_class.create(
                sink_context, sink_plan.parameters, sink_plan.dynamic_parameters, committed[sink_id])
        parameters = dict(plan.parameters)
        function = plan.function_class()
        function.init(InitContext(self._clock, lambda: parameters, self.partition))
        context = RuntimeContext(self._clock, lambda: parameters, self.partition)
        self._distribute(checkpoint.outbox)
        try:
            while True:
                stopping = stop.is_set()
                self._wakeup.clear()  # before reading: a wake during this epoch must not be lost
                batch: list[LogMessage] = []
                if not stopping and self._may_read():
                    batch = await self._read(positions)
                outbox: list[OutboxMessage] = []
                appends: list[tuple[str, int, bytes, bytes, float | None, dict[str, Any]]] = []
                for message in batch:
                    next_seq = await self._process(function, context, message, next_seq, outbox, appends)
                    positions[(message.stream, self.partition)] = message.offset + 1
                progress = {sink_id: sink.progress() for sink_id, sink in self.sinks.items()}
                if batch or progress != committed:
                    low = min((p.max_persisted_seq_no for p in progress.values()), default=None)
                    await engine.commit(EpochCommit(
                        cid, self.partition, epoch, dict(positions), log_appends=appends, outbox=outbox,
                        sink_progress=progress, outbox_acknowledged_seq=low))
                    self._epochs.inc()
                    self._processed.inc(len(batch))
                    committed = progress
                    self._distribute(outbox)
                    if appends:
                        self._notify_downstream({(s, p) for s, p, *_ in appends})
                if stopping:
                    return
                if len(batch) < options.epoch_max_messages:
                    await self._wait()
        finally:
            for sink in self.sinks.values():
                await sink.close()

    def positions(self) -> dict[str, int]:
        """The next input offset per input stream of this partition (the committed or in-epoch one)."""
        return {stream: offset for (stream, _), offset in self._positions.items()}

    def apply_dynamic(self, plan: ComputationPlan) -> None:
        """Apply a new DynamicSpec (already checked): sink parameters now, for every later decision."""
        for sink_id, sink in self.sinks.items():
            sink.reconfigure(plan.sinks[sink_id].dynamic_parameters)

    def _may_read(self) -> bool:
        return all(sink.terminal_error is None and sink.unacknowledged < self._options.max_unacknowledged
                   for sink in self.sinks.values())

    async def _read(self, positions: dict[tuple[str, int], int]) -> list[LogMessage]:
        batch: list[LogMessage] = []
        for (stream, partition), offset in positions.items():
            room = self._options.epoch_max_messages - len(batch)
            if room <= 0:
                break
            batch.extend(await self._engine.read(stream, partition, offset, room))
        return batch

    async def _wait(self) -> None:
        """Sleep until woken, then a little longer so that one commit gathers many acknowledgements."""
        if not self._wakeup.is_set():
            drained = all(sink.unacknowledged == 0 for sink in self.sinks.values())
            self.idle = drained or self.blocked_error is not None
            await self._wakeup.wait()
        self.idle = False
        await self._clock.sleep(self._options.epoch_period)

    async def _process(
        self,
        function: Any,
        context: RuntimeContext,
        message: LogMessage,
        next_seq: int,
        outbox: list[OutboxMessage],
        appends: list[tuple[str, int, bytes, bytes, float | None, dict[str, Any]]],
    ) -> int:
        collector = OutputCollector()
        key = decode_key(message.key)
        try:
            await function.process_message(
                Message(message.stream, key, message.row, message.message_id, message.event_timestamp),
                collector, context)
        except Exception as error:
            raise ProcessFunctionError(
                f"process function of computation {self.plan.computation_id!r} raised on message "
                f"{message.message_id.hex().upper()} of stream {message.stream!r} with key {list(key)!r} "
                f"(partition {self.partition}); nothing from this batch was committed:\n"
                + "".join(traceback.format_exception(error))
            ) from error
        for index, emitted in enumerate(collector.messages):
            stream_id = emitted.stream_id
            row = self._checked_row(stream_id, emitted.row, message)
            stream = self._streams[stream_id]
            out_key = encode_key(emitted.key if emitted.key is not None else [row.get(c) for c in stream.group_by])
            message_id = derived_message_id(message.message_id, index)
            if stream_id in self._sink_streams:
                outbox.append(OutboxMessage(next_seq, stream_id, message_id, out_key, message.event_timestamp, row))
                next_seq += 1
            if stream_id in self.plan.logged_streams:
                appends.append((stream_id, partition_of(out_key, self._partition_count), message_id, out_key,
                                message.event_timestamp, row))
        if collector.timers:
            raise ProcessFunctionError(
                f"computation {self.plan.computation_id!r} set a timer, but timers are not supported yet")
        return next_seq

    def _checked_row(self, stream_id: str, row: dict[str, Any], parent: LogMessage) -> dict[str, Any]:
        where = f"message {parent.message_id.hex().upper()} of stream {parent.stream!r}"
        if stream_id not in self.plan.output_stream_ids:
            raise ProcessFunctionError(
                f"computation {self.plan.computation_id!r} emitted to unknown output stream {stream_id!r} while "
                f"handling {where}; its output_stream_ids are {self.plan.output_stream_ids}")
        stream = self._streams[stream_id]
        for name in row:
            if stream.column(name) is None:
                raise ProcessFunctionError(
                    f"row for stream {stream_id!r} has column {name!r}, which its schema lacks ({where})")
        for column in stream.columns:
            value = row.get(column.name)
            if value is None:
                if column.required:
                    raise ProcessFunctionError(
                        f"row for stream {stream_id!r} has null in required column {column.name!r} ({where})")
                continue
            if not isinstance(value, _TYPES[column.type]) or (column.type != "boolean" and isinstance(value, bool)):
                raise ProcessFunctionError(
                    f"row for stream {stream_id!r}: column {column.name!r} is {column.type}, got "
                    f"{type(value).__name__} ({where})")
        return row

    def _distribute(self, messages: list[OutboxMessage]) -> None:
        if not messages:
            return
        for sink_id, sink in self.sinks.items():
            stream = self.plan.sinks[sink_id].stream_id
            sink.distribute([m for m in messages if m.stream == stream])
