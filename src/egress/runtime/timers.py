"""Timers of a partition job: per key, in processing time or event time.

A timer is ``(encoded key, trigger timestamp, domain)``; a key may have several, each at most once
per ``(trigger, domain)``. A processing-time timer is due when the clock's ``now()`` reaches its
trigger; an event-time timer when the job's watermark (the largest event timestamp of the input it
has processed) does. Due timers fire in trigger order (ties by key), so each key sees its timers in
trigger order. A fired timer is deleted, and the deletion is committed in the same epoch as the
outputs, state changes and new timers its ``process_timer`` caused.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable
from typing import Literal

TimerDomain = Literal["processing", "event"]
DOMAINS: tuple[TimerDomain, ...] = ("processing", "event")


class TimerQueue:
    """The pending timers of one partition job and the changes not yet committed."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[float, bytes]]] = {d: [] for d in DOMAINS}
        self._pending: set[tuple[bytes, float, str]] = set()
        self.timers_set: list[tuple[bytes, float, str]] = []
        self.timers_deleted: list[tuple[bytes, float, str]] = []

    def load(self, timers: Iterable[tuple[bytes, float, str]]) -> None:
        for key, trigger, domain in timers:
            if (key, trigger, domain) not in self._pending:
                self._pending.add((key, trigger, domain))
                heapq.heappush(self._heaps[domain], (trigger, key))

    def add(self, key: bytes, trigger: float, domain: str) -> None:
        """Set a timer (setting an existing one again changes nothing)."""
        entry = (key, trigger, domain)
        if entry in self._pending:
            return
        self._pending.add(entry)
        heapq.heappush(self._heaps[domain], (trigger, key))
        self.timers_set.append(entry)

    def discard(self, key: bytes, trigger: float, domain: str) -> None:
        """Remove one pending timer if present (recording its deletion)."""
        entry = (key, trigger, domain)
        if entry in self._pending:
            self._pending.discard(entry)
            heap = self._heaps[domain]
            heap.remove((trigger, key))
            heapq.heapify(heap)
            self.timers_deleted.append(entry)

    def pop_due(self, now: float, watermark: float | None, limit: int) -> list[tuple[bytes, float, str]]:
        """Remove and return up to ``limit`` due timers in trigger order, recording their deletion."""
        due: list[tuple[bytes, float, str]] = []
        processing, event = self._heaps["processing"], self._heaps["event"]
        while len(due) < limit:
            p = processing[0] if processing and processing[0][0] <= now else None
            e = event[0] if event and watermark is not None and event[0][0] <= watermark else None
            if p is None and e is None:
                break
            if e is None or (p is not None and p <= e):
                trigger, key = heapq.heappop(processing)
                domain = "processing"
            else:
                trigger, key = heapq.heappop(event)
                domain = "event"
            entry = (key, trigger, domain)
            self._pending.discard(entry)
            self.timers_deleted.append(entry)
            due.append(entry)
        return due

    def restore(self, due: list[tuple[bytes, float, str]]) -> None:
        """Put back timers :meth:`pop_due` returned that did not fire (the epoch stopped first): pending
        again, their deletion no longer recorded, so they fire in a later epoch or run."""
        returned = set(due)
        self.timers_deleted = [entry for entry in self.timers_deleted if entry not in returned]
        for key, trigger, domain in returned - self._pending:
            self._pending.add((key, trigger, domain))
            heapq.heappush(self._heaps[domain], (trigger, key))

    def has_due(self, now: float, watermark: float | None) -> bool:
        processing, event = self._heaps["processing"], self._heaps["event"]
        return bool((processing and processing[0][0] <= now)
                    or (event and watermark is not None and event[0][0] <= watermark))

    def next_processing_trigger(self) -> float | None:
        """The earliest processing-time trigger pending, or ``None``."""
        heap = self._heaps["processing"]
        return heap[0][0] if heap else None

    def pending(self, key: bytes | None = None) -> list[tuple[bytes, float, str]]:
        """Pending timers (of ``key`` when given), sorted by trigger then key."""
        return sorted((e for e in self._pending if key is None or e[0] == key), key=lambda e: (e[1], e[0]))

    def __len__(self) -> int:
        return len(self._pending)

    def take_changes(self) -> tuple[list[tuple[bytes, float, str]], list[tuple[bytes, float, str]]]:
        changes = self.timers_set, self.timers_deleted
        self.timers_set, self.timers_deleted = [], []
        return changes


def timer_message_id(computation_id: str, key: bytes, trigger: float, domain: str) -> bytes:
    """The 16-byte parent id of the messages a fired timer emits: ``blake2b(computation ‖ domain ‖
    key ‖ trigger)``, deterministic so a replayed firing reproduces its output ids."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{computation_id}\0{domain}\0{trigger!r}\0".encode())
    digest.update(key)
    return digest.digest()
