"""The parts of a partition job's epoch, timed on the run's clock: counted always, traced when sampled.

An epoch is read, ``Input.Throttle`` (the automatic input throttle's wait for quota; absent without
one), process (the process function or map over the batch and the due timers), commit (the fenced
``EpochCommit``) and deliver (handing the committed outbox to the sinks, which start their requests,
and taking their acknowledgements for the next commit). Each part's seconds go to
``egress_epoch_part_seconds_total{computation_id, part}`` (a few counter increments per epoch, not per
message), which the dashboard's "Epoch parts" chart reads; with tracing on
(``egress.observe.tracing``) a sampled epoch becomes a span ``epoch`` with one child span per part,
made after the epoch from the times marked, so an unsampled epoch makes no span object.
"""

from __future__ import annotations

from typing import Any

from egress.clock import Clock
from egress.observe import tracing as _tracing

READ, THROTTLE, PROCESS, COMMIT, DELIVER = "read", "Input.Throttle", "process", "commit", "deliver"
PARTS = (READ, THROTTLE, PROCESS, COMMIT, DELIVER)
"""The parts in the order an epoch runs them (the ``part`` label's values)."""


class EpochParts:
    """The marks of one partition job's current epoch: :meth:`begin`, then :meth:`mark` at the end of
    each part (or :meth:`waited` for a part whose length is known, the throttler's wait), and
    :meth:`end`. ``counter`` is the ``egress_epoch_part_seconds`` family (labels ``computation_id``,
    ``part``). Times are ``clock.monotonic()`` seconds."""

    __slots__ = ("_clock", "_computation_id", "_counters", "_last", "_marks", "_partition", "_started")

    def __init__(self, clock: Clock, counter: Any, computation_id: str, partition: int) -> None:
        self._clock = clock
        self._computation_id = computation_id
        self._partition = partition
        self._counters = {part: counter.labels(computation_id, part) for part in PARTS}
        self._marks: list[tuple[str, float, float]] = []
        self._started = self._last = clock.monotonic()

    def begin(self) -> None:
        """An epoch starts now."""
        self._marks.clear()
        self._started = self._last = self._clock.monotonic()

    def mark(self, part: str) -> None:
        """``part`` ran from the previous mark until now."""
        now = self._clock.monotonic()
        self._marks.append((part, self._last, now))
        self._last = now

    def waited(self, part: str, seconds: float) -> None:
        """``part`` started at the previous mark and lasted ``seconds`` (what the throttler reports it
        made the batch wait); the next part starts now."""
        start = self._last
        self._marks.append((part, start, start + seconds))
        self._last = self._clock.monotonic()

    def skip(self) -> None:
        """What ran since the previous mark belongs to no part (a wait that was not the job's work)."""
        self._last = self._clock.monotonic()

    def end(self, *, messages: int, timers: int, outputs: int) -> None:
        """The epoch ended: count its parts and, with tracing on and the epoch sampled, send its spans
        (``messages`` read, ``timers`` fired, ``outputs`` emitted: the epoch span's attributes)."""
        counters = self._counters
        for part, start, stop in self._marks:
            counters[part].inc(stop - start)
        tracing = _tracing.active
        if tracing is not None and tracing.sampling.root():
            self._trace(tracing, messages, timers, outputs)

    def _trace(self, tracing: _tracing.Tracing, messages: int, timers: int, outputs: int) -> None:
        clock = self._clock
        now = clock.monotonic()
        wall = clock.now() - now  # span times are wall-clock seconds (the clock's now())
        attributes = {"egress.computation_id": self._computation_id, "egress.partition": self._partition,
                      "egress.input_messages": messages, "egress.timers_fired": timers,
                      "egress.output_messages": outputs}
        epoch = tracing.start("epoch", self._started + wall, attributes=attributes)
        for part, start, stop in self._marks:
            tracing.span(part, start + wall, stop + wall, parent=epoch,
                         attributes={"egress.computation_id": self._computation_id,
                                     "egress.partition": self._partition})
        _tracing.end(epoch, max(now, self._last) + wall,
                     attributes={f"egress.part.{part}.seconds": seconds
                                 for part, seconds in _tracing.parts_attributes(self._marks).items()})


__all__ = ["COMMIT", "DELIVER", "PARTS", "PROCESS", "READ", "THROTTLE", "EpochParts"]
