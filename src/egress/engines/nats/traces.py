"""Trace contexts on NATS (``TraceContexts``): one message per commit and log partition,
``tracelog.<stream>.<partition>.<first offset>`` (offset → context), and one per commit's outbox,
``traceoutbox.<consumer>.<partition>.<first seq>`` (seq → context), MessagePack maps published in
the commit's atomic batch after its log and outbox chunks (so a purge of the chunks before a
sequence takes the contexts of those chunks alone). A commit carrying no context publishes none."""

from __future__ import annotations

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.jetstream import Outgoing, is_deleted
from egress.engines.protocols import EpochCommit

LOG_TRACES_RECHECK = 1.0
"""Seconds between looks for a first log context while none was seen (monotonic: a cost bound)."""


class NatsTraces(NatsConnection):
    """:meth:`read_log_traces`, :meth:`read_outbox_traces`, and the commit's messages (:meth:`_trace_messages`)."""

    def _trace_messages(self, commit: EpochCommit, ends: dict[tuple[str, int], tuple[int, int]]) -> list[Outgoing]:
        """The trace messages of ``commit`` whose log appends start at the offsets of ``ends``."""
        layout, messages = self._layout, []
        if commit.log_traces:
            by_slot: dict[tuple[str, int], dict[int, str]] = {}
            next_offset = {slot: end for slot, (end, _) in ends.items()}
            for index, (stream, partition, *_) in enumerate(commit.log_appends):
                slot = (stream, partition)
                offset = next_offset[slot]
                next_offset[slot] = offset + 1
                context = commit.log_traces.get(index)
                if context is not None:
                    by_slot.setdefault(slot, {})[offset] = context
            messages += [Outgoing(layout.log_trace(*slot, ends[slot][0]), records.pack(list(contexts.items())))
                         for slot, contexts in by_slot.items()]
            self.traced_log = True
        if commit.outbox_traces and commit.outbox:
            messages.append(Outgoing(layout.outbox_trace(commit.consumer, commit.partition, commit.outbox[0].seq),
                                     records.pack(list(commit.outbox_traces.items()))))
            self.traced_outbox = True
        return messages

    async def read_log_traces(self, stream: str, partition: int, first: int, end: int) -> dict[int, str]:
        if not self.traced_log:  # none seen yet: one look per LOG_TRACES_RECHECK seconds, not a request per read
            now = self._clock.monotonic()
            if now < self._log_checked + LOG_TRACES_RECHECK:
                return {}
            self._log_checked = now
        found: dict[int, str] = {}
        for stored in await self._js().scan(self._layout.log_traces(stream, partition)):
            if not is_deleted(stored):
                self.traced_log = True
                found.update((int(offset), str(context)) for offset, context in records.unpack(stored.data)
                             if first <= int(offset) < end)
        return found

    async def read_outbox_traces(self, consumer: str, partition: int, after_seq: int) -> dict[int, str]:
        found: dict[int, str] = {}
        for stored in await self._js().scan(self._layout.outbox_traces(consumer, partition)):
            if not is_deleted(stored):
                self.traced_outbox = True
                found.update((int(seq), str(context)) for seq, context in records.unpack(stored.data)
                             if int(seq) > after_seq)
        return found

    # Whether this engine wrote or read a log or outbox context: only then do its log and outbox trims
    # purge contexts too (a request more each). Another process's stale contexts are never read
    # (they belong to trimmed offsets and seqs) and go at a trim of a process that traces.
    traced_log = False
    traced_outbox = False
    _log_checked = float("-inf")
