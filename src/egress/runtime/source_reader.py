"""A source reader: moves one source's records into its stream's log, exactly once.

Each chunk of records is appended to the log partitions of their keys in the same transaction
that commits the source position, so a crash never loses or doubles a record. A
:class:`~egress.connectors.base.ResumableSource` also commits its source state in that transaction
(internal state :data:`SOURCE_STATE` of the consumer ``source:<id>``, so every engine keeps it).

A source read by ``n`` readers (``SourcePlan.readers``) has one reader per partition ``0 .. n-1``
of the unit ``source:<id>``, each with its own lease, position, state and finished marker; the
source instance of reader ``k`` is told its share (``PartitionedSource.read_partition(k, n)``),
and of a :class:`~egress.connectors.base.DealtSource` how to load reader 0's committed deals.
Reader ``k`` appends to its own lane of the stream (``egress.runtime.lanes``), of which it is the
only writer, so the readers never race each other for a log partition's next offset.
With one reader every key is the one of a single-reader source.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from egress.clock import Clock, RealClock, unless_set
from egress.connectors.base import (
    SOURCE_KEYS,
    DealtSource,
    KeyedLiveSource,
    LiveSource,
    PartitionedSource,
    ResumableSource,
    Source,
    SourceRecord,
)
from egress.connectors.sources.chunks import ChunkedSource, LineChunkSource, RecordChunk, chunks_of
from egress.connectors.sources.live import HoldsBack, TakesAhead, UsesClock
from egress.connectors.sources.unread import unread_records
from egress.engines import Engine, EpochCommit, LineChunkLog, LogAppend, LogChunk
from egress.keys import (
    EMPTY_KEY,
    encode_keys,
    key_in_partition,
    partition_of,
    partitions_of,
    source_message_id,
    source_message_id_prefix,
    source_message_ids,
    source_scope,
)
from egress.line_chunks import LineChunk
from egress.observe import Metrics
from egress.runtime.options import RunOptions
from egress.runtime.plan import SourcePlan
from egress.runtime.trace_contexts import log_traces_of
from egress.runtime.unit import Unit

POSITION = ("", 0)
INLINE_KEYING = 256
"""Live records a reader keys on the event loop at most; a larger batch is keyed on a worker thread."""
SOURCE_STATE = ("source", EMPTY_KEY)
"""Where the reader of a source with one reader commits its source's own state: ``(state name,
encoded key)`` (the empty key, ``encode_key([])``, so every reader of keyed state can decode it);
:func:`source_state_key` gives the key of each reader of a source with several."""


@functools.lru_cache(maxsize=1024)
def source_state_key(partition: int, readers: int) -> tuple[str, bytes]:
    """Where reader ``partition`` of a source with ``readers`` readers commits its source state:
    :data:`SOURCE_STATE` for a single reader; else ``key_in_partition([], partition, readers)``
    (the first ``encode_key([i])`` that hashes to ``partition``): engines load a partition's share of keyed state
    by its keys' partition, and each reader loads its own (``load_keyed_state(consumer, partition,
    readers)``)."""
    if readers == 1:
        return SOURCE_STATE
    return (SOURCE_STATE[0], key_in_partition([], partition, readers))


async def load_source_state(engine: Engine, consumer: str, partition: int = 0, readers: int = 1) -> bytes:
    """The source state committed by reader ``partition`` of ``consumer`` (``b""`` before any)."""
    state = await engine.load_keyed_state(consumer, partition, readers, [])
    name, key = source_state_key(partition, readers)
    return state.internal.get(name, {}).get(key, b"")


def source_state_writes(source: object, committed: bytes, where: tuple[str, bytes] = SOURCE_STATE
                        ) -> dict[tuple[str, bytes], bytes | None]:
    """The state write (at ``where``, :func:`source_state_key`) that commits ``source``'s state when it
    changed since ``committed``."""
    if isinstance(source, ResumableSource) and source.source_state != committed:
        return {where: source.source_state}
    return {}


class DownstreamProgress(NamedTuple):
    """Where one partition job reading a source's stream is, as the runner sees it: its computation,
    partition, read offset in the reader's lane (the next message's; ``None``: the job runs in another
    worker, and the reader uses its committed offset) and its sinks' unacknowledged messages (0 when
    it runs elsewhere: unknown here)."""

    computation_id: str
    partition: int
    read_offset: int | None
    unacknowledged: int


Downstream = Callable[[], list[DownstreamProgress]]
"""The partition jobs of this process that read a source's stream, now (the runner's hook)."""


def downstream_backlog(log_ends: dict[int, int], progress: list[DownstreamProgress]) -> int:
    """The source's records not yet delivered downstream: per computation reading its stream, the
    log messages (``log_ends``: end offset by partition) its jobs have not read plus their sinks'
    unacknowledged messages, summed over its partitions; the largest of the computations (0: none).
    Every ``read_offset`` must be known (a remote job's committed one filled in)."""
    by_computation: dict[str, int] = {}
    for job in progress:
        assert job.read_offset is not None
        waiting = max(0, log_ends.get(job.partition, 0) - job.read_offset) + job.unacknowledged
        by_computation[job.computation_id] = by_computation.get(job.computation_id, 0) + waiting
    return max(by_computation.values(), default=0)


def finished_key(source_id: str, partition: int = 0) -> str:
    """The engine metadata key a cluster's source reader sets, to the generation of its lease, once it
    has read its share of the source to the end (``source_finished.<id>`` for partition 0,
    ``source_finished#<partition>.<id>`` for the others: a source id may hold any character, so the
    partition goes before it): every worker's drained check reads them."""
    return f"source_finished.{source_id}" if partition == 0 else f"source_finished#{partition}.{source_id}"


class SourceReader:
    """Reads reader ``partition``'s share (``0 .. plan.readers-1``) of ``plan``'s source from its
    committed position; ``notify(partition)`` is called for each log partition that received
    messages, after the commit. Message ids are scoped to ``pipeline``, the source and its file
    (``egress.keys.source_scope``)."""

    def __init__(
        self,
        plan: SourcePlan,
        engine: Engine,
        base_dir: Path,
        partition_count: int,
        metrics: Metrics,
        options: RunOptions,
        notify: Callable[[int], None],
        pipeline: str = "",
        *,
        record_finished: bool = False,
        downstream: Downstream | None = None,
        clock: Clock | None = None,
        partition: int = 0,
    ) -> None:
        self.plan = plan
        self._scope = source_scope(pipeline, plan.source_id, plan.reads)
        self.partition = partition
        self.unit = Unit.source(plan.source_id, partition)
        self.lane = plan.lane(partition)
        """The log stream this reader appends to, its only writer (``egress.runtime.lanes``)."""
        self.consumer = self.unit.consumer
        self._state_key = source_state_key(partition, plan.readers)
        self._engine = engine
        self._base_dir = base_dir
        self._partition_count = partition_count
        self._rows = metrics.source_rows.labels(plan.source_id)
        self._commits = metrics.source_commits.labels(plan.source_id)
        self._bad_records = {action: metrics.source_bad_records.labels(plan.source_id, action)
                             for action in ("skip", "dead_letter")}
        self._bad_counted = {"skip": 0, "dead_letter": 0}
        self._options = options
        self._notify = notify
        self.finished = False
        self._record_finished = record_finished
        self._stop_requested = False
        self._stopped = asyncio.Event()  # set by stop(): a live source's start gives way to it
        self._downstream = downstream
        self._clock = clock or RealClock()
        self._log_ends: dict[int, int] = {}  # the lane's end offsets, kept by its one writer
        self._remote_offsets: dict[tuple[str, int], int] = {}  # committed read offsets of jobs elsewhere
        self._remote_read_at: float | None = None
        self._source: Source | LiveSource | None = None

    def unread_records(self) -> int | None:
        """Records the source has not read yet (``egress.connectors.sources.unread``): 0 once it is
        read to its end, ``None`` while unknown (not started, or a source that cannot tell). A chunk
        read and being committed counts in neither this nor the log's lag for that moment."""
        if self.finished:
            return 0
        return None if self._source is None else unread_records(self._source)

    def stop(self) -> None:
        """Stop after the chunk being read is committed (a live source still starting, connecting
        to its server, stops at once)."""
        self._stop_requested = True
        self._stopped.set()

    def wake(self) -> None:
        """Nothing to wake: a reader never waits for input."""

    async def run(self, stop: asyncio.Event | None = None, *, generation: int | None = None) -> None:
        """Read from the committed position under the lease held at ``generation`` (``None``: ``acquire``
        it now) until the source ends, :meth:`stop` is called or ``stop`` is set. At the end, with
        ``record_finished``, sets :func:`finished_key` to the generation in the engine's metadata."""
        engine = self._engine
        if generation is None:
            generation = await engine.acquire(self.consumer, self.partition)
        checkpoint = await engine.load_checkpoint(self.consumer, self.partition, [])
        position = checkpoint.input_positions.get(POSITION, 0)
        source = self._source = self._open_source()
        chunker = _Chunker(self.plan.stream.group_by, self.lane, self._partition_count, self._scope)
        if isinstance(source, LiveSource):
            if not await self._read_live(source, chunker, generation, position, stop):
                return
            await self._finish(generation)
            return
        source_state = b""
        if isinstance(source, ResumableSource):
            source_state = await load_source_state(engine, self.consumer, self.partition, self.plan.readers)
            source.resume(source_state)
        if isinstance(source, LineChunkSource) and self._takes_line_chunks():
            if await self._read_line_chunks(source, generation, position, source_state, stop):
                await self._finish(generation)
            return
        count = self._options.source_chunk
        chunks = (source.record_chunks(position, count) if isinstance(source, ChunkedSource)
                  else chunks_of(source.records(position), count))
        while not self._stopping(stop):
            # Parsing and keying run on a worker thread: the event loop thread is the pipeline's
            # critical path (it runs every partition job and sink), so work leaves it where it can.
            appends, touched, end = await asyncio.to_thread(chunker.take, chunks)
            if not appends:
                break
            state_writes = source_state_writes(source, source_state, self._state_key)
            await engine.commit(EpochCommit(self.consumer, self.partition, generation, {POSITION: end},
                                            log_appends=appends, state_writes=state_writes))
            source_state = state_writes.get(self._state_key) or source_state
            self._committed(source, len(appends), touched)
        else:
            return
        await self._finish(generation)

    def _open_source(self) -> Source | LiveSource:
        """This reader's source, told the capabilities it declares: its partition of the input, where
        reader 0 deals files from, the clock."""
        plan = self.plan
        source: Source | LiveSource = plan.source_class.create(plan.source_id, plan.parameters, plan.stream,
                                                               self._base_dir)
        if isinstance(source, PartitionedSource):
            source.read_partition(self.partition, self.plan.readers)
        if isinstance(source, DealtSource):
            source.deal_from(functools.partial(load_source_state, self._engine, self.consumer,
                                               readers=self.plan.readers))
        if isinstance(source, UsesClock):
            source.use_clock(self._clock)
        return source

    def _takes_line_chunks(self) -> bool:
        """Whether this reader stores chunks of lines as one log row each (the byte-chunk path,
        ``docs/architecture.md``): an engine that can, one reader, and a stream without ``group_by``
        (every record's key is ``[]``, so a chunk's records share one partition)."""
        return isinstance(self._engine, LineChunkLog) and not self.plan.stream.group_by and self.plan.readers == 1

    async def _read_line_chunks(self, source: LineChunkSource, generation: int, position: int, source_state: bytes,
                                stop: asyncio.Event | None) -> bool:
        """Commit each chunk of lines of ``source`` from ``position`` as one log row (``LogChunk``), with
        the position after it and the source state; ``True`` once the source is read to its end."""
        chunks = source.line_chunks(position)
        prefix = source_message_id_prefix(self._scope, 0)
        column, stream = source.line_column, self.lane
        partition = partition_of(EMPTY_KEY, self._partition_count)
        checked = False  # the file's identity, its source state, is known once it is open and then stays
        while not self._stopping(stop):
            item = await asyncio.to_thread(next, chunks, None)  # reading and checking off the event loop
            if item is None:
                return True
            data, first, count = item
            state_writes = {} if checked else source_state_writes(source, source_state, self._state_key)
            chunk = LineChunk(data, count, prefix, first, column)
            await self._engine.commit(EpochCommit(self.consumer, self.partition, generation, {POSITION: first + count},
                                                  state_writes=state_writes,
                                                  log_chunks=[LogChunk(stream, partition, chunk)]))
            checked = True
            self._committed(source, count, (partition,))
        return False

    def _committed(self, source: object, rows: int, partitions: Iterable[int]) -> None:
        """After a commit of ``rows`` rows to ``partitions``: count them, the commit and ``source``'s
        bad records in the metrics, and wake the jobs of those partitions."""
        self._rows.inc(rows)
        self._commits.inc()
        self._count_bad_records(source)
        for partition in partitions:
            self._notify(partition)

    def _count_bad_records(self, source: object) -> None:
        """Add the records ``source``'s ``on_bad_record`` policy dropped since the last call to the metrics."""
        policy = getattr(source, "bad_records", None)
        if policy is None:
            return
        for action, count in (("skip", policy.skipped), ("dead_letter", policy.dead_lettered)):
            if count > self._bad_counted[action]:
                self._bad_records[action].inc(count - self._bad_counted[action])
                self._bad_counted[action] = count

    def _stopping(self, stop: asyncio.Event | None) -> bool:
        return self._stop_requested or (stop is not None and stop.is_set())

    async def _finish(self, generation: int) -> None:
        """The source is read to its end: say so (with ``record_finished``, in the engine's metadata)."""
        if self._record_finished:
            await self._engine.write_meta(finished_key(self.plan.source_id, self.partition), str(generation))
        self.finished = True

    async def _read_live(self, source: LiveSource, chunker: _Chunker, generation: int, position: int,
                         stop: asyncio.Event | None) -> bool:
        """Read the live ``source`` batch by batch, each batch committed with the position and state
        after it, until stopped (``False``) or, with ``until_drained``, caught up with the input's
        end as it was at the start (``True``). A batch waits at most one ``live_poll_period`` for
        its first record. A :class:`~egress.connectors.sources.live.TakesAhead` source's next batch
        is taken and keyed while the batch before commits (a far engine's round trip overlaps the
        reading); the commits stay one after the other, in order, each fenced, so what is committed
        is always a prefix of what was read, and a stop or a failure commits the batch in flight first."""
        engine = self._engine
        keyed = await engine.load_keyed_state(self.consumer, self.partition, self.plan.readers, [])
        name, key = self._state_key
        source_state = keyed.internal.get(name, {}).get(key, b"")
        # Asked once: an isinstance on a runtime-checkable protocol inspects every member (~10 µs).
        keys = source if isinstance(source, KeyedLiveSource) else None
        if keys is not None:
            keys.restore_keys(keyed.internal.get(SOURCE_KEYS, {}))
        holding = source if isinstance(source, HoldsBack) and self._downstream is not None else None
        if holding is not None:
            await self._load_log_ends()
        ahead = isinstance(source, TakesAhead) and source.takes_ahead
        in_flight: asyncio.Task[None] | None = None  # the batch before, committing while this one is read
        try:
            if not await unless_set(source.start(position, source_state, self._options.until_drained), self._stopped,
                                    stop):
                return False
            caught_up = False
            while not self._stopping(stop):
                if holding is not None:
                    await self._tell_backlog(holding)
                records = await source.take(self._options.source_chunk, self._options.live_poll_period)
                if records is None:
                    caught_up = True
                    break
                if not records and source.position == position and source.source_state == source_state:
                    continue
                appends, touched = await self._keyed(chunker, records)
                position, committed_state, source_state = source.position, source_state, source.source_state
                commit = self._live_commit(source, keys, generation, appends, committed_state, records)
                if in_flight is not None:  # commits stay one after the other, in order, each fenced
                    await in_flight
                    in_flight = None
                if ahead:
                    in_flight = asyncio.create_task(self._commit_live(source, holding, commit, touched))
                else:
                    await self._commit_live(source, holding, commit, touched)
            if in_flight is not None:
                await in_flight
                in_flight = None
            return caught_up
        finally:
            if in_flight is not None:  # failed: the batch taken before is committed all the same
                await asyncio.gather(in_flight, return_exceptions=True)
            await source.close()

    def _live_commit(self, source: LiveSource, keys: KeyedLiveSource | None, generation: int,
                     appends: list[LogAppend], committed_state: bytes, records: list[SourceRecord]) -> EpochCommit:
        """The commit of the batch just taken: its appends, the source's position, its state when it
        changed since ``committed_state``, a keyed source's entries (``keys``: the source, when it is
        one), and (tracing on) the trace contexts its ``records`` arrived with."""
        state = source.source_state
        writes: dict[tuple[str, bytes], bytes | None] = {self._state_key: state} if state != committed_state else {}
        if keys is not None:
            writes.update(((SOURCE_KEYS, k), v) for k, v in keys.take_key_writes().items())
        return EpochCommit(self.consumer, self.partition, generation, {POSITION: source.position},
                           log_appends=appends, state_writes=writes, log_traces=log_traces_of(records))

    async def _commit_live(self, source: LiveSource, holding: HoldsBack | None, commit: EpochCommit,
                           touched: set[int]) -> None:
        """Commit one batch of a live source, then tell the source and wake the log's readers."""
        await self._engine.commit(commit)
        if holding is not None:
            self._count_appends(commit.log_appends)
        source.committed()
        self._committed(source, len(commit.log_appends), touched)

    @staticmethod
    async def _keyed(chunker: _Chunker, records: list[SourceRecord]) -> tuple[list[LogAppend], set[int]]:
        """``chunker.take_live(records)``: a small batch (a few POSTs, the usual live batch) on the
        event loop, where keying it costs microseconds; a larger one on a worker thread. The hop to
        a thread and back is a wake-up of each side, which on a loaded machine costs milliseconds
        of every commit's round trip (and every waiting producer waits for it)."""
        if len(records) <= INLINE_KEYING:
            return chunker.take_live(records)
        return await asyncio.to_thread(chunker.take_live, records)

    async def _load_log_ends(self) -> None:
        """The end offsets of this reader's lane: from then on it counts its own appends
        (:meth:`_count_appends`), being the lane's only writer (its lease fences any other)."""
        self._log_ends = {p: await self._engine.end_offset(self.lane, p) for p in range(self._partition_count)}

    def _count_appends(self, appends: list[LogAppend]) -> None:
        for _stream, partition, *_ in appends:
            self._log_ends[partition] += 1

    async def _tell_backlog(self, source: HoldsBack) -> None:
        """Give ``source`` this reader's backlog downstream (:func:`downstream_backlog` of its lane); a
        job that runs in another worker counts from its committed read offset, read from the engine
        at most every ``remote_poll_period``."""
        assert self._downstream is not None
        progress = self._downstream()
        remote = [(job.computation_id, job.partition) for job in progress if job.read_offset is None]
        now = self._clock.monotonic()
        due = self._remote_read_at is None or now - self._remote_read_at >= self._options.remote_poll_period
        if remote and due:
            self._remote_read_at = now
            for computation, partition in remote:
                checkpoint = await self._engine.load_checkpoint(computation, partition, [])
                self._remote_offsets[(computation, partition)] = checkpoint.input_positions.get((self.lane, partition),
                                                                                                0)
        known = [job if job.read_offset is not None else
                 job._replace(read_offset=self._remote_offsets.get((job.computation_id, job.partition), 0))
                 for job in progress]
        source.hold_back(downstream_backlog(self._log_ends, known))


class _Chunker:
    """Turns source records into log appends to ``stream_id`` (the reader's lane): key, partition and
    message id for each, computed a chunk at a time (``egress.keys``' batch forms)."""

    def __init__(self, group_by: list[str], stream_id: str, partition_count: int, scope: str) -> None:
        self._group_by = group_by
        self._stream_id = stream_id
        self._partition_count = partition_count
        self._scope = scope

    def _keyed(self, rows: list[dict[str, object]]) -> tuple[list[bytes], list[int]]:
        keys = encode_keys(rows, self._group_by)
        return keys, partitions_of(keys, self._partition_count)

    def take_live(self, records: list[SourceRecord]) -> tuple[list[LogAppend], set[int]]:
        """``records`` of a live source as ``(appends, partitions touched)``; each record's message id
        counts in its own ``source_partition`` (a followed file's number)."""
        keys, partitions = self._keyed([record.row for record in records])
        scope = self._scope
        appends: list[LogAppend] = [
            (self._stream_id, partition, source_message_id(scope, record.source_partition, record.position), key,
             record.event_timestamp, record.row)
            for record, key, partition in zip(records, keys, partitions, strict=True)]
        return appends, set(partitions)

    def take(self, chunks: Iterator[RecordChunk]) -> tuple[list[LogAppend], set[int], int]:
        """The next of ``chunks`` as ``(appends, partitions touched, position after its last record)``,
        ``([], set(), 0)`` after the last; raises what the source raises (``SourceDataError`` for a
        bad record)."""
        chunk = next(chunks, None)
        if chunk is None:
            return [], set(), 0
        keys, partitions = self._keyed(chunk.rows)
        ids = source_message_ids(self._scope, 0, chunk.positions)
        # The columns are of the chunk's length: the repeated stream id ends with them.
        appends = list(zip(itertools.repeat(self._stream_id), partitions, ids, keys, chunk.event_timestamps,
                           chunk.rows))
        return appends, set(partitions), chunk.positions[-1] + 1
