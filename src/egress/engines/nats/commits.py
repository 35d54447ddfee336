"""The committing half of ``CheckpointStore`` on NATS: a commit is one atomic batch fenced by the
lease (docs/cluster.md tells the protocol), plus the redo of keyed writes a batch cannot hold and
the compaction of a generation of keyed subjects."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from egress.engines.nats import records
from egress.engines.nats.appends import NatsAppends
from egress.engines.nats.checkpoints import NatsCheckpoints
from egress.engines.nats.errors import JetStreamRequestError, NatsEngineError
from egress.engines.nats.jetstream import MAX_BATCH, TOMBSTONE, WRONG_LAST_SEQUENCE, Outgoing, expect_last, is_deleted
from egress.engines.nats.locks import locked
from egress.engines.nats.log import NatsLog
from egress.engines.nats.log_index import Chunk
from egress.engines.nats.ownership import NatsOwnership
from egress.engines.nats.records import CheckpointRecord, LogEntry
from egress.engines.nats.retention import NatsRetention
from egress.engines.nats.traces import NatsTraces
from egress.engines.nats.views import OutboxChunk, Redo, View
from egress.engines.protocols import EpochCommit, FencedError
from egress.errors import RowEncodingError
from egress.rows import encode_row, first_unstorable_row_error

logger = logging.getLogger(__name__)

_FIRST_RACE_DELAY = 0.002  # seconds: the most a commit waits after meeting another writer's appends, doubled
_LAST_RACE_DELAY = 0.064  # after each race it loses in a row up to this


class _LogRace:
    """The races one commit lost to other writers appending to its log partitions (the other
    partitions of a computation writing the same stream; a source's readers write lanes of their own,
    ``egress.runtime.lanes``, and never meet): they are
    normal, not faults, so the commit is retried for as long as the engine waits out an outage
    (``outage_timeout``), each retry after a random part of a delay doubling from
    :data:`_FIRST_RACE_DELAY` to :data:`_LAST_RACE_DELAY`, so that writers that collided do not
    meet again in step (a writer that has just read the ends would otherwise arrive, each time,
    just behind the next commit of one that knows them already). A lost lease ends the retries
    sooner: each refusal is checked for a fence first."""

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + timeout
        self._delay = _FIRST_RACE_DELAY
        self.lost = 0

    async def retry(self) -> bool:
        """Count a lost race and wait before the next attempt; ``False`` (no wait) once the time is up."""
        self.lost += 1
        if self._loop.time() >= self._deadline:
            return False
        await asyncio.sleep(random.uniform(0.0, self._delay))
        self._delay = min(self._delay * 2, _LAST_RACE_DELAY)
        return True


class NatsCommits(NatsCheckpoints, NatsOwnership, NatsLog, NatsAppends, NatsRetention, NatsTraces):
    """:meth:`commit` into the bucket: fenced by the lease (:class:`NatsOwnership`), appending to
    the log (:class:`NatsLog`), noting its appends (:class:`NatsAppends`), trimming the log now and
    then (:class:`NatsRetention`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self.races_lost = 0
        """Commits refused because another writer had appended to one of their log partitions first,
        each sent again (:class:`_LogRace`), since this engine was made."""

    async def close(self) -> None:
        """Close, saying how many log-append races the commits lost (:attr:`races_lost`), if any."""
        if self.races_lost:
            logger.info("NATS %s: bucket %s: %d log-append races lost (commits sent again after another writer's "
                        "appends to the same log partition)", self.url, self.bucket, self.races_lost)
        await super().close()

    async def acquire(self, consumer: str, partition: int) -> int:
        """:meth:`NatsOwnership.acquire`, then this process's view of the consumer partition is
        forgotten (doubts about an earlier commit too): its next commit starts from what is committed."""
        generation = await super().acquire(consumer, partition)
        self._views.pop((consumer, partition), None)
        self._doubtful.discard((consumer, partition))
        return generation

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """:meth:`NatsOwnership.try_acquire`, then, when taken, this process's view of the consumer
        partition is forgotten: its next commit starts from what is committed."""
        generation = await super().try_acquire(consumer, partition, owner, ttl)
        if generation is not None:
            self._views.pop((consumer, partition), None)
        return generation

    async def commit(self, commit: EpochCommit) -> None:
        """Apply ``commit`` as one atomic, fenced batch (plus, for an epoch with more keyed writes
        than a batch holds, their redo afterwards); raises ``FencedError`` if ``commit.generation`` is
        not the lease's revision, :class:`NatsEngineError` if the server refuses it otherwise."""
        consumer, partition = commit.consumer, commit.partition
        async with locked(self._consumer_locks, [(consumer, partition)]):  # renew() and release() too
            fence = self._fence(consumer, partition, commit.generation)
            if (consumer, partition) in self._doubtful:
                raise NatsEngineError(f"{self.url}: bucket {self.bucket}: an earlier commit of {consumer} partition "
                                      f"{partition} failed and may or may not have been stored; load_checkpoint "
                                      "(restart the job from its committed checkpoint) before committing again")
            try:
                await self._commit_locked(commit, fence)
            except (FencedError, RowEncodingError):  # refused before or by the server: nothing stored
                raise
            except BaseException:  # a lost connection, an outage, a cancellation: stored or not, unknown here
                self._doubtful.add((consumer, partition))
                self._views.pop((consumer, partition), None)
                raise
        if self._clock.monotonic() - self._last_trim >= self.retention_period and not self._trimming:
            await self._retained(self.trim())

    async def _commit_locked(self, commit: EpochCommit, fence: int) -> None:
        """:meth:`commit` with the consumer partition's lock held."""
        consumer, partition = commit.consumer, commit.partition
        view = self._views.get((consumer, partition))
        if view is None:
            view, _ = await self._load_view(consumer, partition, with_outbox=False)
            self._views[(consumer, partition)] = view
        if view.redo is not None:
            await self._apply_redo(consumer, partition, commit.generation, fence, view)
        slots = sorted({(append[0], append[1]) for append in commit.log_appends})
        async with locked(self._slot_locks, slots):
            written = await self._publish_commit(commit, fence, view, slots)
        await self._notify_appends(slots, [((slot[0], slot[1], chunk.first, chunk.count, chunk.seq), payload)
                                           for slot, chunk, payload in written])
        if view.redo is not None:
            await self._apply_redo(consumer, partition, commit.generation, fence, view)
        await self._retained(self._trim_outbox(consumer, partition, view))
        checkpoint = view.checkpoint
        if checkpoint.markers > max(self.compaction_markers, checkpoint.compacted):
            await self._compact(consumer, partition, commit.generation, fence, view)

    async def _publish_commit(self, commit: EpochCommit, fence: int, view: View,
                              slots: list[tuple[str, int]]) -> list[tuple[tuple[str, int], Chunk, bytes]]:
        """Publish the commit's batch; returns the log chunks it stored with their sequences and
        payloads (none when an earlier attempt had stored it: their sequences are unknown here)."""
        consumer, partition, layout = commit.consumer, commit.partition, self._layout
        entries = _log_entries(commit)
        outbox_messages, outbox_chunks = self._outbox_messages(commit)
        keyed = self._keyed_writes(commit, view.checkpoint.generation)
        hints = {slot: self._hint(slot, offset) for slot, offset in commit.input_positions.items()}
        checkpoint = view.checkpoint.updated(commit, hints)
        markers = sum(deleted for subject, _, deleted in keyed if not subject.startswith(layout.prefix + "external."))
        checkpoint = replace(checkpoint, markers=checkpoint.markers + markers)
        head = Outgoing(layout.checkpoint(consumer, partition), checkpoint.encode(),
                        expect_last(fence, layout.lease(consumer, partition)))
        message_id = uuid.uuid4().hex  # the same for every batch of this commit: the server stores at most one
        if not slots and not keyed and len(outbox_messages) == 1 and not commit.outbox_traces:
            outbox_chunks[0].seq = await self._publish_outbox_first(consumer, partition, commit.generation, fence,
                                                                    outbox_messages[0], head, message_id)
            view.checkpoint = checkpoint
            view.outbox.extend(outbox_chunks)
            return []
        race = _LogRace(self.outage_timeout)
        while True:
            # The ends read at once, just before the batch goes: each round trip between learning an
            # end and publishing is a window in which another writer's commit makes this one lose.
            ends = await self._log_ends_of(slots)
            log_messages, log_chunks = self._log_messages(entries, ends)
            batch = [head, *log_messages, *outbox_messages]
            if commit.log_traces or commit.outbox_traces:  # after the chunks: purged with them (traces.py)
                batch += self._trace_messages(commit, ends)
            redo = len(batch) + len(keyed) > MAX_BATCH
            batch.extend(self._redo_messages(consumer, partition, keyed) if redo else
                         [Outgoing(subject, record, TOMBSTONE if deleted else None)
                          for subject, record, deleted in keyed])
            if len(batch) > MAX_BATCH:
                raise NatsEngineError(f"{self.url}: the commit of {consumer} partition {partition} needs {len(batch)} "
                                      f"messages of up to {self._budget} bytes, over the {MAX_BATCH} of one atomic "
                                      "batch; lower epoch_max_messages or raise the server's max_payload")
            try:
                last = await self._js().publish_batch(batch, message_id)
            except JetStreamRequestError as error:
                refusal = await self._refusal(consumer, partition, commit.generation, fence, error)
                if isinstance(refusal, FencedError) or error.code != WRONG_LAST_SEQUENCE:
                    raise refusal from None
                self._forget_log_ends(ends)  # another writer appended to one of these log partitions
                self.races_lost += 1
                if not await race.retry():
                    raise NatsEngineError(
                        f"{self.url}: bucket {self.bucket}: the log appends of {consumer} partition {partition} met "
                        f"other writers' appends for {self.outage_timeout:g} s ({race.lost} races lost in a row)"
                    ) from None
                continue
            if last is None:  # stored by an attempt whose answer was lost: its sequences come from the server
                await self._stored_earlier(consumer, partition, view, checkpoint, slots)
                return []
            self._batch_stored(last - len(batch) + 1, log_chunks, outbox_chunks)
            view.checkpoint = checkpoint
            view.outbox.extend(outbox_chunks)
            if redo:
                view.redo = Redo(keyed, last)
            return [(slot, chunk, message.payload)
                    for (slot, chunk), message in zip(log_chunks, log_messages, strict=True)]

    async def _log_ends_of(self, slots: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """:meth:`_log_end` of each of ``slots``, those not known here read from the server at once
        (a writer that knows its ends, a lane's reader, asks nothing: no task, no gather)."""
        known = self._log_ends
        ends = {slot: known[slot] for slot in slots if slot in known}
        missing = [slot for slot in slots if slot not in ends]
        if missing:  # the ends read, not looked up again: another commit may forget them meanwhile
            ends.update(zip(missing, await asyncio.gather(*(self._log_end(slot) for slot in missing)), strict=True))
        return ends

    def _forget_log_ends(self, ends: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Forget the log ends a commit that lost a race used: the next attempt reads them again,
        but for those an appends note has advanced meanwhile."""
        for slot, end in ends.items():
            if self._log_ends.get(slot) == end:
                self._log_ends.pop(slot, None)

    def _batch_stored(self, first_seq: int, log_chunks: list[tuple[tuple[str, int], Chunk]],
                      outbox_chunks: list[OutboxChunk]) -> None:
        """Give the chunks of a batch stored from stream sequence ``first_seq`` on (its checkpoint
        there, then the log chunks, then the outbox chunks) their sequences; index the log chunks."""
        for number, chunk in enumerate(log_chunks, first_seq + 1):
            chunk[1].seq = number
            self._index(chunk[0]).add(chunk[1])
            self._advance_log_end(chunk[0], chunk[1].end, number)  # a note may have told a later one
        for number, outbox_chunk in enumerate(outbox_chunks, first_seq + 1 + len(log_chunks)):
            outbox_chunk.seq = number

    async def _publish_outbox_first(self, consumer: str, partition: int, lease_generation: int, fence: int,
                                    chunk: Outgoing, head: Outgoing, message_id: str) -> int:
        """Commit an outbox chunk and its checkpoint as two plain publishes, both fenced by the
        lease, the chunk first; returns the chunk's stream sequence. An atomic batch on a stream of
        one replica in file storage costs the server a file store of its own (a directory, synced,
        removed: more than half its CPU per delivered message, ``docs/benchmarks.md`` session 11); a
        commit that fails between the two leaves an orphan chunk past the checkpoint's outbox, which
        readers skip (:func:`~egress.engines.nats.views.committed_chunks`) and the next commit's chunk
        from that seq replaces. Each publish carries its own ``Nats-Msg-Id``: a replay of a stored
        one comes back with its sequence while the lease is unchanged."""
        lease = self._layout.lease(consumer, partition)
        js = self._js()
        try:
            seq = await js.publish(chunk._replace(headers={**expect_last(fence, lease),
                                                           "Nats-Msg-Id": uuid.uuid4().hex}))
            await js.publish(head._replace(headers={**(head.headers or {}), "Nats-Msg-Id": message_id}))
        except JetStreamRequestError as error:
            raise await self._refusal(consumer, partition, lease_generation, fence, error) from None
        return seq

    async def _stored_earlier(self, consumer: str, partition: int, view: View, checkpoint: CheckpointRecord,
                              slots: list[tuple[str, int]]) -> None:
        """Bring ``view`` and the log ends of ``slots`` up to a commit stored by an earlier attempt of
        the batch: the checkpoint is the one it carried; the outbox and redo chunks (and the log
        ends) are read back, their sequences being unknown here."""
        for slot in slots:
            self._log_ends.pop(slot, None)
        stored, _ = await self._load_view(consumer, partition, with_outbox=False)
        view.checkpoint, view.outbox, view.redo = checkpoint, stored.outbox, stored.redo

    def _log_messages(self, by_slot: dict[tuple[str, int], list[LogEntry]],
                      ends: dict[tuple[str, int], tuple[int, int]]
                      ) -> tuple[list[Outgoing], list[tuple[tuple[str, int], Chunk]]]:
        """The log chunks of the entries of each log partition (:func:`_log_entries`), at offsets
        from ``ends``; the first chunk of each log partition expects that partition's last chunk to
        be the one ``ends`` names."""
        messages: list[Outgoing] = []
        chunks: list[tuple[tuple[str, int], Chunk]] = []
        for slot, entries in by_slot.items():
            first, last_seq = ends[slot]
            for start, end in self._sized(entries, [records.log_entry_size(e) for e in entries],
                                          f"a log message of {slot[0]} partition {slot[1]}"):
                headers = expect_last(last_seq, self._layout.log_chunks(*slot)) if start == 0 else None
                group = entries[start:end]
                messages.append(Outgoing(self._layout.log_chunk(*slot, first + start),
                                         records.log_chunk(slot[0], slot[1], first + start, group), headers))
                chunks.append((slot, Chunk(first + start, len(group), 0, group)))
        return messages, chunks

    def _outbox_messages(self, commit: EpochCommit) -> tuple[list[Outgoing], list[OutboxChunk]]:
        """The outbox chunks of ``commit``; raises :class:`~egress.errors.RowEncodingError` for a row
        that cannot be stored."""
        consumer, partition, outbox = commit.consumer, commit.partition, commit.outbox
        try:
            entries = [records.outbox_entry_of(message) for message in outbox]
        except TypeError:
            raise first_unstorable_row_error(commit.origin, commit.outbox_rows()) from None
        messages: list[Outgoing] = []
        chunks: list[OutboxChunk] = []
        for start, end in self._sized(entries, [records.outbox_entry_size(e) for e in entries],
                                      f"an outbox message of {consumer}"):
            first, last = outbox[start].seq, outbox[end - 1].seq
            messages.append(Outgoing(self._layout.outbox_chunk(consumer, partition, first),
                                     records.outbox_chunk(entries[start:end], first)))
            chunks.append(OutboxChunk(first, last, 0))
        return messages, chunks

    def _keyed_writes(self, commit: EpochCommit, generation: int) -> list[tuple[str, bytes, bool]]:
        """``(subject, record, deleted)`` per key the commit writes (state and timers in
        ``generation``), the last write of a subject winning (timer deletions come before insertions)."""
        layout, consumer, partition = self._layout, commit.consumer, commit.partition
        writes: dict[str, tuple[str, bytes, bool]] = {}

        def write(subject: str, record: list[Any], deleted: bool) -> None:
            writes[subject] = (subject, records.pack(record), deleted)

        for (name, key), value in commit.state_writes.items():
            write(layout.state(consumer, partition, generation, name, key), [name, key, value], value is None)
        for (table, key), row in commit.external_state_writes.items():
            write(layout.external(table, key), [table, key, row], row is None)
        for timers, deleted in ((commit.timers_deleted, True), (commit.timers_set, False)):
            for key, trigger, *rest in timers:
                domain = rest[0] if rest else "processing"
                write(layout.timer(consumer, partition, generation, key, trigger, domain), [key, trigger, domain],
                      deleted)
        for subject, record, _ in writes.values():
            if len(record) > self._budget:
                raise NatsEngineError(f"{self.url}: {self._layout.suffix(subject)}: a value of {len(record)} bytes "
                                      f"is over the server's max_payload; raise max_payload in nats-server's "
                                      "configuration")
        return list(writes.values())

    def _redo_messages(self, consumer: str, partition: int, keyed: list[tuple[str, bytes, bool]]) -> list[Outgoing]:
        entries = [records.redo_entry(self._layout.suffix(subject), record, deleted)
                   for subject, record, deleted in keyed]
        return [Outgoing(self._layout.redo(consumer, partition, number), records.redo_chunk(group))
                for number, group in enumerate(self._groups(entries, f"a keyed write of {consumer}"))]

    def _sized(self, entries: Sequence[Any], sizes: list[int], what: str) -> list[tuple[int, int]]:
        """``(start, end)`` of the chunks of ``entries`` (``sizes``: at least each one's packed size)
        within the budget of a message; raises :class:`NatsEngineError` for an entry alone over it."""
        groups = records.size_groups(sizes, self._budget)
        for start, end in groups:
            if end == start + 1 and sizes[start] > self._budget:
                size = len(records.pack(entries[start]))
                if size > self._budget:
                    raise NatsEngineError(f"{self.url}: {what} is {size} bytes, over the server's max_payload; "
                                          "raise max_payload in nats-server's configuration")
        return groups

    def _groups(self, entries: list[bytes], what: str) -> list[list[bytes]]:
        groups = records.chunked(entries, self._budget)
        for group in groups:
            if len(group) == 1 and len(group[0]) > self._budget:
                raise NatsEngineError(f"{self.url}: {what} is {len(group[0])} bytes, over the server's max_payload; "
                                      "raise max_payload in nats-server's configuration")
        return groups

    async def _apply_redo(self, consumer: str, partition: int, lease_generation: int, fence: int, view: View) -> None:
        """Write the pending redo's keyed writes to their own subjects (fenced batches), then purge it."""
        redo = view.redo
        assert redo is not None
        lease = self._layout.lease(consumer, partition)
        for start in range(0, len(redo.writes), MAX_BATCH):
            writes = redo.writes[start:start + MAX_BATCH]
            batch = [Outgoing(subject, record, TOMBSTONE if deleted else None) for subject, record, deleted in writes]
            batch[0] = batch[0]._replace(headers={**(batch[0].headers or {}), **expect_last(fence, lease)})
            try:
                await self._js().publish_batch(batch)  # None (stored by an earlier attempt) is as good
            except JetStreamRequestError as error:
                raise await self._refusal(consumer, partition, lease_generation, fence, error) from None
        await self._js().purge(self._layout.redos(consumer, partition), redo.last_seq + 1)
        view.redo = None

    async def _trim_outbox(self, consumer: str, partition: int, view: View) -> None:
        """Purge the outbox chunks every sink has persisted."""
        acknowledged = view.checkpoint.acknowledged
        done = [chunk for chunk in view.outbox if chunk.last <= acknowledged]
        if not done:
            return
        kept = [chunk for chunk in view.outbox if chunk.last > acknowledged]
        await self._js().purge(self._layout.outbox_chunks(consumer, partition),
                               kept[0].seq if kept else done[-1].seq + 1)
        if self.traced_outbox:  # a commit's contexts follow its chunks: all of them go when none is kept
            await self._js().purge(self._layout.outbox_traces(consumer, partition), kept[0].seq if kept else None)
        view.outbox = kept
    async def _compact(self, consumer: str, partition: int, lease_generation: int, fence: int, view: View) -> None:
        """Write the live keys and timers of the consumer partition's generation into a new one
        (fenced batches, invisible until the checkpoint names it), commit the checkpoint naming it
        (fenced), then purge the older generations. A crash in between leaves the old generation
        live and the new one's subjects unnamed: a later compaction picks a higher generation and
        purges them."""
        js, layout, old = self._js(), self._layout, view.checkpoint.generation
        stored = [*await js.scan(layout.states(consumer, partition, old)),
                  *await js.scan(layout.timers(consumer, partition, old))]
        generation = max(js.read_floor, fence) + 1  # above every sequence stored yet: above every generation
        live = [Outgoing(layout.in_generation(s.subject, generation), s.data) for s in stored if not is_deleted(s)]
        checkpoint = replace(view.checkpoint, generation=generation, markers=0, compacted=len(live))
        lease = layout.lease(consumer, partition)
        head = Outgoing(layout.checkpoint(consumer, partition), checkpoint.encode(), expect_last(fence, lease))
        groups = [live[start:start + MAX_BATCH - 1] for start in range(0, len(live), MAX_BATCH - 1)] or [[]]
        for number, group in enumerate(groups, 1):
            batch = [*group, head] if number == len(groups) else group
            batch[0] = batch[0]._replace(headers={**(batch[0].headers or {}), **expect_last(fence, lease)})
            try:
                await js.publish_batch(batch, uuid.uuid4().hex)  # None: stored by an earlier attempt, as good
            except JetStreamRequestError as error:
                raise await self._refusal(consumer, partition, lease_generation, fence, error) from None
        view.checkpoint = checkpoint
        await self._retained(self._purge_generations(consumer, partition, generation))


def _log_entries(commit: EpochCommit) -> dict[tuple[str, int], list[LogEntry]]:
    """The log appends of ``commit`` by ``(stream, partition)``, rows encoded (encoded once: a
    commit meeting another writer's appends is retried with the same entries); raises
    :class:`~egress.errors.RowEncodingError` for a row that cannot be stored."""
    by_slot: dict[tuple[str, int], list[LogEntry]] = {}
    try:
        for stream, partition, message_id, key, timestamp, row in commit.log_appends:
            by_slot.setdefault((stream, partition), []).append((message_id, key, timestamp, encode_row(row)))
    except TypeError:
        raise first_unstorable_row_error(commit.origin, commit.log_rows()) from None
    return by_slot
