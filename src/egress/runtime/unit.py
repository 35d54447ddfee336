"""A unit of work: what one lease covers and one task runs.

A unit is a computation's partition (run by a partition job) or a source's reader partition (run
by a source reader: partitions ``0 .. n-1`` of a source read by ``n`` readers, 0 alone for most).
The engine knows a unit by its consumer key and partition, the pair it leases and commits under:
the computation id, or ``source:<id>`` (:data:`egress.engines.SOURCE_PREFIX`).
:attr:`Unit.consumer` is the one place the runtime makes that key; the keys are the ones state
directories and buckets already hold.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from egress.engines import SOURCE_PREFIX

UnitKind = Literal["computation", "source"]


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Unit:
    """``kind`` ``"computation"`` (``name`` the computation id, ``partition`` its partition) or
    ``"source"`` (``name`` the source id, ``partition`` its reader's, 0 for a source with one
    reader). Units sort by ``(consumer, partition)``, the engine's order of its leases."""

    kind: UnitKind
    name: str
    partition: int = 0

    @classmethod
    def computation(cls, computation_id: str, partition: int) -> Unit:
        return cls("computation", computation_id, partition)

    @classmethod
    def source(cls, source_id: str, partition: int = 0) -> Unit:
        return cls("source", source_id, partition)

    @property
    def consumer(self) -> str:
        """The engine's consumer key: the computation id, or ``source:<id>``."""
        return SOURCE_PREFIX + self.name if self.kind == "source" else self.name

    @property
    def is_source(self) -> bool:
        return self.kind == "source"

    @property
    def key(self) -> tuple[str, int]:
        """``(consumer, partition)``: how the engine's leases and commits name this unit."""
        return (self.consumer, self.partition)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Unit):
            return NotImplemented
        return self.key < other.key

    def __str__(self) -> str:
        return f"{self.consumer}#{self.partition}"
