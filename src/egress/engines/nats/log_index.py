"""What a NATS engine knows of the log chunks of a ``(stream, partition)``: their positions, and the
entries of the last few read or written (or, for a chunk an appends note carried, its payload)."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from egress.engines.nats.records import LogEntry

_CACHED_CHUNKS = 4  # log chunks kept decoded (or as carried by a note) per (stream, partition)
_INDEXED_CHUNKS = 4096  # log chunk positions remembered per (stream, partition)



@dataclass(slots=True)
class Chunk:
    first: int
    count: int
    seq: int
    entries: list[LogEntry] | None = None
    payload: bytes | None = None  # the chunk as stored, from an appends note: decoded when first read

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass(slots=True)
class LogIndex:
    """The log chunks of one ``(stream, partition)`` this process has seen, by first offset; the
    entries of the last few read or written stay decoded, and so does the payload of the last few
    an appends note carried (counted with them: a note's chunks are kept until read or pushed out
    by newer ones, whether or not a job here reads their partition)."""

    firsts: list[int] = field(default_factory=list)
    chunks: dict[int, Chunk] = field(default_factory=dict)
    decoded: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def add(self, chunk: Chunk) -> Chunk:
        known = self.chunks.get(chunk.first)
        if known is None:
            bisect.insort(self.firsts, chunk.first)
            self.chunks[chunk.first] = known = chunk
            if len(self.firsts) > _INDEXED_CHUNKS:  # forget the lowest (the highest if that is the new one)
                victim = self.firsts.pop(0 if self.firsts[0] != chunk.first else -1)
                self.chunks.pop(victim)
                self.decoded.pop(victim, None)
        if chunk.entries is not None or (chunk.payload is not None and known.entries is None):
            if chunk.entries is not None:
                known.entries, known.payload = chunk.entries, None
            else:
                known.payload = chunk.payload
            self.decoded[chunk.first] = None
            self.decoded.move_to_end(chunk.first)
            while len(self.decoded) > _CACHED_CHUNKS:
                dropped = self.chunks.get(self.decoded.popitem(last=False)[0])
                if dropped is not None:
                    dropped.entries = dropped.payload = None
        return known

    def floor(self, offset: int) -> Chunk | None:
        """The known chunk with the largest first offset <= ``offset``."""
        index = bisect.bisect_right(self.firsts, offset)
        return self.chunks[self.firsts[index - 1]] if index else None
