"""Lanes: the log streams a source's readers write, one per reader, so no reader races another.

A stream written by a source with ``readers: N`` is stored in the log as ``N`` lanes, each a log
stream of its own with its own partitions ``0 .. partition_count-1`` and dense offsets: reader
``k`` appends only to lane :func:`lane` ``(stream, k)``, of which it is the only writer (its lease
fences any other), and every computation reading the stream reads all of its lanes, each an input
slot ``(lane, partition)`` with its own committed position. A key's events come through one reader
(a file is one reader's, an http key has a home reader, a nats subject one reader), so a key's order
is its lane's. Reader 0's lane is the stream id itself: a stream with one writer (any computation's
output, a one-reader source) is its own single lane, and what an older run wrote to the stream is
lane 0's. The engines know nothing of lanes: to them a lane is a log stream like any other.
"""

from __future__ import annotations


def lane(stream_id: str, reader: int) -> str:
    """The log stream reader ``reader`` (0-based) of a source writing ``stream_id`` appends to:
    ``stream_id`` for reader 0, ``f"{stream_id}#{reader}"`` after it."""
    return stream_id if reader == 0 else f"{stream_id}#{reader}"


def lanes(stream_id: str, writers: int) -> list[str]:
    """The lanes of ``stream_id`` written by ``writers`` readers (at least one lane), reader 0's first."""
    return [lane(stream_id, reader) for reader in range(max(1, writers))]
