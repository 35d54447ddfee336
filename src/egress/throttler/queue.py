"""The waiting requests of one named throttler: token bucket + SFQ class scheduler + lag priority.

Pure and clock-driven: every method takes ``now`` (seconds, monotonic). Source: upstream Flow
distributed throttler bucket (``RequestQuota`` queue). A request is served in chunks of at most
``max_grant_amount`` units (and never more than the bucket's burst), resolves once after its last
chunk, and when cancelled gives back its tokens and its virtual-time charge. Inside a class requests
go by ascending ``(timestamp, enqueue order)``: the most lagging first, never by size.

Refunds and the envelope: a refund must not let the units of requests that were *not* cancelled
exceed ``∫limit dt + limit·period`` over any window. Each request keeps a lower bound of how many
more tokens the bucket would hold had it never asked (its *deficit*): a chunk adds its size; time
takes away at most ``limit`` units/s (a bucket without the request could only have lost refill while
full). A cancel gives back that bound: everything when cancelled right after its chunks, less when
the bucket would have filled up anyway (found by the property tests: a full refund lets the other
requests burst past the envelope).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from egress.throttler.bucket import EPSILON, TokenBucket
from egress.throttler.errors import QuotaAmountError
from egress.throttler.models import DEFAULT_CLASS, ThrottlerSpec
from egress.throttler.scheduler import ClassScheduler


@dataclass(eq=False)
class QuotaRequest:
    """One ``RequestQuota``: ``amount`` units for ``class_id`` (after defaulting), lag ``timestamp``.

    ``granted`` counts units of chunks taken so far; ``done`` once the whole amount is granted.
    """

    amount: float
    timestamp: float
    class_id: str
    requested_class_id: str | None
    seq: int
    enqueued_at: float
    remaining: float = 0.0
    granted: float = 0.0
    charge: float = 0.0
    deficit: float = 0.0
    deficit_at: float = 0.0
    done: bool = False
    cancelled: bool = False
    resolved_at: float | None = None


@dataclass(eq=False)
class _ClassQueue:
    weight: float
    retired: bool = False
    heap: list[tuple[float, int, QuotaRequest]] = field(default_factory=list)
    live: int = 0
    pending_amount: float = 0.0
    granted: float = 0.0
    refunded: float = 0.0


ChunkListener = Callable[[QuotaRequest, float, float], None]
"""Called as ``(request, chunk units, now)`` each time a chunk leaves the bucket."""


class QuotaQueue:
    """All waiting ``RequestQuota`` calls of one throttler and the decisions over them."""

    def __init__(self, spec: ThrottlerSpec, now: float, on_chunk: ChunkListener | None = None) -> None:
        self.spec = spec
        self.bucket = TokenBucket(spec.rate, spec.period, now)
        self._classes: dict[str, _ClassQueue] = {DEFAULT_CLASS: _ClassQueue(1.0)}
        self._scheduler = ClassScheduler({DEFAULT_CLASS: 1.0})
        self._seq = itertools.count()
        self._on_chunk = on_chunk
        self.classless_requests = 0
        self.unknown_class_requests = 0
        self.granted_total = 0.0
        self._apply_classes(spec)

    # -- configuration -------------------------------------------------------------------------

    def reconfigure(self, spec: ThrottlerSpec, now: float) -> None:
        """Apply a new spec live: rate and period, chunk size, classes and weights.

        A class that disappears while it has waiting requests is retired: it keeps its weight and
        drains, then vanishes; new requests naming it go to ``default``.
        """
        self.bucket.reconfigure(spec.rate, spec.period, now)
        self.spec = spec
        self._apply_classes(spec)

    def _apply_classes(self, spec: ThrottlerSpec) -> None:
        for class_id, queue in list(self._classes.items()):
            if class_id == DEFAULT_CLASS:
                continue
            declared = spec.classes.get(class_id)
            if declared is not None:
                queue.weight, queue.retired = declared.weight, False
            elif queue.live > 0:
                queue.retired = True
            else:
                del self._classes[class_id]
        for class_id, declared in spec.classes.items():
            self._classes.setdefault(class_id, _ClassQueue(declared.weight))
        self._scheduler.set_weights({c: q.weight for c, q in self._classes.items()})

    def class_ids(self) -> list[str]:
        """Ids of the classes that exist now (declared, retired-but-draining and ``default``)."""
        return sorted(self._classes)

    def is_retired(self, class_id: str) -> bool:
        queue = self._classes.get(class_id)
        return queue is not None and queue.retired

    # -- requests ------------------------------------------------------------------------------

    def resolve_class(self, class_id: str | None) -> str:
        """The class a request naming ``class_id`` is served in (``default`` for missing/unknown)."""
        queue = self._classes.get(class_id) if class_id else None
        if queue is None or queue.retired:
            return DEFAULT_CLASS
        return class_id or DEFAULT_CLASS

    def submit(self, amount: float, now: float, *, timestamp: float = 0.0, class_id: str | None = None) -> QuotaRequest:
        """Queue a request; raises :class:`QuotaAmountError` for a negative or non-finite amount.

        An amount of 0 is done at once. Call :meth:`poll` afterwards to make decisions.
        """
        if not amount >= 0 or math.isinf(amount):
            raise QuotaAmountError(f"Quota amount must be non-negative, got {amount:g}")
        effective = self.resolve_class(class_id)
        if self.spec.classes:
            if not class_id:
                self.classless_requests += 1
            elif effective != class_id:
                self.unknown_class_requests += 1
        request = QuotaRequest(amount=float(amount), timestamp=timestamp, class_id=effective,
                               requested_class_id=class_id, seq=next(self._seq), enqueued_at=now,
                               remaining=float(amount))
        if amount == 0:
            request.done, request.resolved_at = True, now
            return request
        queue = self._classes[effective]
        heapq.heappush(queue.heap, (timestamp, request.seq, request))
        queue.live += 1
        queue.pending_amount += amount
        self._scheduler.activate(effective)
        return request

    def cancel(self, request: QuotaRequest, now: float) -> None:
        """Withdraw a waiting request: its chunks' tokens and virtual charge are given back.

        No-op for a request that is done or already cancelled.
        """
        if request.done or request.cancelled:
            return
        request.cancelled = True
        queue = self._classes[request.class_id]
        if request.granted > 0:
            refund = self._decayed_deficit(request, now)
            self.bucket.refund(refund, now)
            self._scheduler.rollback(request.class_id, request.charge)
            queue.granted -= request.granted
            queue.refunded += min(refund, request.granted)
            self.granted_total -= request.granted
        queue.live -= 1
        queue.pending_amount -= request.remaining
        self._drop_cancelled_head(queue)
        if queue.live == 0:
            self._became_idle(request.class_id, queue)

    def _decayed_deficit(self, request: QuotaRequest, now: float) -> float:
        rate = self.bucket.rate
        if rate is None:
            return 0.0
        return max(0.0, request.deficit - rate * (now - request.deficit_at))

    def _drop_cancelled_head(self, queue: _ClassQueue) -> None:
        while queue.heap and queue.heap[0][2].cancelled:
            heapq.heappop(queue.heap)

    def _became_idle(self, class_id: str, queue: _ClassQueue) -> None:
        queue.heap.clear()
        queue.pending_amount = 0.0
        self._scheduler.deactivate(class_id)
        if queue.retired:
            del self._classes[class_id]
            self._scheduler.set_weights({c: q.weight for c, q in self._classes.items()})

    def _chunk_limit(self) -> float:
        limit = self.bucket.capacity
        if self.spec.max_grant_amount is not None:
            limit = min(limit, float(self.spec.max_grant_amount))
        return limit

    def poll(self, now: float) -> list[QuotaRequest]:
        """Grant every chunk the bucket allows at ``now``; returns the requests that became done, in order."""
        resolved: list[QuotaRequest] = []
        chunk_limit = self._chunk_limit()
        if chunk_limit <= 0:
            return resolved
        while True:
            class_id = self._scheduler.select()
            if class_id is None:
                return resolved
            queue = self._classes[class_id]
            request = queue.heap[0][2]
            chunk = min(request.remaining, chunk_limit)
            if not self.bucket.can_take(chunk, now):
                return resolved
            self.bucket.take(chunk, now)
            request.charge += self._scheduler.charge(class_id, chunk)
            request.deficit = self._decayed_deficit(request, now) + chunk
            request.deficit_at = now
            request.remaining -= chunk
            request.granted += chunk
            queue.granted += chunk
            queue.pending_amount -= chunk
            self.granted_total += chunk
            if self._on_chunk is not None:
                self._on_chunk(request, chunk, now)
            if request.remaining <= EPSILON * max(1.0, request.amount):
                request.remaining = 0.0
                request.done, request.resolved_at = True, now
                heapq.heappop(queue.heap)
                queue.live -= 1
                resolved.append(request)
                self._drop_cancelled_head(queue)
                if queue.live == 0:
                    self._became_idle(class_id, queue)

    def next_ready(self, now: float) -> float | None:
        """When the next chunk can be granted (``now`` or later), ``None`` when nothing can ever be."""
        class_id = self._scheduler.select()
        chunk_limit = self._chunk_limit()
        if class_id is None or chunk_limit <= 0:
            return None
        request = self._classes[class_id].heap[0][2]
        ready = self.bucket.ready_at(min(request.remaining, chunk_limit), now)
        return None if math.isinf(ready) else ready

    # -- sensors -------------------------------------------------------------------------------

    def pending(self) -> dict[str, tuple[int, float, float | None]]:
        """Per class: (waiting requests, waiting units, oldest enqueue time or ``None``). O(waiting)."""
        result: dict[str, tuple[int, float, float | None]] = {}
        for class_id, queue in self._classes.items():
            live = [entry[2] for entry in queue.heap if not entry[2].cancelled]
            oldest = min((r.enqueued_at for r in live), default=None)
            result[class_id] = (queue.live, max(0.0, queue.pending_amount), oldest)
        return result

    def class_counters(self) -> dict[str, tuple[float, float, float]]:
        """Per class: (granted units, refunded units, weight)."""
        return {c: (q.granted, q.refunded, q.weight) for c, q in self._classes.items()}

    @property
    def queue_size(self) -> int:
        """Waiting requests over all classes."""
        return sum(q.live for q in self._classes.values())
