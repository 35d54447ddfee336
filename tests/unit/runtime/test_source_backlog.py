"""A source's backlog downstream (the http source's ``429``): per computation reading the stream,
its unread log messages plus its sinks' unacknowledged ones; the largest computation counts."""

from __future__ import annotations

from egress.runtime.source_reader import DownstreamProgress, downstream_backlog


def test_the_backlog_counts_unread_log_messages_and_unacknowledged_sink_messages_per_computation() -> None:
    ends = {0: 10, 1: 4}
    progress = [DownstreamProgress("deliver", 0, 7, 5), DownstreamProgress("deliver", 1, 4, 1),
                DownstreamProgress("audit", 0, 10, 0), DownstreamProgress("audit", 1, 0, 0)]
    # deliver: (10 - 7) + 5 + (4 - 4) + 1 = 9; audit: 0 + 4 = 4; the larger holds the source back.
    assert downstream_backlog(ends, progress) == 9


def test_no_job_reading_the_stream_here_is_no_backlog() -> None:
    assert downstream_backlog({0: 100}, []) == 0
