"""A source reader: moves one source's records into its stream's log, exactly once.

Each chunk of records is appended to the log partitions of their keys in the same transaction
that commits the source position, so a crash never loses or doubles a record.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from egress.connectors.base import SourceRecord
from egress.engines import Engine, EpochCommit, LogAppend
from egress.keys import encode_key, partition_of, source_message_id, source_scope
from egress.observe import Metrics
from egress.runtime.options import RunOptions
from egress.runtime.plan import SourcePlan

POSITION = ("", 0)


def finished_key(source_id: str) -> str:
    """The engine metadata key a cluster's source reader sets, to the epoch of its lease, once it
    has read its source to the end (``source_finished.<id>``): every worker's drained check reads it."""
    return f"source_finished.{source_id}"


class SourceReader:
    """Reads ``plan``'s source from its committed position; ``notify(partition)`` is called for
    each partition that received messages, after the commit. Message ids are scoped to
    ``pipeline``, the source and its file (``egress.keys.source_scope``)."""

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
    ) -> None:
        self.plan = plan
        self._scope = source_scope(pipeline, plan.source_id, plan.reads)
        self.consumer = f"source:{plan.source_id}"
        self._engine = engine
        self._base_dir = base_dir
        self._partition_count = partition_count
        self._rows = metrics.source_rows.labels(plan.source_id)
        self._options = options
        self._notify = notify
        self.finished = False
        self._record_finished = record_finished
        self._stop_requested = False

    def stop(self) -> None:
        """Stop after the chunk being read is committed."""
        self._stop_requested = True

    def wake(self) -> None:
        """Nothing to wake: a reader never waits for input."""

    async def run(self, stop: asyncio.Event | None = None, *, epoch: int | None = None) -> None:
        """Read from the committed position under the lease held at ``epoch`` (``None``: ``acquire``
        it now) until the source ends, :meth:`stop` is called or ``stop`` is set. At the end, with
        ``record_finished``, sets :func:`finished_key` to the epoch in the engine's metadata."""
        engine = self._engine
        if epoch is None:
            epoch = await engine.acquire(self.consumer, 0)
        checkpoint = await engine.load_checkpoint(self.consumer, 0, [])
        position = checkpoint.input_positions.get(POSITION, 0)
        source = self.plan.source_class.create(self.plan.source_id, self.plan.parameters, self.plan.stream,
                                               self._base_dir)
        records: Iterator[SourceRecord] = source.records(position)
        chunker = _Chunker(self.plan.stream.group_by, self.plan.stream_id, self._partition_count, self._scope)
        while not (self._stop_requested or (stop is not None and stop.is_set())):
            # Parsing and keying run on a worker thread: the event loop thread is the pipeline's
            # critical path (it runs every partition job and sink), so work leaves it where it can.
            appends, touched, end = await asyncio.to_thread(chunker.take, records, self._options.source_chunk)
            if not appends:
                break
            await engine.commit(EpochCommit(self.consumer, 0, epoch, {POSITION: end}, log_appends=appends))
            self._rows.inc(len(appends))
            for partition in touched:
                self._notify(partition)
        else:
            return
        if self._record_finished:
            await engine.write_meta(finished_key(self.plan.source_id), str(epoch))
        self.finished = True


class _Chunker:
    """Turns source records into log appends: key, partition and message id for each."""

    def __init__(self, group_by: list[str], stream_id: str, partition_count: int, scope: str) -> None:
        self._group_by = group_by
        self._stream_id = stream_id
        self._partition_count = partition_count
        self._scope = scope

    def take(self, records: Iterator[SourceRecord], count: int) -> tuple[list[LogAppend], set[int], int]:
        """Up to ``count`` records as ``(appends, partitions touched, position after the last)``;
        raises what the source raises (``SourceDataError`` for a bad record)."""
        appends: list[LogAppend] = []
        touched: set[int] = set()
        end = 0
        group_by, stream_id, scope = self._group_by, self._stream_id, self._scope
        partition_count = self._partition_count
        for record in itertools.islice(records, count):
            key = encode_key([record.row[c] for c in group_by])
            partition = partition_of(key, partition_count)
            touched.add(partition)
            appends.append((stream_id, partition, source_message_id(scope, 0, record.position), key,
                            record.event_timestamp, record.row))
            end = record.position + 1
        return appends, touched, end
