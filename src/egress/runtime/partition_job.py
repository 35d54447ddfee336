"""A partition job: one computation's work for one partition, epoch after epoch.

An epoch reads a batch of input messages, runs the process function on each, and commits in one
transaction the new input positions, the emitted messages (outbox for this job's sinks, log for
downstream computations) and the sinks' acknowledged progress. Only committed messages reach the
sinks. On start the job reloads its checkpoint and hands the committed but unacknowledged outbox
to fresh sink instances, which resend it with the same message ids (at-least-once).

The epoch itself (invoke, route, the commit record) is :class:`egress.runtime.epoch.EpochStep`,
without I/O; this module is its driver: start, then read, step, commit, distribute and wait.

Epochs are adaptive: an epoch ends as soon as its input is drained, and the next one starts at once
when something waits for it (input arrived, a sink's state to commit, room to read again, a stop,
a due timer): a lone event is committed and handed to the sinks within one commit of its arrival,
whatever ``epoch_period``. Under load the batches grow by themselves: an epoch starts when the
previous commit is done and takes everything that arrived meanwhile, up to ``epoch_max_messages``.
Only acknowledgements, which nothing waits for, are gathered for up to ``epoch_period`` into one
commit; so are the commits of epochs that only moved the read positions
(:mod:`egress.runtime.deferred_positions`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from egress.clock import Clock, event_or_timeout
from egress.connectors.base import BoundsUnacknowledged, Sink, SinkContext
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import (
    AppendsCallback,
    Checkpoint,
    ChunkAt,
    Engine,
    EpochCommit,
    LogMessage,
    OutboxMessage,
    OutboxReader,
    SinkProgress,
)
from egress.errors import ProcessFunctionError
from egress.observe import Metrics, StatusTree
from egress.observe.epoch_parts import COMMIT as COMMIT_PART
from egress.observe.epoch_parts import DELIVER, PROCESS, READ, THROTTLE, EpochParts
from egress.rows import encode_row
from egress.runtime.api import InitContext, RuntimeContext
from egress.runtime.chunk_path import ChunkPath
from egress.runtime.deferred_positions import DeferredPositions
from egress.runtime.delivery_latency import DeliveryLatency
from egress.runtime.epoch import DueTimer, EpochOutput, EpochStep, StopRequest
from egress.runtime.holds import COMMIT, LEASE, STOPPING, SinkHolds, acknowledged_beyond
from egress.runtime.invoke import Invoker
from egress.runtime.options import RunOptions
from egress.runtime.plan import ComputationPlan, validate_function_parameters
from egress.runtime.state import StateStore
from egress.runtime.stopping import acknowledgements_commit, commit_on_failure
from egress.runtime.timers import TimerQueue
from egress.runtime.trace_contexts import CarriedContexts
from egress.spec import StreamSpec

if TYPE_CHECKING:
    from egress.throttler import InputThrottle, ThrottlerFactory, Throttling

T = TypeVar("T")
# Seqs of the committed outbox read back at a time when a job starts on an engine that reads its
# outbox again (OutboxReader): the memory of a restart after a sink fell far behind.
OUTBOX_PAGE = 4096


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
        notify_downstream: AppendsCallback,
        throttling: Throttling | None = None,
        dead_letters: DeadLetterFiles | None = None,
    ) -> None:
        self.plan = plan
        self._throttling = throttling
        self._dead_letters = dead_letters if dead_letters is not None else DeadLetterFiles()
        self.input_finished = False  # set by the runner once every source is exhausted
        self.partition = partition
        self._streams = streams
        self._partition_count = partition_count
        self._engine = engine
        self._clock = clock
        self._metrics = metrics
        self._status = status
        self._options = options
        self._notify_downstream = notify_downstream
        self._wakeup = asyncio.Event()  # anything for the next epoch: input, acknowledgements, a stop
        # Something waits for the next epoch (input, a stop, a sink state to commit, room to read):
        # it starts at once; acknowledgements alone wait up to epoch_period to share a commit.
        self._waiting = asyncio.Event()
        self._held_back = False  # the last epoch read nothing because the sinks held too much
        self._stop_deadline = float("-inf")  # until when a requested stop waits for acknowledgements
        self._stop_event = asyncio.Event()  # set by stop(): also gives up a wait for throttler quota
        self.stop_request = StopRequest()  # set by stop(), or a signal handler (Pipeline.interrupt)
        self._sink_streams = {sink.stream_id for sink in plan.sinks.values()}
        self.sinks: dict[str, Sink] = {}
        # Each sink with the unacknowledged messages at which input is held back (_may_read).
        self._read_limits: list[tuple[Sink, int]] = []
        # Input messages an epoch reads at most: epoch_max_messages, or less for a sink that bounds
        # what it holds (BoundsUnacknowledged), which one epoch must not overfill.
        self._epoch_limit = options.epoch_max_messages
        self.holds = SinkHolds()  # why the sinks start no new delivery now (egress.runtime.holds)
        # Each sink's acknowledged progress as it last reported it (SinkContext.on_progress).
        self._reported: dict[str, SinkProgress] = {}
        # While the job waits on the engine (a read, a commit): the sink progress its next commit carries.
        self._awaiting_engine: dict[str, SinkProgress] | None = None
        self.idle = False
        # clock.monotonic() when an epoch last read all the input there was (the job's start before):
        # the input lag in seconds is the time since, while there is lag.
        self.caught_up_at = clock.monotonic()
        self._processed = metrics.computation_messages.labels(plan.computation_id)
        self._epochs = metrics.epochs.labels(plan.computation_id)
        self._timers_fired = metrics.timers_fired.labels(plan.computation_id)
        self._throttle_wait = metrics.input_throttle_seconds.labels(plan.computation_id)
        self._parts = EpochParts(clock, metrics.epoch_part_seconds, plan.computation_id, partition)
        self._dynamic_parameters: Any = plan.dynamic_parameters
        self._step: EpochStep | None = None  # once started
        self._chunks: ChunkPath | None = None  # the byte-chunk path, when it applies (decided at start)
        latency = metrics.delivery_latency.bound(plan.computation_id)
        self._latency = DeliveryLatency({sink_id: sink.stream_id for sink_id, sink in plan.sinks.items()},
                                        {sink_id: latency.labels(sink_id) for sink_id in plan.sinks})
        self.timers = TimerQueue()
        self._carried: CarriedContexts | None = None  # tracing on: trace contexts through the log
        self._deferred = DeferredPositions(clock, options.epoch_period)  # an epoch's commit of positions alone

    def wake(self) -> None:
        """Input arrived (or every source ended, or a stop): the next epoch starts at once."""
        self.idle = False
        self._wakeup.set()
        self._waiting.set()

    def stop(self, *, acknowledgements_within: float = 0.0) -> None:
        """Stop this job once the function's call in hand returns: its epoch commits the prefix done
        (``EpochStep.invoke``); the next reads nothing, commits what is acknowledged, and run returns. With
        ``acknowledgements_within`` (seconds, on the clock) the job first reads nothing more and
        waits up to that long for its sinks' deliveries in flight (the sinks start no new one,
        ``Sink.hold``) to be acknowledged, committing them, so that the next owner of the partition
        (an orderly hand-over) sends none of them again."""
        self._stop_deadline = self._clock.monotonic() + acknowledgements_within
        self.stop_request.requested = True
        self._stop_event.set()
        if acknowledgements_within > 0:
            self.holds.set(STOPPING, True)
        self.wake()

    def lease_lapsed(self, lapsed: bool) -> None:
        """The worker's clock says this job's lease lapsed without renewal (``True``: its sinks start
        no new delivery, another worker may run the partition now), or it was renewed (``False``)."""
        self.holds.set(LEASE, lapsed)

    def _acknowledged(self, sink_id: str, progress: SinkProgress) -> None:
        """Sink ``sink_id`` reported ``progress`` (``SinkContext.on_progress``): keep it for the next
        commit and wake the job; while it waits on the engine, hold the sinks once they acknowledged
        beyond what its next commit carries (commit backpressure, ``egress.runtime.holds``): until
        that commit completes, no delivery starts whose acknowledgement would wait for the commit
        after it. The next epoch starts at once when the report changes the sink's state (a batching
        sink sends a batch only once its boundary is committed) or makes room to read input again
        that waited for the sinks; else it gathers acknowledgements for up to ``epoch_period``."""
        previous = self._reported.get(sink_id)
        self._reported[sink_id] = progress
        self.idle = False
        self._wakeup.set()
        if (previous is not None and progress.sink_state != previous.sink_state) \
                or (self._held_back and self._may_read()):
            self._waiting.set()
        if self._awaiting_engine is not None and COMMIT not in self.holds.causes \
                and acknowledged_beyond({sink_id: progress}, self._awaiting_engine):
            self.holds.set(COMMIT, True)

    async def _on_engine(self, call: Awaitable[T], carried: dict[str, SinkProgress]) -> T:
        """``await call`` (a read or a commit of the engine) while the next commit carries the sink
        progress ``carried`` (:meth:`_acknowledged`)."""
        self._awaiting_engine = carried
        try:
            return await call
        finally:
            self._awaiting_engine = None

    def _stopping(self, stop: asyncio.Event | None) -> bool:
        """Whether the next epoch is the last: a stop was asked for and no sink (not blocked) has a
        message in flight any more, or the time it may wait for them is up."""
        if stop is not None and stop.is_set():
            return True
        if not self.stop_request.requested:
            return False
        in_flight = any(sink.terminal_error is None and sink.in_flight for sink in self.sinks.values())
        return not in_flight or self._clock.monotonic() >= self._stop_deadline

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
        """The committed-or-processed input offset per log stream this partition reads (each input
        stream's lanes, ``egress.runtime.lanes``)."""
        positions = {} if self._step is None else self._step.positions
        return {stream: offset for (stream, _), offset in positions.items()}

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
        lag = None if self._step is None else self._step.lag_timestamp
        return lag if lag is not None else self._clock.now()

    @property
    def watermark(self) -> float | None:
        """The event-time watermark: the largest event timestamp processed so far (seconds)."""
        return None if self._step is None else self._step.watermark

    async def run(self, stop: asyncio.Event | None = None, *, generation: int | None = None) -> None:
        """Take the partition at ``generation`` (a lease the caller holds; ``None``: ``acquire`` it now)
        and load its checkpoint, then run epochs until :meth:`stop` is called or ``stop`` is set (the
        epoch that sees it reads nothing, commits what is acknowledged and returns). A commit under a
        lost lease raises :class:`~egress.engines.FencedError`."""
        running = await self._start(generation)
        failure: Exception | None = None
        try:
            while await self._epoch(running, stopping=self._stopping(stop)):
                pass
        except _EpochGivenUp:
            await self._commit_acknowledgements_after_giving_up(running)
        except Exception as error:
            failure = error
            raise
        finally:
            await self._finish(running, failure)

    async def _start(self, generation: int | None) -> _JobRun:
        """Acquire the partition unless the caller holds it at ``generation`` (the lease's fence), load the
        checkpoint and keyed state, create the sinks and the function, and hand the committed but
        unacknowledged outbox to the sinks."""
        plan, engine, cid = self.plan, self._engine, self.plan.computation_id
        if generation is None:
            generation = await engine.acquire(cid, self.partition)
        # An engine that reads its outbox again hands the committed outbox over in pages (below).
        paged = isinstance(engine, OutboxReader)
        checkpoint = await (engine.load_checkpoint(cid, self.partition, list(plan.sinks), with_outbox=False)
                            if paged else engine.load_checkpoint(cid, self.partition, list(plan.sinks)))
        factory, input_throttle = self._throttlers()
        self._carried = CarriedContexts.of(engine, cid, self.partition)
        self._create_sinks(checkpoint.sink_progress)
        store = StateStore(self.partition, self._partition_count)
        self.timers = TimerQueue()
        invoker = _start_function(plan, self.partition, self._clock, store, self.timers, self._streams,
                                  lambda: self._dynamic_parameters, lambda: self.watermark, factory)
        keyed = await engine.load_keyed_state(cid, self.partition, self._partition_count, list(store.external))
        store.load(keyed.internal, keyed.external)
        self.timers.load(keyed.timers)
        positions = {(s, self.partition): checkpoint.input_positions.get((s, self.partition), 0)
                     for s in plan.input_lanes}
        self._step = EpochStep(invoker, self.partition, self._partition_count, sink_streams=self._sink_streams,
                               logged_streams=plan.logged_streams, positions=positions,
                               next_seq=checkpoint.next_seq, watermark=keyed.watermark,
                               committed_progress=dict(checkpoint.sink_progress), stop=self.stop_request)
        if paged:
            await self._distribute_committed(checkpoint)
        else:
            if self._carried is not None:
                await self._carried.load(checkpoint.outbox)
            self._distribute(checkpoint.outbox)
        self._chunks = ChunkPath.of(plan, self._streams or {}, engine, self.partition, self.sinks,
                                    throttled=input_throttle is not None)
        return _JobRun(generation, self._step, factory, input_throttle)

    async def _distribute_committed(self, checkpoint: Checkpoint) -> None:
        """The committed outbox above the lowest persisted seq, read back and distributed
        :data:`OUTBOX_PAGE` seqs at a time: a sink far behind (a webhook endpoint paused for days)
        must not make a restart hold its whole backlog in memory at once (the webhook sink keeps a
        bounded part per endpoint and leaves the rest in the outbox)."""
        engine = self._engine
        assert isinstance(engine, OutboxReader)
        after = min((p.max_persisted_seq_no for p in checkpoint.sink_progress.values()), default=0)
        last = checkpoint.next_seq - 1
        carried = self._carried
        while after < last:
            upto = min(after + OUTBOX_PAGE, last)
            page = await engine.read_outbox(self.plan.computation_id, self.partition, after, upto)
            if carried is not None and page:
                await carried.load(page)  # every context from the first page's seq on, once
                carried = None
            self._distribute(page)
            after = upto

    def _throttlers(self) -> tuple[ThrottlerFactory | None, InputThrottle | None]:
        """The job's throttler factory and its automatic input throttle (``None`` without throttlers)."""
        throttling, cid = self._throttling, self.plan.computation_id
        if throttling is None:
            return None, None
        factory = throttling.factory(cid, client_id=f"{cid}/{self.partition}", timestamp_provider=self.lag_timestamp)
        return factory, throttling.input_throttle(cid, factory)

    def _create_sinks(self, committed: dict[str, SinkProgress]) -> None:
        """One instance per sink, resuming at its committed progress."""
        cid = self.plan.computation_id
        self._reported = {sink_id: committed[sink_id] for sink_id in self.plan.sinks}
        engine = self._engine
        # A sink may leave a backlog in the committed outbox and read it back (the webhook sink).
        read_outbox = (functools.partial(engine.read_outbox, cid, self.partition)
                       if isinstance(engine, OutboxReader) else None)
        for sink_id, sink_plan in self.plan.sinks.items():
            sink_context = SinkContext(cid, sink_id, self.partition, self._clock, self._metrics, self._status,
                                       functools.partial(self._acknowledged, sink_id), self._throttling,
                                       self._dead_letters, read_outbox,
                                       None if self._carried is None else self._carried.by_seq)
            self.sinks[sink_id] = sink_plan.sink_class.create(
                sink_context, sink_plan.parameters, sink_plan.dynamic_parameters, committed[sink_id])
        limit = self._options.max_unacknowledged
        self._read_limits = [(sink, min(limit, sink.unacknowledged_limit) if isinstance(sink, BoundsUnacknowledged)
                              else limit) for sink in self.sinks.values()]
        self._epoch_limit = min([self._options.epoch_max_messages, *(sink.unacknowledged_limit for sink in
                                 self.sinks.values() if isinstance(sink, BoundsUnacknowledged))])
        self.holds.apply(self.sinks.values())

    async def _finish(self, running: _JobRun, failure: Exception | None = None) -> None:
        """Close the function, the sinks and the throttler factory (the job stopped or failed). After
        a ``failure``, once the sinks send no more, commit what they acknowledged (``egress.runtime.stopping``)."""
        await running.step.invoker.function.close()
        for sink in self.sinks.values():
            await sink.close()
        if failure is not None:
            await commit_on_failure(self._engine, acknowledgements_commit(
                self.plan.computation_id, self.partition, running.generation, self.sinks,
                running.step.committed_progress), failure)
        if self._throttling is not None and running.factory is not None:
            await self._throttling.close_factory(running.factory)

    async def _epoch(self, running: _JobRun, *, stopping: bool) -> bool:
        """One epoch: read, step, commit, distribute, then wait; False once ``stopping`` is committed."""
        self._wakeup.clear()  # before reading: a wake during this epoch must not be lost
        self._waiting.clear()
        taken = self._acknowledged_progress()  # after the clear: an acknowledgement is either counted now or wakes
        held_back = self._held_back = not stopping and (self.stop_request.requested or not self._may_read())
        batch: list[LogMessage] = []
        chunks: list[ChunkAt] = []
        due: list[DueTimer] = []
        parts = self._parts  # each part's time (egress.observe.epoch_parts)
        parts.begin()
        if not stopping and not held_back:
            if self._chunks is None:
                batch = await self._on_engine(self._read(running.step.positions), taken)
            else:  # the byte-chunk path: chunks pass as references, anything else as rows
                chunks, batch = self._chunks.split(await self._on_engine(
                    self._chunks.read(running.step.positions, self._chunk_room()), taken))
            parts.mark(READ)
            if len(batch) + sum(at.chunk.count for at in chunks) < self._epoch_limit:
                self.caught_up_at = self._clock.monotonic()
            # Timers are taken after the wait for quota: a wait given up takes (and commits as fired) none.
            if await self._throttle_input(running, batch):
                due = self.timers.pop_due(self._clock.now(), self.watermark, self._options.epoch_max_messages)
            else:  # stopped while waiting for quota: commit what is acknowledged, process nothing
                batch = []
        # While the function runs (not the automatic input throttle: it gives up by itself), its own
        # throttle waits give up when the job is asked to stop.
        if running.factory is not None:
            running.factory.stopping = self._stop_event
        try:
            output = await running.step.invoke(batch, due)
        except ProcessFunctionError:
            if not running.throttle_given_up:
                raise
            raise _EpochGivenUp from None
        finally:
            if running.factory is not None:
                running.factory.stopping = None
        if running.throttle_given_up:  # the function caught ThrottleInterruptedError: discarded alike
            raise _EpochGivenUp
        routed = self._chunks.route(chunks, running.step, output) if chunks and self._chunks is not None else []
        parts.mark(PROCESS)
        commit = running.step.record(running.generation, output, self._acknowledged_progress())
        # A commit of positions alone waits up to epoch_period (egress.runtime.deferred_positions).
        closing = stopping or bool(routed) or self.input_finished or self.stop_request.requested
        may_hold = self._carried is None and not closing
        commit, processed = self._deferred.take(commit, output.messages, running.step.committed_progress,
                                                may_hold=may_hold)
        if commit is not None:
            commit.outbox_chunks = routed
            await self._commit(running.step, commit, output, processed)
        self.holds.set(COMMIT, False)  # what was acknowledged while waiting on the engine is committed
        read = len(batch) + sum(at.chunk.count for at in chunks)
        parts.end(messages=read, timers=len(due),
                  outputs=0 if commit is None else len(commit.outbox) + len(commit.log_appends))
        if stopping:
            return False
        await self._pause(read, held_back=held_back)
        return True

    async def _commit_acknowledgements_after_giving_up(self, running: _JobRun) -> None:
        """The way out of an epoch whose process function gave up waiting for quota (the job is
        stopping): its batch, state and timer changes are discarded, like a failed epoch's (the
        batch is processed again by whoever runs the partition next); what the sinks acknowledged
        is committed, after waiting for their deliveries in flight as an orderly stop does."""
        while True:
            self._wakeup.clear()
            if self._stopping(None):
                break
            await event_or_timeout(self._wakeup, self._clock, max(0.0, self._stop_deadline - self._clock.monotonic()))
        commit = acknowledgements_commit(self.plan.computation_id, self.partition, running.generation, self.sinks,
                                     running.step.committed_progress)
        if commit is not None:
            await self._engine.commit(commit)

    async def _throttle_input(self, running: _JobRun, batch: list[LogMessage]) -> bool:
        """Automatic input throttling (upstream Input.Throttle): the batch waits for quota. False
        when :meth:`stop` came first: the batch got no quota and is not processed (it is read
        again by whoever runs the partition next), so the epoch commits what is acknowledged at once."""
        throttle = running.input_throttle
        if not batch or throttle is None or not throttle.active:
            return True
        running.step.lag_timestamp = batch[0].event_timestamp
        _, bytes_id = throttle.throttler_ids()
        # A message's byte size is that of its stored row (MessagePack, as the log keeps it).
        size = sum(len(encode_row(m.row)) for m in batch) if bytes_id is not None else 0
        waited = await throttle.wait_unless(self._stop_event, len(batch), size, timestamp=running.step.lag_timestamp)
        if waited is None:
            self._parts.skip()
            return False
        self._throttle_wait.inc(waited)
        self._parts.waited(THROTTLE, waited)
        return True

    async def _commit(self, step: EpochStep, commit: EpochCommit, output: EpochOutput, processed: int) -> None:
        """Commit the epoch, then tell the sinks and hand them the new outbox; wake downstream jobs.
        While the commit is in flight, acknowledgements beyond it hold the sinks (:meth:`_acknowledged`)."""
        if self._carried is not None:  # tracing on: outputs carry their input's trace context
            commit = self._carried.inherit(commit)
        await self._on_engine(self._engine.commit(commit), commit.sink_progress)
        self._parts.mark(COMMIT_PART)
        self._epochs.inc()
        self._processed.inc(processed)
        self._timers_fired.inc(output.timers)
        step.committed(commit)
        if self._carried is not None:
            self._carried.committed(commit)
        for sink_id, sink in self.sinks.items():
            sink.committed(commit.sink_progress[sink_id])
        self._distribute(commit.outbox)
        self._latency.committed(commit.outbox, self._clock.monotonic())
        if commit.outbox_chunks and self._chunks is not None:
            self._chunks.distribute(commit.outbox_chunks)
            last = commit.outbox_chunks[-1]
            self._latency.committed_run(last.first_seq + last.chunk.count - 1,
                                        sum(o.chunk.count for o in commit.outbox_chunks), self._clock.monotonic())
        if commit.log_appends:
            self._notify_downstream({(s, p) for s, p, *_ in commit.log_appends})
        self._parts.mark(DELIVER)

    async def _pause(self, read: int, *, held_back: bool) -> None:
        """Wait before the next epoch unless there is more to do at once."""
        if self.stop_request.requested:  # stopping once in flight is acknowledged: an acknowledgement wakes the job
            await event_or_timeout(self._wakeup, self._clock, max(0.0, self._stop_deadline - self._clock.monotonic()))
            return
        if held_back:
            # Input waits for the sinks: close partial batches so they go out now, and read again at
            # once if the acknowledgements reported made room (else no wake-up may ever come: every
            # acknowledgement can have arrived before this turn). On the byte-chunk path a partial
            # batch waits while every sink has deliveries in flight: their acknowledgements wake the
            # job, which reads more lines into it (full 1 MiB bodies), or flushes once none is left.
            if self._chunks is None or not all(sink.in_flight for sink in self.sinks.values()):
                self.flush_sinks()
            if self._may_read():
                return
        if read < self._epoch_limit and not (
                self._may_read() and self.timers.has_due(self._clock.now(), self.watermark)):
            await self._wait(self.timers)

    def _acknowledged_progress(self) -> dict[str, SinkProgress]:
        """Every sink's acknowledged progress as last reported, by sink id (a copy: reports go on)."""
        progress = dict(self._reported)
        self._latency.acknowledged(progress, self._clock.monotonic())
        return progress

    def _may_read(self) -> bool:
        """Whether input may be read: no sink blocked, none holding ``max_unacknowledged`` messages
        (or its own smaller ``unacknowledged_limit``, ``BoundsUnacknowledged``) as of their last reports."""
        return all(sink.terminal_error is None and sink.unacknowledged < limit for sink, limit in self._read_limits)

    def _chunk_room(self) -> int:
        """How many messages the byte-chunk path reads at most: what the sinks may still take before
        ``max_unacknowledged``, at least ``epoch_max_messages`` (chunks are read whole, so an epoch
        takes every chunk that fits, and its one commit covers them all)."""
        held = max((sink.unacknowledged for sink in self.sinks.values()), default=0)
        return max(self._options.epoch_max_messages, self._options.max_unacknowledged - held)

    def flush_sinks(self) -> None:
        """Ask the sinks to send what they buffer now (``Sink.flush``; the Firehose sink's open batch):
        called when input is held back for them, and when the job has caught up with an exhausted input."""
        for sink in self.sinks.values():
            sink.flush()

    async def _read(self, positions: dict[tuple[str, int], int]) -> list[LogMessage]:
        """Up to ``epoch_max_messages`` input messages (fewer for a sink bounding what it holds:
        ``_epoch_limit``), shared fairly between the inputs (:func:`read_shared`)."""
        reads = await read_shared(self._engine, positions, self._epoch_limit)
        if self._carried is not None:  # tracing on: the batch's trace contexts
            await self._carried.read(reads)
        return [message for got in reads.values() for message in got]

    async def _wait(self, timers: TimerQueue) -> None:
        """Sleep until woken or until the next processing-time timer is due. After a wake by
        acknowledgements alone, up to ``epoch_period`` longer (until something waits for the next
        epoch, or the next timer is due), so that one commit gathers many of them."""
        if self.input_finished:
            self.flush_sinks()  # caught up with a finished input: no message is coming to fill a batch
        if not self._wakeup.is_set():
            trigger = self._deferred.trigger(timers.next_processing_trigger() if self._may_read() else None)
            drained = all(sink.unacknowledged == 0 for sink in self.sinks.values())
            self.idle = (drained or self.blocked_error is not None) and trigger is None
            if trigger is None:
                await self._wakeup.wait()
            elif await event_or_timeout(self._wakeup, self._clock, trigger - self._clock.now()):  # the timer came first
                self.idle = False
                return
        self.idle = False
        if self._waiting.is_set():
            return
        linger = self._options.epoch_period
        trigger = timers.next_processing_trigger() if self._may_read() else None
        if trigger is not None:
            linger = min(linger, max(0.0, trigger - self._clock.now()))
        await event_or_timeout(self._waiting, self._clock, linger)

    def _distribute(self, messages: list[OutboxMessage]) -> None:
        if not messages:
            return
        for sink_id, sink in self.sinks.items():
            stream = self.plan.sinks[sink_id].stream_id
            sink.distribute([m for m in messages if m.stream == stream])


class _EpochGivenUp(Exception):  # not an EgressError: control flow caught in this module, never raised out of it
    """The epoch's process function gave up waiting for quota because the job is stopping."""


@dataclass(frozen=True, slots=True)
class _JobRun:
    """What one run of a job holds from its start to its end: its lease ``generation``, its
    :class:`EpochStep`, its throttler ``factory`` and automatic ``input_throttle`` (``None``
    without throttlers)."""

    generation: int
    step: EpochStep
    factory: ThrottlerFactory | None
    input_throttle: InputThrottle | None

    @property
    def throttle_given_up(self) -> bool:
        """Whether a ``handle.throttle`` of the process function was given up because the job is
        stopping (:class:`~egress.throttler.ThrottleInterruptedError`) during this epoch."""
        return self.factory is not None and self.factory.interrupted


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
    return Invoker(plan.computation_id, function, context, store, timers, plan.output_stream_ids, streams,
                   plan.input_lanes)


async def read_shared(engine: Engine, positions: dict[tuple[str, int], int],
                      limit: int) -> dict[tuple[str, int], list[LogMessage]]:
    """Up to ``limit`` messages from the inputs at ``positions`` (by ``(stream, partition)``), each
    input getting an equal share first (so a backlog on one input cannot starve another, e.g. the
    responses of a feedback loop behind a long event stream), then the rest of the room in stream order."""
    share = max(1, limit // len(positions)) if positions else limit
    reads: dict[tuple[str, int], list[LogMessage]] = {}
    for (stream, partition), offset in positions.items():
        reads[(stream, partition)] = await engine.read(stream, partition, offset, share)
    room = limit - sum(len(r) for r in reads.values())
    for (stream, partition), got in reads.items():
        if room <= 0:
            break
        if len(got) == share:
            more = await engine.read(stream, partition, positions[(stream, partition)] + share, room)
            got.extend(more)
            room -= len(more)
    return reads
