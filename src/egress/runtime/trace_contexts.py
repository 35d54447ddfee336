"""Trace contexts carried through the log (tracing on only, ``egress.observe.tracing``): a message keeps
the W3C trace context of its source event from the source reader's commit to its sink's requests.

- A source reader commits the contexts of its records (``SourceRecord.trace_context``) as
  ``EpochCommit.log_traces`` (:func:`log_traces_of`).
- A partition job reads the contexts of the input it read (:class:`CarriedContexts`); an output
  message inherits the context of the input message it came from (its derived message id is the
  input's id and an output index, ``egress.runtime.epoch``), committed as ``log_traces`` and
  ``outbox_traces``; the job keeps the outbox contexts by ``seq`` for its sinks
  (``SinkContext.trace_contexts``) until the outbox is trimmed past them, and reads them back from
  the engine when it starts (a restart resends with the same context).

An engine without ``TraceContexts`` carries nothing; with tracing off none of this runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from egress.connectors.base import SourceRecord
from egress.engines import Engine, EpochCommit, LogMessage, OutboxMessage, TraceContexts
from egress.observe import tracing

OUTPUT_INDEX_BYTES = 2  # a derived message id: the input's id, then a u16 output index


def log_traces_of(records: Sequence[SourceRecord]) -> dict[int, str] | None:
    """The contexts of ``records`` by index (their log appends' order), ``None`` when none has one or
    tracing is off."""
    if tracing.active is None:
        return None
    found = {index: record.trace_context for index, record in enumerate(records) if record.trace_context is not None}
    return found or None


class CarriedContexts:
    """One partition job's carried contexts: ``by_seq`` is handed to its sinks
    (``SinkContext.trace_contexts``). ``None`` from :meth:`of` when tracing is off or the engine
    keeps no contexts."""

    def __init__(self, engine: TraceContexts, consumer: str, partition: int) -> None:
        self._engine = engine
        self._consumer = consumer
        self._partition = partition
        self.by_seq: dict[int, str] = {}
        self._inputs: dict[bytes, str] = {}  # message id → context, of the epoch's input batch

    @classmethod
    def of(cls, engine: Engine, consumer: str, partition: int) -> CarriedContexts | None:
        if tracing.active is None or not isinstance(engine, TraceContexts):
            return None
        return cls(engine, consumer, partition)

    async def load(self, outbox: list[OutboxMessage]) -> None:
        """The contexts of the committed outbox handed to the sinks at start."""
        if outbox:
            self.by_seq.update(await self._engine.read_outbox_traces(self._consumer, self._partition,
                                                                     outbox[0].seq - 1))

    async def read(self, reads: Mapping[tuple[str, int], list[LogMessage]]) -> None:
        """The contexts of an epoch's input: ``reads`` are its messages by ``(stream, partition)``,
        consecutive offsets each (one engine call per slot, nothing per message without contexts)."""
        self._inputs = {}
        for (stream, partition), messages in reads.items():
            if not messages:
                continue
            first = messages[0].offset
            found = await self._engine.read_log_traces(stream, partition, first, messages[-1].offset + 1)
            for offset, context in found.items():
                index = offset - first
                if index < len(messages) and messages[index].offset == offset:  # dense, unless a purge cut in
                    self._inputs[messages[index].message_id] = context
                else:
                    self._inputs.update((m.message_id, context) for m in messages if m.offset == offset)

    def inherit(self, commit: EpochCommit) -> EpochCommit:
        """``commit`` with the contexts its outputs inherit from their input messages."""
        inputs = self._inputs
        if not inputs:
            return commit
        cut = -OUTPUT_INDEX_BYTES
        outbox = {m.seq: inputs[m.message_id[:cut]] for m in commit.outbox if m.message_id[:cut] in inputs}
        log = {i: inputs[append[2][:cut]] for i, append in enumerate(commit.log_appends) if append[2][:cut] in inputs}
        if not outbox and not log:
            return commit
        return dataclasses.replace(commit, outbox_traces=outbox or None, log_traces=log or None)

    def committed(self, commit: EpochCommit) -> None:
        """``commit`` is durable: its outbox contexts go to the sinks; those trimmed are dropped."""
        if commit.outbox_traces:
            self.by_seq.update(commit.outbox_traces)
        trimmed = commit.outbox_acknowledged_seq
        if trimmed is not None and self.by_seq:
            for seq in [seq for seq in self.by_seq if seq <= trimmed]:
                del self.by_seq[seq]
