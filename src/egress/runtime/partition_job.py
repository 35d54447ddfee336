"""A partition job: one computation's work for one partition, epoch after epoch.

An epoch reads a batch of input messages, runs the process function on each, and commits in one
transaction the new input positions, the emitted messages (outbox for this job's sinks, log for
downstream computations) and the sinks' acknowledged progress. Only committed messages reach the
sinks. On start the job reloads its checkpoint and hands the committed but unacknowledged outbox
to fresh sink instances, which resend it with the same message ids (at-least-once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from egress.clock import Clock
from egress.connectors.base import Sink, SinkContext
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import Engine, EpochCommit, LogAppend, LogMessage, OutboxMessage, SinkProgress
from egress.errors import ProcessFunctionError
from egress.keys import decode_key, derived_message_id, partition_of
from egress.observe import Metrics, StatusTree
from egress.rows import encode_row
from egress.runtime.api import InitContext, Message, RuntimeContext, Timer
from egress.runtime.invoke import Invoker, Output
from egress.runtime.options import RunOptions
from egress.runtime.plan import ComputationPlan, validate_function_parameters
from egress.runtime.state import StateStore
from egress.runtime.timers import TimerQueue, timer_message_id
from egress.spec import StreamSpec
from egress.throttler import ThrottlerFactory, Throttling


class PartitionJob:
    """Runs ``plan`` for ``partition``. ``wake()`` tells it that input or acknowledgements arrived."""

    def __init__(
        self,
        plan: ComputationPlan,
        partition: int,
        *,
        streams: dict[str, StreamSpec],
        partition_count: int,
        engine: Engine,
        clock: Clock,
        metrics: Metrics,
        status: StatusTree,
        options: RunOptions,
        notify_downstream: Any,
        throttling: Throttling | None = None,
        dead_letters: DeadLetterFiles | None = None,
    ) -> None:
        self.plan = plan
        self._throttling = throttling
        self._dead_letters = dead_letters if dead_letters is not None else DeadLetterFiles()
        self.input_finished = False  # set by the runner once every source is exhausted
        self._lag_timestamp: float | None = None  # event time of the oldest message not yet processed
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
        self._timers_fired = _TimersFired(plan.computation_id)
        self._dynamic_parameters: Any = plan.dynamic_parameters
        self._watermark: float | None = None
        self.timers = TimerQueue()

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

    def apply_dynamic(self, plan: ComputationPlan) -> None:
        """Apply a reloaded DynamicSpec (already validated into ``plan``): the sinks' dynamic
        parameters and the function's dynamic ``processing_function_parameters``, live."""
        for sink_id, sink in self.sinks.items():
            sink.reconfigure(plan.sinks[sink_id].dynamic_parameters)
        self._dynamic_parameters = plan.dynamic_parameters

    def positions(self) -> dict[str, int]:
        """The committed-or-processed input offset per input stream of this partition."""
        return {stream: offset for (stream, _), offset in self._positions.items()}

    def reconfigure_parameters(self, data: dict[str, Any], *, file: str | None = None) -> None:
        """Apply new dynamic ``processing_function_parameters`` live (from a DynamicSpec reload).

        ``data`` is validated with the function's ``dynamic_parameters_model`` first; on a problem
        :class:`~egress.errors.SpecErrors` is raised (paths ``computations/<id>/processing_function_parameters/...``)
        and the current parameters stay. The next message or timer sees the new values.
        """
        self._dynamic_parameters = validate_function_parameters(
            self.plan.function_class, data, dynamic=True, file=file,
            prefix=f"computations/{self.plan.computation_id}/processing_function_parameters")

    def lag_timestamp(self) -> float:
        """Event time (seconds) of the oldest input message not yet processed (processing time when
        unknown): the throttler serves the most lagging requests of a class first."""
        return self._lag_timestamp if self._lag_timestamp is not None else self._clock.now()

    @property
    def watermark(self) -> float | None:
        """The event-time watermark: the largest event timestamp processed so far (seconds)."""
        return self._watermark

    async def run(self, stop: asyncio.Event) -> None:
        plan, engine, options, clock = self.plan, self._engine, self._options, self._clock
        cid = plan.computation_id
        epoch = await engine.acquire(cid, self.partition)
        checkpoint = await engine.load_checkpoint(cid, self.partition, list(plan.sinks))
        positions = {(s, self.partition): checkpoint.input_positions.get((s, self.partition), 0)
                     for s in plan.input_stream_ids}
        self._positions = positions
        next_seq = checkpoint.next_seq
        committed = dict(checkpoint.sink_progress)
        throttling = self._throttling
        factory = None if throttling is None else throttling.factory(
            cid, client_id=f"{cid}/{self.partition}", timestamp_provider=self.lag_timestamp)
        input_throttle = None if throttling is None or factory is None else throttling.input_throttle(cid, factory)
        throttle_wait = self._metrics.input_throttle_seconds.labels(cid)
        for sink_id, sink_plan in plan.sinks.items():
            sink_context = SinkContext(cid, sink_id, self.partition, clock, self._metrics, self._status,
                                       self.wake, throttling, self._dead_letters)
            self.sinks[sink_id] = sink_plan.sink_class.create(
                sink_context, sink_plan.parameters, sink_plan.dynamic_parameters, committed[sink_id])
        store = StateStore(self.partition, self._partition_count)
        timers = TimerQueue()
        self.timers = timers
        invoker = _start_function(plan, self.partition, clock, store, timers, self._streams,
                                  lambda: self._dynamic_parameters, lambda: self._watermark, factory)
        keyed = await engine.load_keyed_state(cid, self.partition, self._partition_count, list(store.external))
        store.load(keyed.internal, keyed.external)
        timers.load(keyed.timers)
        self._watermark = keyed.watermark
        self._distribute(checkpoint.outbox)
        try:
            while True:
                stopping = stop.is_set()
                self._wakeup.clear()  # before reading: a wake during this epoch must not be lost
                batch: list[LogMessage] = []
                due: list[tuple[bytes, float, str]] = []
                self._take_acknowledged()  # after the clear: an acknowledgement is either counted or wakes
                held_back = not stopping and not self._may_read()
                if not stopping and not held_back:
                    due = timers.pop_due(clock.now(), self._watermark, options.epoch_max_messages)
                    batch = await self._read(positions)
                if batch and input_throttle is not None and input_throttle.active:
                    # Automatic input throttling (upstream Input.Throttle): the batch waits for quota.
                    self._lag_timestamp = batch[0].event_timestamp
                    _, bytes_id = input_throttle.throttler_ids()
                    # A message's byte size is that of its stored row (MessagePack, as the log keeps it).
                    size = sum(len(encode_row(m.row)) for m in batch) if bytes_id is not None else 0
                    throttle_wait.inc(await input_throttle.wait(len(batch), size, timestamp=self._lag_timestamp))
                outbox: list[OutboxMessage] = []
                appends: list[LogAppend] = []
                watermark = self._watermark
                for key, trigger, domain in due:
                    outputs = await invoker.timer(Timer(decode_key(key), trigger, domain), key)  # type: ignore[arg-type]
                    next_seq = self._emit(outputs, timer_message_id(cid, key, trigger, domain),
                                          trigger if domain == "event" else None, next_seq, outbox, appends)
                for message in batch:
                    ts = message.event_timestamp
                    self._lag_timestamp = ts
                    if ts is not None and (self._watermark is None or ts > self._watermark):
                        self._watermark = ts
                    outputs = await invoker.message(
                        Message(message.stream, decode_key(message.key), message.row, message.message_id, ts),
                        message.key)
                    next_seq = self._emit(outputs, message.message_id, ts, next_seq, outbox, appends)
                    positions[(message.stream, self.partition)] = message.offset + 1
                progress = self._take_acknowledged()
                if batch or due or progress != committed:
                    low = min((p.max_persisted_seq_no for p in progress.values()), default=None)
                    state_writes, external_writes = store.take_writes()
                    timers_set, timers_deleted = timers.take_changes()
                    await engine.commit(EpochCommit(
                        cid, self.partition, epoch, dict(positions), log_appends=appends, outbox=outbox,
                        sink_progress=progress, outbox_acknowledged_seq=low, state_writes=state_writes,
                        external_state_writes=external_writes, timers_set=timers_set, timers_deleted=timers_deleted,
                        watermark=self._watermark if self._watermark != watermark else None))
                    self._epochs.inc()
                    self._processed.inc(len(batch))
                    self._timers_fired.inc(len(due))
                    committed = progress
                    for sink_id, sink in self.sinks.items():
                        sink.committed(progress[sink_id])
                    self._distribute(outbox)
                    if appends:
                        self._notify_downstream({(s, p) for s, p, *_ in appends})
                if stopping:
                    return
                if held_back:
                    # Input waits for the sinks: close partial batches so they go out now, and read
                    # again at once if the acknowledgements just counted made room (else no wake-up
                    # may ever come: every acknowledgement can have arrived before this turn).
                    self.flush_sinks()
                    self._take_acknowledged()
                    if self._may_read():
                        continue
                if len(batch) < options.epoch_max_messages and not (
                        self._may_read() and timers.has_due(clock.now(), self._watermark)):
                    await self._wait(timers)
        finally:
            await invoker.function.close()
            for sink in self.sinks.values():
                await sink.close()
            if throttling is not None and factory is not None:
                await throttling.close_factory(factory)

    def _emit(
        self,
        outputs: list[Output],
        parent_id: bytes,
        event_timestamp: float | None,
        next_seq: int,
        outbox: list[OutboxMessage],
        appends: list[LogAppend],
    ) -> int:
        """Route checked outputs: to the outbox for this job's sinks, to the log for other computations."""
        for index, output in enumerate(outputs):
            message_id = derived_message_id(parent_id, index)
            if output.stream_id in self._sink_streams:
                outbox.append(OutboxMessage(next_seq, output.stream_id, message_id, output.key, event_timestamp,
                                            output.row))
                next_seq += 1
            if output.stream_id in self.plan.logged_streams:
                appends.append((output.stream_id, partition_of(output.key, self._partition_count), message_id,
                                output.key, event_timestamp, output.row))
        return next_seq

    def _take_acknowledged(self) -> dict[str, SinkProgress]:
        """Every sink's acknowledged prefix, advanced (``Sink.take_acknowledged``), by sink id."""
        return {sink_id: sink.take_acknowledged() for sink_id, sink in self.sinks.items()}

    def _may_read(self) -> bool:
        """Whether input may be read: no sink blocked, none holding ``max_unacknowledged`` messages
        (current as of the last :meth:`_take_acknowledged`)."""
        return all(sink.terminal_error is None and sink.unacknowledged < self._options.max_unacknowledged
                   for sink in self.sinks.values())

    def flush_sinks(self) -> None:
        """Ask the sinks to send what they buffer now (``Sink.flush``; the Firehose sink's open batch):
        called when input is held back for them, and when the job has caught up with an exhausted input."""
        for sink in self.sinks.values():
            sink.flush()

    async def _read(self, positions: dict[tuple[str, int], int]) -> list[LogMessage]:
        """Up to ``epoch_max_messages`` input messages, each input stream getting an equal share
        first (so a backlog on one input cannot starve another, e.g. the responses of a feedback
        loop behind a long event stream), then the rest of the room in stream order."""
        limit = self._options.epoch_max_messages
        share = max(1, limit // len(positions)) if positions else limit
        reads: dict[tuple[str, int], list[LogMessage]] = {}
        for (stream, partition), offset in positions.items():
            reads[(stream, partition)] = await self._engine.read(stream, partition, offset, share)
        room = limit - sum(len(r) for r in reads.values())
        for (stream, partition), got in reads.items():
            if room <= 0:
                break
            if len(got) == share:
                more = await self._engine.read(stream, partition, positions[(stream, partition)] + share, room)
                got.extend(more)
                room -= len(more)
        return [message for got in reads.values() for message in got]

    async def _wait(self, timers: TimerQueue) -> None:
        """Sleep until woken or until the next processing-time timer is due; after a wake, a little
        longer, so that one commit gathers many acknowledgements."""
        if self.input_finished:
            self.flush_sinks()  # caught up with a finished input: no message is coming to fill a batch
        if not self._wakeup.is_set():
            trigger = timers.next_processing_trigger() if self._may_read() else None
            drained = all(sink.unacknowledged == 0 for sink in self.sinks.values())
            self.idle = (drained or self.blocked_error is not None) and trigger is None
            if trigger is None:
                await self._wakeup.wait()
            elif await self._timer_came_first(trigger - self._clock.now()):
                self.idle = False
                return
        self.idle = False
        await self._clock.sleep(self._options.epoch_period)

    async def _timer_came_first(self, seconds: float) -> bool:
        """Wait for a wake or ``seconds`` on the clock, whichever comes first; True for the clock."""
        waker = asyncio.ensure_future(self._wakeup.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            done, _ = await asyncio.wait({waker, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waker, sleeper):
                task.cancel()
            await asyncio.gather(waker, sleeper, return_exceptions=True)
        return waker not in done

    def _distribute(self, messages: list[OutboxMessage]) -> None:
        if not messages:
            return
        for sink_id, sink in self.sinks.items():
            stream = self.plan.sinks[sink_id].stream_id
            sink.distribute([m for m in messages if m.stream == stream])


def _start_function(
    plan: ComputationPlan,
    partition: int,
    clock: Clock,
    store: StateStore,
    timers: TimerQueue,
    streams: dict[str, StreamSpec] | None,
    dynamic_parameters: Callable[[], Any],
    watermark: Callable[[], float | None],
    throttlers: ThrottlerFactory | None = None,
) -> Invoker:
    """Create the process function, call its ``init`` (state clients register there) and return
    the :class:`Invoker` that calls it; ``init`` raising becomes ``ProcessFunctionError``."""
    function = plan.function_class()
    try:
        function.init(InitContext(clock, partition, store, plan.parameters, dynamic_parameters, watermark, throttlers))
    except Exception as error:
        raise ProcessFunctionError(
            f"init of the process function of computation {plan.computation_id!r} raised (partition "
            f"{partition}): {type(error).__name__}: {error}") from error
    context = RuntimeContext(clock, partition, plan.parameters, dynamic_parameters, watermark, throttlers)
    return Invoker(plan.computation_id, function, context, store, timers, plan.output_stream_ids, streams)


class _TimersFired:
    """Count of fired timers per computation (kept here until observe grows a metric for it)."""

    def __init__(self, computation_id: str) -> None:
        self.computation_id = computation_id
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount
