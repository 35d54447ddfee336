"""The pipeline's metadata (subjects ``metadata.<name>``) and the inventory of committed work, on NATS."""

from __future__ import annotations

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.errors import NatsEngineError
from egress.engines.nats.jetstream import Stored
from egress.engines.nats.records import CheckpointRecord
from egress.engines.nats.views import OutboxChunk, committed_chunks, latest_records
from egress.engines.protocols import SOURCE_PREFIX, CommittedInventory


class NatsMeta(NatsConnection):
    """:meth:`read_meta`, :meth:`write_meta` and :meth:`inventory` of the bucket."""

    async def read_meta(self, key: str) -> str | None:
        """The pipeline's metadata value ``key`` (subject ``metadata.<key>``), ``None`` when never written."""
        stored = await self._js().last(self._layout.prefix + self._layout.metadata_key(key))
        return None if stored is None else stored.data.decode()

    async def write_meta(self, key: str, value: str) -> None:
        """Set the metadata value ``key`` (a KV put, stored on the stream's replicas before it returns)."""
        kv = self._kv
        if kv is None:
            raise NatsEngineError(f"{self.url}: the engine is not open; call open() first")
        js, what = self._js(), f"the metadata value {key}"
        async with js.answering(what):
            js.observed(await js.retrying(what, lambda: kv.put(self._layout.metadata_key(key), value.encode())))

    async def inventory(self) -> CommittedInventory:
        """Where committed work waits (:class:`CommittedInventory`): the last log chunk of each log
        partition, every checkpoint, outbox chunk and timer (keyed writes of a redo not yet applied
        included). Reads every outbox chunk and timer: for the drained check, not for a hot path."""
        js, layout = self._js(), self._layout
        log_ends: dict[tuple[str, int], int] = {}
        for slot in sorted({layout.owner_of(subject) for subject in await js.subjects(layout.all_log_chunks())}):
            stored = await js.last(layout.log_chunks(*slot))
            if stored is not None:
                first, count = records.log_chunk_extent(stored.data)
                log_ends[slot] = first + count
        read_positions: dict[tuple[str, int], list[int]] = {}
        acknowledged: dict[tuple[str, int], int] = {}
        last_seqs: dict[tuple[str, int], int] = {}
        generations: dict[tuple[str, int], tuple[int, int]] = {}  # (live generation, checkpoint sequence)
        for stored in await js.scan(layout.checkpoints()):
            consumer, partition = layout.owner_of(stored.subject)
            checkpoint = CheckpointRecord.decode(stored.data)
            acknowledged[(consumer, partition)] = checkpoint.acknowledged
            last_seqs[(consumer, partition)] = checkpoint.last_seq
            generations[(consumer, partition)] = (checkpoint.generation, stored.seq)
            if not consumer.startswith(SOURCE_PREFIX):
                for slot, (offset, _) in checkpoint.positions.items():
                    read_positions.setdefault(slot, []).append(offset)
        outbox: dict[tuple[str, int, str], int] = {}
        by_owner: dict[tuple[str, int], list[Stored]] = {}
        for stored in await js.scan(layout.all_outbox_chunks()):
            by_owner.setdefault(layout.owner_of(stored.subject), []).append(stored)
        for (consumer, partition), stored_chunks in by_owner.items():
            data = {stored.seq: stored.data for stored in stored_chunks}
            chunks = committed_chunks([OutboxChunk(*records.outbox_chunk_range(stored.data), stored.seq)
                                       for stored in stored_chunks], last_seqs.get((consumer, partition), 0))
            for seq, stream in (entry for chunk in chunks for entry in records.outbox_chunk_streams(data[chunk.seq])):
                if seq > acknowledged.get((consumer, partition), 0):  # a chunk partly acknowledged stays whole
                    outbox[(consumer, partition, stream)] = outbox.get((consumer, partition, stream), 0) + 1
        pending = [redo for redo in await js.scan(layout.all_redos())
                   if redo.seq > generations.get(layout.owner_of(redo.subject), (0, 0))[1]]
        timers: dict[tuple[str, int], int] = {}
        live = await js.scan(layout.all_timers())
        for suffix, (_, _, deleted) in latest_records(self._layout, live, pending, ("timer.",)).items():
            subject = layout.prefix + suffix
            owner = layout.owner_of(subject)
            if not deleted and layout.generation_of(subject) == generations.get(owner, (0, 0))[0]:
                timers[owner] = timers.get(owner, 0) + 1
        return CommittedInventory(log_ends, read_positions, outbox, timers)
