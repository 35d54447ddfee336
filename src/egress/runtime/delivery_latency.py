"""The delivery latency of a partition job's sinks: seconds from the commit of a message to its
acknowledgement (a 2xx, or its dead-letter line), into ``egress_sink_delivery_latency_seconds``.

Observed once per committed epoch and sink, not per message: an epoch's messages of one sink are
counted together, at the first :meth:`DeliveryLatency.acknowledged` that finds the last of them in
the sink's acknowledged prefix (the job takes acknowledgements at every epoch, so at most one
``epoch_period`` late, and the earlier messages of the epoch count the latency of its last one).
Messages handed to a sink again on a restart (committed by an earlier run) are not counted.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Mapping

from egress.engines import OutboxMessage, SinkProgress
from egress.observe.metrics import HistogramChild

_stream_of = operator.attrgetter("stream")


class DeliveryLatency:
    """``streams``: each sink's input stream by sink id; ``histograms``: each sink's child of the
    latency histogram by sink id. Times are ``clock.monotonic()`` seconds."""

    def __init__(self, streams: Mapping[str, str], histograms: Mapping[str, HistogramChild]) -> None:
        self._streams = dict(streams)
        self._histograms = dict(histograms)
        # Per sink: (last seq, messages, committed at) of each committed epoch not yet acknowledged.
        self._pending: dict[str, collections.deque[tuple[int, int, float]]] = {
            sink_id: collections.deque() for sink_id in streams}
        self._only = next(iter(streams)) if len(streams) == 1 else None  # one sink: every outbox message is its

    def committed(self, outbox: list[OutboxMessage], now: float) -> None:
        """The outbox of an epoch committed at ``now`` (in ``seq`` order)."""
        if not outbox:
            return
        if self._only is not None:
            self._pending[self._only].append((outbox[-1].seq, len(outbox), now))
            return
        counts = collections.Counter(map(_stream_of, outbox))  # counted in C, not a Python loop per message
        for sink_id, stream in self._streams.items():
            count = counts.get(stream)
            if count:
                last = next(m.seq for m in reversed(outbox) if m.stream == stream)  # near the end, as a rule
                self._pending[sink_id].append((last, count, now))

    def committed_run(self, last_seq: int, count: int, now: float) -> None:
        """``count`` messages up to ``last_seq`` committed at ``now`` for every sink (a byte-chunk
        epoch's outbox, ``egress.runtime.chunk_path``: all its sinks read the one output stream)."""
        for pending in self._pending.values():
            pending.append((last_seq, count, now))

    def acknowledged(self, progress: Mapping[str, SinkProgress], now: float) -> None:
        """Each sink's acknowledged prefix as of ``now``: observe the epochs it now covers."""
        for sink_id, sink_progress in progress.items():
            pending = self._pending[sink_id]
            while pending and pending[0][0] <= sink_progress.max_persisted_seq_no:
                _, count, committed_at = pending.popleft()
                self._histograms[sink_id].observe(now - committed_at, count)
