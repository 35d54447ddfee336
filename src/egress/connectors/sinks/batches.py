"""Batches of consecutive committed messages, for the sinks that send many messages per request:
the Firehose sink (``firehose_http``) and the batching HTTP sink (``batching_http``).

:class:`BatchedSink` is what they share, the whole life of a batch except its delivery:

- **Formation**, in ``seq`` order: a batch takes records while it stays within :class:`BatchLimits`
  (a record count, the encoded body's bytes, optionally the records' own bytes) and closes once it is
  full, ``max_delay`` seconds after its first record (0: at the end of each :meth:`~BatchedSink.distribute`),
  or at :meth:`~BatchedSink.flush`. A record that does not fit even an empty batch (or that the sink
  wants alone) is a batch of its own. A null payload is no record: it joins the open batch, or, with
  none open, is acknowledged in order at once.
- **Committed boundaries**: a closed batch's last ``seq`` is sink state (``SinkProgress.sink_state``,
  :func:`encode_batch_ends`); the batch is sent only once the partition job has committed it
  (:meth:`~BatchedSink.committed`). A new instance re-forms the batches up to the last committed end
  exactly, whatever closed them and whatever the limits are now, so a batch has the same records, and
  so the same key or request id, after a restart; only messages after that end are batched afresh,
  and none of those was ever sent.
- **Sending and acknowledgement**: closed, committed batches run concurrently up to ``max_in_flight``
  (the subclass's :meth:`~BatchedSink._deliver`); the acknowledged prefix advances over handled
  batches in ``seq`` order (delivered, dead-lettered, or only nulls).
- **Terminal failure**: a batch that failed for good with nowhere to put its records stops the
  instance: nothing after it is sent or acknowledged until the sink is recreated.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from egress.connectors.base import SinkContext
from egress.connectors.dead_letters import Attempt, DeadLetter, DeadLetterOutput
from egress.connectors.sinks.holding import HeldStarts
from egress.connectors.sinks.ordering import fresh_messages
from egress.engines import OutboxMessage, SinkProgress
from egress.keys import EMPTY_KEY
from egress.line_chunks import LineChunk, lines_fitting, nth_line_end


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """When a batch is full: ``max_records`` records; ``max_bytes`` bytes of encoded body, counted as
    ``frame_bytes`` plus ``record_bytes(len(record))`` per record; and, when set, ``max_data_bytes`` of
    the records' own bytes. ``max_delay``: seconds after its first record that a batch closes (0: at
    the end of each ``distribute``, so each commit's messages go out together)."""

    max_records: int
    max_bytes: int
    max_delay: float
    record_bytes: Callable[[int], int] = lambda size: size
    frame_bytes: int = 0
    max_data_bytes: int | None = None


@dataclass(slots=True)
class Batch:
    """Consecutive messages (``first_seq``..``last_seq``, nulls included) and their records, with each
    record's message id and ``seq``. ``body_bytes`` counts the encoded body as :class:`BatchLimits`
    says, ``data_bytes`` the records' own bytes."""

    first_seq: int
    last_seq: int = 0
    last_message_id: bytes = b""
    messages: int = 0
    records: list[bytes] = field(default_factory=list)
    record_ids: list[bytes] = field(default_factory=list)
    record_seqs: list[int] = field(default_factory=list)
    arrivals_ms: list[int] = field(default_factory=list)  # filled by a sink that reports them (Firehose)
    data_bytes: int = 0
    body_bytes: int = 0
    oversized: bool = False  # the Firehose sink's: a record over the protocol's limit, never sent
    closed: bool = False
    boundary: bool = False  # closed with records: its last_seq is committed sink state until handled
    done: bool = False
    body: bytes | None = None  # the request body, once encoded for its first attempt
    attempts: list[Attempt] = field(default_factory=list)  # its failed attempts, for its dead letters
    task: asyncio.Task[None] | None = None
    timer: asyncio.Task[None] | None = None
    lines: list[LineRun] = field(default_factory=list)  # a batch of byte chunks' lines: no records then
    line_count: int = 0  # the records in ``lines``

    @property
    def record_count(self) -> int:
        """The batch's records (lines or ``records``)."""
        return self.line_count or len(self.records)

    def first_record_id(self) -> bytes:
        if self.lines:
            run = self.lines[0]
            return run.chunk.message_id(run.first_index)
        return self.record_ids[0]

    def last_record_id(self) -> bytes:
        if self.lines:
            run = self.lines[-1]
            return run.chunk.message_id(run.first_index + run.count - 1)
        return self.record_ids[-1]

    def line_body(self) -> bytes:
        """The lines as one body: each record and its newline (the JSON-lines encoding)."""
        runs = self.lines
        if len(runs) == 1 and runs[0].start == 0 and runs[0].end == len(runs[0].chunk.data):
            return runs[0].chunk.data  # a whole chunk: its bytes as they are
        return b"".join([memoryview(run.chunk.data)[run.start:run.end] for run in runs])  # one copy

    def expand_lines(self) -> None:
        """Make the lines ``records``, ``record_ids`` and ``record_seqs`` (for dead letters, per record)."""
        seq = self.first_seq
        for run in self.lines:
            for offset, record in enumerate(run.chunk.data[run.start:run.end].split(b"\n")[:-1]):
                self.records.append(record)
                self.record_ids.append(run.chunk.message_id(run.first_index + offset))
                self.record_seqs.append(seq)
                seq += 1


@dataclass(frozen=True, slots=True)
class LineRun:
    """Records ``first_index`` .. ``first_index + count - 1`` of ``chunk``: its bytes ``start`` .. ``end``."""

    chunk: LineChunk
    start: int
    end: int
    first_index: int
    count: int


@dataclass(frozen=True, slots=True)
class UnfitRecord:
    """A payload that cannot be a record of this sink: ``error`` says why and what to do; ``data`` is
    its bytes when it has some (so it can be dead-lettered), else ``None``."""

    error: str
    data: bytes | None = None


def encode_batch_ends(ends: tuple[int, ...]) -> bytes:
    """A batching sink's committed state: the last ``seq`` of each closed, unacknowledged batch,
    ascending, as a JSON array (``b""`` for none)."""
    return json.dumps(list(ends), separators=(",", ":")).encode() if ends else b""


def decode_batch_ends(state: bytes, kind: str = "batching sink") -> list[int]:
    """The inverse of :func:`encode_batch_ends`. Raises ``ValueError`` naming ``kind`` for state such
    a sink did not write."""
    if not state:
        return []
    ends = json.loads(state)
    if not isinstance(ends, list) or not all(type(end) is int for end in ends) or ends != sorted(ends):
        raise ValueError(f"{kind} state is not an ascending list of batch ends: {state[:200]!r}")
    return ends


def redrive_progress_of(letters: Sequence[DeadLetter]) -> SinkProgress:
    """Where a new batching sink starts to re-send ``letters`` as messages ``seq`` 1..n (``egress
    redrive``): the letters of one batch (consecutive, one idempotency key) as committed batch ends,
    so they are re-formed into that batch and sent under the same key, whatever the limits are now."""
    ends = [index for index, letter in enumerate(letters, start=1)
            if index == len(letters) or letters[index].idempotency_key != letter.idempotency_key]
    return SinkProgress(sink_state=encode_batch_ends(tuple(ends)))


def batch_letters(context: SinkContext, batch: Batch, key: str, tried: Sequence[Attempt],
                  error: str) -> list[DeadLetter]:
    """The dead letters of ``batch``'s records, one per record, each with the batch's ``key`` (its
    idempotency key or request id), the failed attempts ``tried`` and the final ``error``."""
    now = context.clock.now()
    return [DeadLetter(context.computation_id, context.sink_id, context.partition, seq, message_id, key,
                       record, tuple(tried), error, now)
            for seq, message_id, record in zip(batch.record_seqs, batch.record_ids, batch.records, strict=True)]


class BatchedSink(HeldStarts):
    """The Sink protocol (``egress.connectors.base.Sink``) for a sink that sends batches; see the
    module docs. A subclass sets ``kind`` and ``payload_type_error``, calls ``__init__`` and implements
    :meth:`_deliver`, which ends by calling :meth:`_acknowledge`, :meth:`_dead_letter` or :meth:`_fail`."""

    kind: ClassVar[str] = "batching sink"  # the sink's name in its errors and its sink state's
    payload_type_error: ClassVar[str] = "the payload column must contain a String or null value"

    @classmethod
    def redrive_progress(cls, letters: list[DeadLetter]) -> SinkProgress:
        """See :func:`redrive_progress_of`."""
        return redrive_progress_of(letters)

    def __init__(self, context: SinkContext, progress: SinkProgress, *, payload_column: str, limits: BatchLimits,
                 max_in_flight: int, status_path: str, dead_letters: DeadLetterOutput | None) -> None:
        self._context = context
        self._progress = progress
        self._payload_column = payload_column
        self._limits = limits
        self._max_in_flight = max_in_flight
        self._status_path = status_path
        self._dead_letters = dead_letters
        self._last_distributed_seq = progress.max_persisted_seq_no
        # Batch ends committed by an earlier instance, still to be re-formed; and the highest seq whose
        # batch boundary is committed (a batch ending at or below it may be sent).
        self._replay_ends = collections.deque(
            end for end in decode_batch_ends(progress.sink_state, self.kind) if end > progress.max_persisted_seq_no)
        self._committed_end = self._replay_ends[-1] if self._replay_ends else progress.max_persisted_seq_no
        self._state_ends: tuple[int, ...] = tuple(self._replay_ends)
        self._uncommitted: collections.deque[Batch] = collections.deque()  # closed, boundary not yet committed
        self._batches: collections.deque[Batch] = collections.deque()  # in seq order; the last may be open
        self._open: Batch | None = None
        self._waiting: collections.deque[Batch] = collections.deque()  # closed, beyond max_in_flight
        self._running = 0
        self._held = False  # hold(): no batch starts until resume()
        self._unacknowledged = 0
        self._terminal: tuple[int, str] | None = None

    # -- hooks -------------------------------------------------------------------------------

    def _record_of(self, payload: Any) -> bytes | UnfitRecord:
        """The record of a non-null payload: a ``str``'s UTF-8 or the ``bytes`` themselves; an
        :class:`UnfitRecord` for a payload that cannot be a record."""
        if isinstance(payload, bytes):
            return payload
        if isinstance(payload, str):
            return payload.encode()
        return UnfitRecord(self.payload_type_error)

    def _record_added(self, batch: Batch, record: bytes) -> None:
        """Called after ``record`` joined ``batch`` (the Firehose sink notes its arrival)."""

    def _alone(self, record: bytes) -> bool:
        """Whether ``record`` must be a batch of its own (never when re-forming committed batches)."""
        return False

    async def _deliver(self, batch: Batch) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """Called at the end of :meth:`close` (the subclass closes its HTTP clients)."""

    # -- the Sink protocol -------------------------------------------------------------------

    def distribute(self, messages: list[OutboxMessage]) -> None:
        """Take committed messages in ``seq`` order into batches; a full batch is closed at once and
        sent once its boundary is committed (:meth:`committed`).

        Messages at or below the persisted ``seq`` are skipped (a restart); messages up to the last
        committed batch end of an earlier instance are batched exactly as it committed them. Raises
        ``ValueError`` for a ``seq`` not above the last distributed one.
        """
        column = self._payload_column
        messages = fresh_messages(messages, self._progress.max_persisted_seq_no, self._last_distributed_seq)
        if messages:
            self._last_distributed_seq = messages[-1].seq
        for message in messages:
            payload = message.row.get(column)
            if payload is None:
                self._cover_null(message)
                continue
            record = self._record_of(payload)
            if isinstance(record, UnfitRecord):
                self._reject(message, record)
            else:
                self._add(message, record)
        if self._open is not None and self._limits.max_delay == 0:
            self._close(self._open)
        self._start_waiting()
        self._notify_if_acknowledgeable()

    def distribute_chunk(self, first_seq: int, chunk: LineChunk) -> None:
        """Take committed messages ``first_seq`` .. ``first_seq + chunk.count - 1``, the records of
        ``chunk`` as payloads (``ChunkSink``), into batches as :meth:`distribute` would, each batch
        a run of whole lines sliced from the chunk at its newlines: a record adds its bytes and
        newline to the body (the JSON-lines encoding). While batches of an earlier instance are
        re-formed, the records go through :meth:`distribute` as rows."""
        persisted = self._progress.max_persisted_seq_no
        if first_seq + chunk.count - 1 <= persisted:
            return
        if first_seq <= persisted:
            chunk, first_seq = chunk.tail(persisted + 1 - first_seq), persisted + 1
        if first_seq <= self._last_distributed_seq:
            raise ValueError(f"message seq {first_seq} is not greater than the last distributed "
                             f"{self._last_distributed_seq}")
        if self._replay_ends:
            self.distribute([OutboxMessage(first_seq + i, "", chunk.message_id(i), EMPTY_KEY, None, row)
                             for i, row in enumerate(chunk.rows())])
            return
        self._last_distributed_seq = first_seq + chunk.count - 1
        self._add_lines(first_seq, chunk)
        if self._open is not None and self._limits.max_delay == 0:
            self._close(self._open)
        self._start_waiting()
        self._notify_if_acknowledgeable()

    def _add_lines(self, first_seq: int, chunk: LineChunk) -> None:
        """Put ``chunk``'s records into batches, the bounds of :meth:`_add` checked per run of lines."""
        limits, data, count = self._limits, chunk.data, chunk.count
        start = index = 0
        while index < count:
            batch = self._open
            if batch is not None and batch.records:  # a batch holds rows or lines, never both
                self._close(batch)
                batch = None
            if batch is None:
                batch = self._new_batch(timer=True)
            end, lines = lines_fitting(data, start, limits.max_bytes - limits.frame_bytes - batch.body_bytes,
                                       limits.max_records - batch.line_count, count - index)
            if not lines:
                if batch.line_count:
                    self._close(batch)
                    continue
                end, lines = nth_line_end(data, start, 1), 1  # one record over max_bytes: a batch alone
            seq = first_seq + index
            if not batch.last_seq:
                batch.first_seq = seq
            batch.lines.append(LineRun(chunk, start, end, index, lines))
            batch.last_seq = seq + lines - 1
            batch.last_message_id = chunk.message_id(index + lines - 1)
            batch.messages += lines
            batch.line_count += lines
            batch.body_bytes += end - start
            batch.data_bytes += end - start - lines
            self._unacknowledged += lines
            start, index = end, index + lines
            if batch.line_count >= limits.max_records or batch.body_bytes + limits.frame_bytes >= limits.max_bytes:
                self._close(batch)

    def progress(self) -> SinkProgress:
        return self._progress

    def _report(self) -> None:
        """Advance over the handled batches at the head (in ``seq`` order: one not yet handled stops it),
        release them, and report the prefix with, as ``sink_state``, the ends of the closed batches not
        yet in it (:func:`encode_batch_ends`) and of those still to be re-formed (``SinkContext.on_progress``)."""
        batches = self._batches
        last: Batch | None = None
        while batches and batches[0].done:
            last = batches.popleft()
            self._unacknowledged -= last.messages
        ends = (*(b.last_seq for b in batches if b.boundary), *self._replay_ends)
        if last is not None or ends != self._state_ends:
            self._state_ends = ends
            persisted = self._progress if last is None else SinkProgress(
                self._progress.producer_id, last.last_message_id, last.last_seq)
            self._progress = SinkProgress(persisted.producer_id, persisted.max_persisted_message_id,
                                          persisted.max_persisted_seq_no, encode_batch_ends(ends))
        self._context.on_progress(self._progress)

    def committed(self, progress: SinkProgress) -> None:
        """The batch ends in ``progress.sink_state`` are durable: send the batches they close."""
        ends = decode_batch_ends(progress.sink_state, self.kind)
        if ends and ends[-1] > self._committed_end:
            self._committed_end = ends[-1]
        uncommitted = self._uncommitted
        while uncommitted and uncommitted[0].last_seq <= self._committed_end:
            self._waiting.append(uncommitted.popleft())
        self._start_waiting()

    @property
    def unacknowledged(self) -> int:
        """Distributed messages not in :meth:`progress` (their batch handled since or not), the open
        batch's included, as the protocol says."""
        return self._unacknowledged

    @property
    def terminal_error(self) -> str | None:
        return self._terminal[1] if self._terminal else None

    def flush(self) -> None:
        """Close the open batch now, whatever its size and age, and start sending it.

        For a caller that knows no more messages are coming soon: the end of a finite input, or a
        partition job that stops reading because this sink holds its ``max_unacknowledged`` messages
        (a batch that cannot fill would otherwise wait for ``max_delay``). Like every boundary, this one
        is committed before the batch is sent, so the batch is the same after a restart. Does nothing
        without an open batch.
        """
        if self._open is not None:
            self._close(self._open)
            self._start_waiting()
            self._notify_if_acknowledgeable()

    async def close(self) -> None:
        self._waiting.clear()
        self._uncommitted.clear()
        tasks = [t for b in self._batches for t in (b.task, b.timer) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._closed()

    # -- formation ---------------------------------------------------------------------------

    def _add(self, message: OutboxMessage, record: bytes) -> Batch:
        """Put ``record`` (of ``message``) into the open batch, or a new one when it does not fit.
        (The bounds are checked inline: this runs once per record.)"""
        limits = self._limits
        size = len(record)
        body = limits.record_bytes(size)
        replaying = bool(self._replay_ends)
        alone = not replaying and self._alone(record)
        batch = self._open
        if batch is not None and batch.lines:  # a batch holds rows or lines, never both
            self._close(batch)
            batch = None
        if not replaying and batch is not None and batch.records and (
                alone or len(batch.records) >= limits.max_records
                or batch.body_bytes + body + limits.frame_bytes > limits.max_bytes
                or (limits.max_data_bytes is not None and batch.data_bytes + size > limits.max_data_bytes)):
            self._close(batch)
            batch = None
        if batch is None:  # when replaying, a batch an earlier instance committed: only its end closes it
            batch = self._new_batch(timer=not replaying)
        seq = message.seq
        if not batch.last_seq:
            batch.first_seq = seq
        batch.last_seq = seq
        batch.last_message_id = message.message_id
        batch.messages += 1
        self._unacknowledged += 1
        batch.records.append(record)
        batch.record_ids.append(message.message_id)
        batch.record_seqs.append(seq)
        batch.data_bytes += size
        batch.body_bytes += body
        self._record_added(batch, record)
        if replaying:
            self._close_if_replayed_end(seq)
        elif (alone or len(batch.records) >= limits.max_records
              or batch.body_bytes + limits.frame_bytes >= limits.max_bytes
              or (limits.max_data_bytes is not None and batch.data_bytes >= limits.max_data_bytes)):
            self._close(batch)
        return batch

    def _cover_null(self, message: OutboxMessage) -> None:
        """A null payload: no record; part of the open batch, or acknowledged in order at once."""
        if self._open is not None and self._open.lines:  # its key names its first and last line
            self._close(self._open)
        if self._open is not None:
            self._cover(self._open, message)
        else:
            batch = self._new_batch(timer=False)
            self._cover(batch, message)
            self._close(batch)
        self._close_if_replayed_end(message.seq)

    def _reject(self, message: OutboxMessage, unfit: UnfitRecord) -> None:
        """A payload that cannot be a record: a batch of its own, never sent, given up at once (dead
        letter when it has bytes and there is a dead-letter file, else terminal)."""
        if self._open is not None:
            self._close(self._open)
        batch = self._new_batch(timer=False)
        self._cover(batch, message)
        self._open = None
        batch.closed = True
        if unfit.data is not None and self._dead_letters is not None:
            batch.records.append(unfit.data)
            batch.record_ids.append(message.message_id)
            batch.record_seqs.append(message.seq)
            self._dead_letter(batch, self._batch_key(batch), [], unfit.error)
        else:
            self._fail(batch, unfit.error)
        self._close_if_replayed_end(message.seq)

    def _batch_key(self, batch: Batch) -> str:
        """The key that names ``batch`` at the endpoint and in its dead letters (the Firehose request id,
        the batching sink's idempotency key)."""
        raise NotImplementedError

    def _new_batch(self, *, timer: bool) -> Batch:
        """A new open batch, closed by ``max_delay`` after now when ``timer`` (and the delay is set)."""
        batch = self._open = Batch(first_seq=self._last_distributed_seq)
        self._batches.append(batch)
        delay = self._limits.max_delay
        if timer and delay > 0:
            batch.timer = asyncio.get_running_loop().create_task(self._close_after(batch, delay))
        return batch

    def _close_if_replayed_end(self, seq: int) -> None:
        """Close the open batch where an earlier instance committed a batch end."""
        replay = self._replay_ends
        if replay and seq >= replay[0]:
            replay.popleft()
            if self._open is not None:
                self._close(self._open)

    def _cover(self, batch: Batch, message: OutboxMessage) -> None:
        if not batch.last_seq:
            batch.first_seq = message.seq
        batch.last_seq = message.seq
        batch.last_message_id = message.message_id
        batch.messages += 1
        self._unacknowledged += 1

    async def _close_after(self, batch: Batch, delay: float) -> None:
        await self._context.clock.sleep(delay)
        batch.timer = None
        if not batch.closed:
            self._close(batch)
            self._start_waiting()
            self._notify_if_acknowledgeable()

    def _close(self, batch: Batch) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._open is batch:
            self._open = None
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if not batch.records and not batch.lines:
            self._handled(batch)  # only null payloads: acknowledged in order without a request
            return
        batch.boundary = True
        if self._terminal is not None:
            return
        if batch.last_seq <= self._committed_end:
            self._waiting.append(batch)
        else:  # sent once the job has committed this boundary (committed())
            self._uncommitted.append(batch)
            self._report()

    # -- sending -----------------------------------------------------------------------------

    def _notify_if_acknowledgeable(self) -> None:
        if self._batches and self._batches[0].done:
            self._report()

    def _start_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and not self._held and self._running < self._max_in_flight:
            batch = self._waiting.popleft()
            if self._stopped_before(batch):
                continue
            self._running += 1
            batch.task = loop.create_task(self._deliver(batch))
            batch.task.add_done_callback(functools.partial(self._finished, batch))

    def _stopped_before(self, batch: Batch) -> bool:
        """Whether an earlier batch failed for good: nothing later is sent by this instance."""
        return self._terminal is not None and self._terminal[0] < batch.first_seq

    def _finished(self, batch: Batch, task: asyncio.Task[None]) -> None:
        self._running -= 1
        if not task.cancelled() and task.exception() is not None:  # a bug: stop rather than lose the batch
            self._fail(batch, f"{self.kind} internal error: {task.exception()!r}")
        if self._waiting and not asyncio.get_running_loop().is_closed():
            self._start_waiting()

    # -- endings -----------------------------------------------------------------------------

    def _handled(self, batch: Batch) -> None:
        """Mark ``batch`` done (:meth:`_report` passes it once every earlier one is) and release
        its records."""
        batch.done = True
        batch.records, batch.record_ids, batch.record_seqs, batch.arrivals_ms = [], [], [], []
        batch.body, batch.attempts, batch.lines = None, [], []

    def _acknowledge(self, batch: Batch) -> None:
        """``batch`` is handled (delivered, or its records are durable elsewhere): acknowledge it, in order."""
        self._handled(batch)
        self._context.status.clear_error(self._status_path, batch.first_seq)
        self._report()

    def _dead_letter(self, batch: Batch, key: str, tried: Sequence[Attempt], error: str) -> None:
        """Append ``batch``'s records to the dead-letter file (:func:`batch_letters`) and acknowledge the
        batch once they are durable, or fail for good when they cannot be."""
        assert self._dead_letters is not None
        if batch.lines and not batch.records:
            batch.expand_lines()
        appended = self._dead_letters.append(batch_letters(self._context, batch, key, tried, error))
        appended.add_done_callback(functools.partial(self._dead_letters_written, batch))

    def _dead_letters_written(self, batch: Batch, appended: asyncio.Future[int]) -> None:
        problem = appended.exception()
        if problem is not None:
            assert self._dead_letters is not None
            self._fail(batch, f"cannot write the dead-letter file {self._dead_letters.path}: {problem}")
            return
        self._count_dead_letters(appended.result())
        self._acknowledge(batch)

    def _count_dead_letters(self, lines: int) -> None:
        """Called with the number of dead-letter lines written (the subclass counts them)."""

    def _fail(self, batch: Batch, error: str) -> None:
        """Terminal: nothing after ``batch`` is sent or acknowledged by this instance."""
        self._context.status.set_error(self._status_path, batch.first_seq, error)
        if self._terminal is None or batch.first_seq < self._terminal[0]:
            self._terminal = (batch.first_seq, error)
        for later in self._batches:
            if later.first_seq > batch.first_seq and later.task is not None and not later.task.done():
                later.task.cancel()
        self._report()


__all__ = ["Batch", "BatchLimits", "BatchedSink", "LineRun", "UnfitRecord", "batch_letters", "decode_batch_ends",
           "encode_batch_ends", "redrive_progress_of"]
