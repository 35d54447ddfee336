"""The byte-chunk path of a partition job (``docs/architecture.md``, "Byte chunks"): an identity
computation whose input is stored as chunks of lines passes each chunk to its sinks as a reference,
without making a row of any record.

:meth:`ChunkPath.of` decides once, when the job starts, whether the path applies; anything it does
not cover (a stored row among the input, a sink that takes no chunks, another engine) runs the row
path, which gives the same messages, ids, ``seq``s and bodies.
"""

from __future__ import annotations

from collections.abc import Mapping

from egress.connectors.base import ChunkSink, Sink
from egress.engines import ChunkAt, Engine, LineChunkLog, LogMessage, OutboxChunk
from egress.keys import EMPTY_KEY, derived_message_id
from egress.runtime.epoch import EpochOutput, EpochStep
from egress.runtime.plan import ComputationPlan
from egress.spec import StreamSpec

IDENTITY_SUFFIX = derived_message_id(b"", 0)
"""What an identity appends to each input id: its one output's index (0)."""


class ChunkPath:
    """Reads the job's one input as chunks and routes them to the outbox as references."""

    def __init__(self, engine: LineChunkLog, input_stream: str, output_stream: str, partition: int,
                 sinks: Mapping[str, ChunkSink]) -> None:
        self._engine = engine
        self._input = (input_stream, partition)
        self._output = output_stream
        self._sinks = sinks

    @classmethod
    def of(cls, plan: ComputationPlan, streams: Mapping[str, StreamSpec], engine: Engine, partition: int,
           sinks: Mapping[str, Sink], *, throttled: bool) -> ChunkPath | None:
        """The path for ``plan``'s job on ``partition``, or ``None`` where it does not apply: the engine
        stores chunks (``LineChunkLog``); the function is ``byte_level`` (``egress.IdentityMap``); one
        input and one output stream, with the same single ``string`` column and no ``group_by``; the
        output read by no other computation; no input throttling (``throttled``); every sink a
        ``ChunkSink`` that takes chunks of that column; the input stream in one lane
        (``egress.runtime.lanes``)."""
        if not isinstance(engine, LineChunkLog) or throttled or not getattr(plan.function_class, "byte_level", False):
            return None
        if len(plan.input_lanes) != 1 or len(plan.output_stream_ids) != 1:
            return None  # one log stream read: a stream written by several readers is in lanes of rows
        input_id, output_id = plan.input_stream_ids[0], plan.output_stream_ids[0]
        source, target = streams.get(input_id), streams.get(output_id)
        if source is None or target is None or source.columns != target.columns or target.group_by:
            return None
        if len(target.columns) != 1 or target.columns[0].type != "string" or output_id in plan.logged_streams:
            return None
        column = target.columns[0].name
        chunk_sinks: dict[str, ChunkSink] = {}
        for sink_id, sink in sinks.items():
            if not isinstance(sink, ChunkSink) or plan.sinks[sink_id].stream_id != output_id \
                    or not sink.takes_chunks(column):
                return None
            chunk_sinks[sink_id] = sink
        return cls(engine, input_id, output_id, partition, chunk_sinks)

    async def read(self, positions: Mapping[tuple[str, int], int], limit: int) -> list[ChunkAt | LogMessage]:
        """About ``limit`` messages of the input from its position: chunks, or stored rows."""
        stream, partition = self._input
        return await self._engine.read_chunks(stream, partition, positions[self._input], limit)

    def split(self, items: list[ChunkAt | LogMessage]) -> tuple[list[ChunkAt], list[LogMessage]]:
        """``(chunks, [])`` when ``items`` are all chunks, else ``([], items as messages)`` (the row path)."""
        chunks = [item for item in items if isinstance(item, ChunkAt)]
        if len(chunks) == len(items):
            return chunks, []
        stream, partition = self._input
        messages: list[LogMessage] = []
        for item in items:
            if isinstance(item, ChunkAt):
                chunk = item.chunk
                first = item.offset
                messages.extend(LogMessage(stream, partition, first + i, chunk.message_id(i), EMPTY_KEY, None, row)
                                for i, row in enumerate(chunk.rows()))
            else:
                messages.append(item)
        return [], messages

    def route(self, chunks: list[ChunkAt], step: EpochStep, output: EpochOutput) -> list[OutboxChunk]:
        """The outbox of ``chunks`` (each record emitted unchanged, id suffixed as the identity's output
        0, the next ``seq``s), the input position past them, counted in ``output.messages``."""
        stream, partition = self._input
        routed: list[OutboxChunk] = []
        for at in chunks:
            chunk = at.chunk
            routed.append(OutboxChunk(step.next_seq, self._output, stream, partition, at.offset, IDENTITY_SUFFIX,
                                      chunk.derived(IDENTITY_SUFFIX)))
            step.next_seq += chunk.count
            step.positions[self._input] = at.offset + chunk.count
            output.messages += chunk.count
        return routed

    def distribute(self, outbox: list[OutboxChunk]) -> None:
        """Hand committed ``outbox`` chunks to every sink."""
        for sink in self._sinks.values():
            for entry in outbox:
                sink.distribute_chunk(entry.first_seq, entry.chunk)
