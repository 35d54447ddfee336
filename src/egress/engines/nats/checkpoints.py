"""The loading half of ``CheckpointStore`` on NATS: a consumer partition's checkpoint, outbox and
keyed state, and the views its commits start from."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError
from egress.engines.nats.jetstream import Stored
from egress.engines.nats.records import CheckpointRecord
from egress.engines.nats.subjects import name_token
from egress.engines.nats.views import OutboxChunk, Redo, View, committed_chunks, latest_records
from egress.engines.protocols import Checkpoint, KeyedState, OutboxMessage, SinkProgress
from egress.keys import partition_of

logger = logging.getLogger(__name__)


class NatsCheckpoints(NatsConnection):
    """:meth:`load_checkpoint` and :meth:`load_keyed_state` of the bucket, and the view of each
    consumer partition this process commits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: dict[tuple[str, int], View] = {}
        self._doubtful: set[tuple[str, int]] = set()

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str], *,
                              with_outbox: bool = True) -> Checkpoint:
        view, outbox = await self._load_view(consumer, partition, with_outbox=with_outbox)
        self._views[(consumer, partition)] = view
        self._doubtful.discard((consumer, partition))
        record = view.checkpoint
        progress = {sink: SinkProgress() for sink in sinks}
        progress.update(record.sinks)
        low = max(record.acknowledged, min((p.max_persisted_seq_no for p in progress.values()), default=0))
        next_seq = max([record.last_seq, *(p.max_persisted_seq_no for p in progress.values())]) + 1
        return Checkpoint({slot: offset for slot, (offset, _) in record.positions.items()}, progress,
                          [message for message in outbox if message.seq > low], next_seq)

    async def read_outbox(self, consumer: str, partition: int, after_seq: int, last_seq: int) -> list[OutboxMessage]:
        """The committed outbox messages of ``(consumer, partition)`` with ``after_seq < seq <=
        last_seq`` not trimmed yet, in seq order (``OutboxReader``): only the chunks whose seq range
        meets the range are fetched, by stream sequence, from the view this process commits from (or
        one loaded for the call); a chunk trimmed meanwhile is skipped, its messages being
        acknowledged by every sink."""
        view = self._views.get((consumer, partition))
        if view is None or (consumer, partition) in self._doubtful:
            view, _ = await self._load_view(consumer, partition, with_outbox=False)
        js = self._js()
        messages: list[OutboxMessage] = []
        for chunk in list(view.outbox):
            if chunk.last <= after_seq or chunk.first > last_seq:
                continue
            stored = await js.get(chunk.seq)
            if stored is None:
                continue
            messages.extend(message for message in records.outbox_chunk_messages(stored.data)
                            if after_seq < message.seq <= last_seq)
        messages.sort(key=lambda message: message.seq)
        return messages

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external_tables: list[str]) -> KeyedState:
        js, layout = self._js(), self._layout
        checkpoint_stored = await js.last(layout.checkpoint(consumer, partition))
        checkpoint = (CheckpointRecord() if checkpoint_stored is None
                      else CheckpointRecord.decode(checkpoint_stored.data))
        generation = checkpoint.generation
        await self._retained(self._purge_generations(consumer, partition, generation))
        stored = [*await js.scan(layout.states(consumer, partition, generation)),
                  *await js.scan(layout.timers(consumer, partition, generation))]
        for table in external_tables:
            stored.extend(await js.scan(layout.externals(table)))
        redos = await self._pending_redos(consumer, partition, checkpoint_stored)
        prefixes = (layout.suffix(layout.states(consumer, partition, generation))[:-1],
                    layout.suffix(layout.timers(consumer, partition, generation))[:-1],
                    *(f"external.{name_token(table)}." for table in external_tables))
        latest = latest_records(layout, stored, redos, prefixes)
        internal: dict[str, dict[bytes, bytes]] = {}
        external: dict[str, dict[bytes, bytes]] = {table: {} for table in external_tables}
        timers: list[tuple[bytes, float, str]] = []
        table_of = {f"external.{name_token(table)}.": table for table in external_tables}
        for suffix, (_, data, deleted) in latest.items():
            if deleted:
                continue
            if suffix.startswith("timer."):
                key, trigger, domain = records.unpack(data)
                timers.append((bytes(key), float(trigger), str(domain)))
                continue
            name, key, value = records.unpack(data)
            if partition_of(key, partition_count) != partition:
                continue
            if suffix.startswith("state."):
                internal.setdefault(str(name), {})[bytes(key)] = bytes(value)
            else:
                external[table_of[suffix[:suffix.rindex(".") + 1]]][bytes(key)] = bytes(value)
        return KeyedState(internal, external, timers, checkpoint.watermark)


    async def _retained(self, purge: Awaitable[None]) -> None:
        """Run a purge after a commit: the commit stands whatever happens, and what a failed purge
        left is purged by a later one."""
        try:
            await purge
        except (NatsEngineError, NatsUnavailableError) as error:
            logger.warning("%s", error)

    async def _load_view(self, consumer: str, partition: int, *, with_outbox: bool
                         ) -> tuple[View, list[OutboxMessage]]:
        js, layout = self._js(), self._layout
        stored = await js.last(layout.checkpoint(consumer, partition))
        checkpoint = CheckpointRecord() if stored is None else CheckpointRecord.decode(stored.data)
        stored_chunks = await js.scan(layout.outbox_chunks(consumer, partition))
        chunks = committed_chunks([OutboxChunk(*records.outbox_chunk_range(chunk.data), chunk.seq)
                                   for chunk in stored_chunks], checkpoint.last_seq)
        outbox: list[OutboxMessage] = []
        if with_outbox:
            data = {chunk.seq: chunk.data for chunk in stored_chunks}
            for chunk in chunks:
                outbox.extend(records.outbox_chunk_messages(data[chunk.seq]))
        redo_chunks = await self._pending_redos(consumer, partition, stored)
        redo = None
        if redo_chunks:
            redo = Redo([(layout.prefix + suffix, record, deleted) for chunk in redo_chunks
                          for suffix, record, deleted in records.redo_entries(chunk.data)], redo_chunks[-1].seq)
        return View(checkpoint, chunks, redo), outbox

    async def _pending_redos(self, consumer: str, partition: int, checkpoint: Stored | None) -> list[Stored]:
        """The redo chunks of a consumer partition not applied yet: those of the batch of its
        stored ``checkpoint`` (after it in that batch). An older one is one that a SIGKILL of the
        server brought back after its purge: applying it again would write old values."""
        after = 0 if checkpoint is None else checkpoint.seq
        return [redo for redo in await self._js().scan(self._layout.redos(consumer, partition)) if redo.seq > after]

    async def _purge_generations(self, consumer: str, partition: int, live: int) -> None:
        """Purge the state and timer subjects of the consumer partition's generations below
        ``live`` (no checkpoint names them any more, and generations only grow, so a reader with
        an older checkpoint purges nothing a newer one names)."""
        js, layout = self._js(), self._layout
        for subject_filter in (layout.states(consumer, partition), layout.timers(consumer, partition)):
            found = {layout.generation_of(subject) for subject in await js.subjects(subject_filter)}
            for generation in sorted(found):
                if generation < live:
                    await js.purge(subject_filter[:-1] + f"{generation}.>", None)
