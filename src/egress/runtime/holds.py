"""Why a partition job's sinks start no new delivery, and when a worker's leases lapse by its clock.

A delivery is worth starting only if its acknowledgement can be committed: an acknowledgement that
is never committed makes the next owner of the partition send the message again. Three causes
hold a job's sinks (``Sink.hold``), each for as long as it lasts; the sinks start deliveries again
(``Sink.resume``) once none is left:

* :data:`STOPPING`: the job is being stopped or handed over and waits for the deliveries in flight
  (for good: the job ends).
* :data:`COMMIT` (commit backpressure): a commit is in flight and a sink acknowledged messages
  beyond what it carries, so the job's acknowledgements are more than one epoch behind its last
  completed commit; released when the commit completes. A commit that does not complete (the
  engine's server frozen or cut off without closing the connection) thus lets the deliveries in
  flight finish and starts no new one.
* :data:`LEASE`: the worker's own monotonic clock says the job's lease lapsed without renewal
  (:class:`LeaseDeadlines`): another worker may run the partition now; released when a renewal
  succeeds (a lease taken again starts a new job with new sinks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from egress.connectors.base import Sink
from egress.engines import SinkProgress
from egress.runtime.unit import Unit

STOPPING = "stopping"
COMMIT = "commit"
LEASE = "lease"


class SinkHolds:
    """The causes that hold the sinks of one job now; :meth:`apply` gives a new sink the current state."""

    def __init__(self) -> None:
        self.causes: set[str] = set()
        self._sinks: list[Sink] = []

    @property
    def held(self) -> bool:
        return bool(self.causes)

    def apply(self, sinks: Iterable[Sink]) -> None:
        """Hold ``sinks`` (the job's, just created) when a cause holds them now; later changes reach them too."""
        self._sinks = list(sinks)
        if self.causes:
            for sink in self._sinks:
                sink.hold()

    def set(self, cause: str, holding: bool) -> None:
        """Add (``holding``) or remove ``cause``; the sinks are held when the first cause comes and
        resumed when the last one goes."""
        before = bool(self.causes)
        if holding:
            self.causes.add(cause)
        else:
            self.causes.discard(cause)
        if bool(self.causes) == before:
            return
        for sink in self._sinks:
            if self.causes:
                sink.hold()
            else:
                sink.resume()


def acknowledged_beyond(taken: Mapping[str, SinkProgress], carried: Mapping[str, SinkProgress]) -> bool:
    """Whether a sink's acknowledged prefix ``taken`` (by sink id) is past the one the commit in
    flight ``carried``: those acknowledgements wait for the commit after it."""
    return any(progress.max_persisted_seq_no > carried[sink_id].max_persisted_seq_no
               for sink_id, progress in taken.items() if sink_id in carried)


class LeaseDeadlines:
    """When each unit's lease lapses by this worker's monotonic clock: ``ttl`` seconds after the
    last take or renewal that succeeded, counted from when it was sent (the server counts the TTL
    from when it stored it, later: this clock never says a lease holds that the server dropped)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._until: dict[Unit, float] = {}

    def renewed(self, unit: Unit, sent_at: float) -> None:
        """A take or renewal of ``unit``'s lease sent at ``sent_at`` (``clock.monotonic()``) succeeded."""
        self._until[unit] = max(self._until.get(unit, -math.inf), sent_at + self.ttl)

    def forget(self, unit: Unit) -> None:
        self._until.pop(unit, None)

    def lapsed(self, units: Iterable[Unit], now: float) -> list[Unit]:
        """Those of ``units`` whose lease lapsed at ``now`` (a unit never taken counts as lapsed)."""
        return [unit for unit in units if self._until.get(unit, -math.inf) <= now]

    def next_lapse(self, units: Iterable[Unit], now: float) -> float:
        """Seconds from ``now`` until the first of ``units`` not yet lapsed lapses (``ttl`` when none:
        a lease taken from now on lapses later than that)."""
        ahead = [until - now for unit in units if (until := self._until.get(unit, -math.inf)) > now]
        return min(ahead, default=self.ttl)
