"""How many records a source has not read yet: the ``unread_records`` hook of a source
(``egress_source_unread_records``, ``/status`` → ``sources[id].unread_records``).

A source that can tell implements :class:`CountsUnread`; for any other one the figure is unknown
(``None``). Each source says whether its figure is exact or an estimate (``docs/observability.md``):

- ``csv``/``jsonl`` (plain or ``.gz``): an estimate, the bytes of the file after those read so far
  times the records per byte read so far (for ``.gz``, compressed bytes); unknown before the first
  record, 0 at the end of the file;
- the same with ``follow: true``: the same estimate summed over the files followed (a file without
  a record yet counts at the average of the others, unknown when none has one);
- ``nats``: exact, the consumer's pending messages (the ``num_pending`` of the last message fetched,
  0 after a fetch that found none); unknown before the first fetch;
- ``http``: exact, the events received and not yet committed (answered ``200`` once they are).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CountsUnread(Protocol):
    """A source that knows how many of its records it has not read yet."""

    def unread_records(self) -> int | None:
        """Records not yet read (``None``: unknown now). Called on the event loop while the source
        may be reading on a worker thread: cheap, and never raising for a file closed meanwhile."""
        ...


def unread_records(source: object) -> int | None:
    """``source``'s unread records, ``None`` (unknown) for a source without :class:`CountsUnread`."""
    if isinstance(source, CountsUnread):
        return source.unread_records()
    return None


def estimate(remaining_bytes: int, records: int, read_bytes: int) -> int | None:
    """Records in ``remaining_bytes`` at ``records`` per ``read_bytes`` (``None``: no record read yet);
    0 when nothing remains."""
    if remaining_bytes <= 0:
        return 0
    if records <= 0 or read_bytes <= 0:
        return None
    return max(1, round(remaining_bytes * records / read_bytes))
