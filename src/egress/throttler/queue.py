"""The waiting requests of one named throttler: token bucket + SFQ class scheduler + lag priority.

Pure and clock-driven: every method takes ``now`` (seconds, monotonic). Source: upstream Flow
distributed throttler bucket (``RequestQuota`` queue). A request is served in chunks of at most
``max_grant_amount`` units (and never more than the bucket's burst), resolves once after its last
chunk, and when cancelled gives back its tokens and its virtual-time charge. Inside a class requests
go by ascending ``(timestamp, enqueue order)``: the most lagging first, never by size.

Two stages (beyond upstream). The *grant* stage above (``bucket``) decides the order: which class
and request get the next chunk. A request whose last chunk is granted then waits for the *release*
stage (``release_bucket``), a second token bucket that is charged when the request resolves, with
the whole amount at once, leased for as long as the caller may keep the units (``lease``). Chunks
granted over a long time would otherwise be handed out in one instant; the release bucket is what
keeps the envelope ``∫limit dt + limit·period`` at the point of use. The grant stage waits while a
granted request waits for its release, so it never decides far ahead of what is released.

Refunds and the envelope: a refund must not let the units of requests that were *not* cancelled
exceed ``∫limit dt + limit·period`` over any window. Each request holding chunks keeps a lower bound
of how many more tokens the bucket would hold had it never asked (its *deficit*): a chunk adds its
size, and the bucket without the request can hold no more than its capacity, so before every take
(the moment the bucket's tokens peak) and at the cancel the deficit is cut to ``capacity − tokens``.
A cancel gives back that bound: everything the request holds while the bucket never filled up
meanwhile (the usual case under contention), less when the bucket would have filled up anyway
(a full refund then lets the other requests burst past the envelope).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from egress.throttler.bucket import EPSILON, TokenBucket
from egress.throttler.errors import QuotaAmountError
from egress.throttler.models import DEFAULT_CLASS, ThrottlerSpec
from egress.throttler.scheduler import ClassScheduler


@dataclass(eq=False)
class QuotaRequest:
    """One ``RequestQuota``: ``amount`` units for ``class_id`` (after defaulting), lag ``timestamp``.

    ``granted`` counts units of chunks taken so far; ``done`` once released (resolved) after the
    whole amount was granted; ``released`` the units released then: the whole amount, or the burst
    when the burst shrank below the amount since it was asked (the caller asks again for the rest).
    ``whole``: the amount alone was beyond the burst when asked (one call that cannot be split).
    ``lease`` is how long (seconds) after its release the caller may still use the units;
    ``lease_end`` the time that ends (set at release).
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
    lease: float = 0.0
    lease_end: float = 0.0
    released: float = 0.0
    whole: bool = False
    done: bool = False
    cancelled: bool = False
    resolved_at: float | None = None

    @property
    def releasing(self) -> bool:
        """Every chunk is granted and the request waits for the release bucket."""
        return self.remaining == 0.0 and not self.done and not self.cancelled


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

    def __init__(self, spec: ThrottlerSpec, now: float, on_chunk: ChunkListener | None = None, *,
                 empty_since: float | None = None) -> None:
        self.spec = spec
        # A restarted queue starts both stages empty: a full grant bucket in front of an empty release
        # bucket would grant a burst ahead of what is released, and no more lagging request that
        # arrives meanwhile could overtake what it granted.
        self.bucket = TokenBucket(spec.rate, spec.period, now, empty_since=empty_since)
        self.release_bucket = TokenBucket(spec.rate, spec.period, now, empty_since=empty_since)
        self._releasing: deque[QuotaRequest] = deque()
        self._holding: set[QuotaRequest] = set()  # granted chunks, neither released nor cancelled
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
        self._bound_deficits(now)
        self.bucket.reconfigure(spec.rate, spec.period, now)
        self._bound_deficits(now)
        self.release_bucket.reconfigure(spec.rate, spec.period, now)
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

    def submit(self, amount: float, now: float, *, timestamp: float = 0.0, class_id: str | None = None,
               lease: float = 0.0) -> QuotaRequest:
        """Queue a request; raises :class:`QuotaAmountError` for a negative or non-finite amount.

        ``lease``: seconds after its release during which the caller may still use the units (0: at
        once). An amount of 0 is done at once. Call :meth:`poll` afterwards to make decisions.
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
                               remaining=float(amount), lease=max(0.0, lease),
                               whole=amount > self.bucket.capacity)
        if amount == 0:
            request.done, request.resolved_at, request.lease_end = True, now, now
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
        releasing = request.releasing
        request.cancelled = True
        if request.granted > 0:
            self._give_back(request, now)
        if releasing:  # its class already counts it as served
            self._releasing.remove(request)
            return
        queue = self._classes[request.class_id]
        queue.live -= 1
        queue.pending_amount -= request.remaining
        self._drop_cancelled_head(queue)
        if queue.live == 0:
            self._became_idle(request.class_id, queue)

    def _give_back(self, request: QuotaRequest, now: float) -> None:
        self._bound_deficits(now)
        self._holding.discard(request)
        refund = request.deficit
        self.bucket.refund(refund, now)
        self._scheduler.rollback(request.class_id, request.charge)
        queue = self._classes.get(request.class_id)  # a retired class may be gone by now
        if queue is not None:
            queue.granted -= request.granted
            queue.refunded += min(refund, request.granted)
        self.granted_total -= request.granted

    def _bound_deficits(self, now: float) -> None:
        """Cut every holding request's deficit to the room the bucket has now: without the request
        it would hold at most its capacity. Called where the tokens peak (before a take, a
        reconfigure) and before a refund; between those the tokens only grow, so the bound holds
        at every instant. O(requests holding chunks)."""
        if not self._holding:
            return
        room = 0.0 if self.bucket.unlimited else max(0.0, self.bucket.capacity - self.bucket.tokens(now))
        for request in self._holding:
            request.deficit = min(request.deficit, room)

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
        """Grant every chunk and release every request the buckets allow at ``now``; returns the
        requests released (done), in order."""
        resolved: list[QuotaRequest] = []
        chunk_limit = self._chunk_limit()
        while True:
            self._release(now, resolved)
            if self._releasing or chunk_limit <= 0:
                return resolved
            class_id = self._scheduler.select()
            if class_id is None:
                return resolved
            queue = self._classes[class_id]
            request = queue.heap[0][2]
            chunk = min(request.remaining, chunk_limit)
            if not self.bucket.can_take(chunk, now):
                return resolved
            self._bound_deficits(now)
            self.bucket.take(chunk, now)
            request.charge += self._scheduler.charge(class_id, chunk)
            request.deficit += chunk
            self._holding.add(request)
            request.remaining -= chunk
            request.granted += chunk
            queue.granted += chunk
            queue.pending_amount -= chunk
            self.granted_total += chunk
            if self._on_chunk is not None:
                self._on_chunk(request, chunk, now)
            if request.remaining <= EPSILON * max(1.0, request.amount):
                request.remaining = 0.0
                heapq.heappop(queue.heap)
                queue.live -= 1
                self._releasing.append(request)
                self._drop_cancelled_head(queue)
                if queue.live == 0:
                    self._became_idle(class_id, queue)

    def _release_size(self, request: QuotaRequest) -> float:
        """Units ``request`` gets at its release: its amount, or the burst when that shrank below an
        amount that fitted it when asked. A ``whole`` request (one call beyond the burst) gets all of
        it once the bucket is full, leaving the bucket below zero. ``inf`` while the limit is 0."""
        capacity = self.release_bucket.capacity
        if capacity <= 0:
            return math.inf
        return request.amount if request.whole else min(request.amount, capacity)

    def _release(self, now: float, resolved: list[QuotaRequest]) -> None:
        """Release granted requests in grant order while the release bucket has their amount."""
        while self._releasing:
            request = self._releasing[0]
            size = self._release_size(request)
            if math.isinf(size) or not self.release_bucket.can_take(min(size, self.release_bucket.capacity), now):
                return
            self._releasing.popleft()
            self._holding.discard(request)
            request.lease_end = now + request.lease
            request.released = size
            self.release_bucket.lease(size, now, request.lease_end)
            request.done, request.resolved_at = True, now
            resolved.append(request)

    def next_ready(self, now: float) -> float | None:
        """When the next chunk can be granted or request released (``now`` or later), ``None`` when
        nothing can ever be."""
        if self._releasing:
            size = self._release_size(self._releasing[0])
            if math.isinf(size):
                return None
            ready = self.release_bucket.ready_at(min(size, self.release_bucket.capacity), now)
            return None if math.isinf(ready) else ready
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
        """Waiting requests over all classes, those granted but not yet released included."""
        return sum(q.live for q in self._classes.values()) + len(self._releasing)
