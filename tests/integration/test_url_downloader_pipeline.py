"""The URL downloader's real variant in one process: real Debian docs served by three local HTTP
servers (127.0.0.2-4), downloaded politely per host, each URL emitted exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from examples.url_downloader import serve

from egress.cli.state import state_lines
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.url_downloader_support import expected_files, free_port, server_log, write_pipeline

pytestmark = pytest.mark.integration


async def test_every_file_is_downloaded_once_and_never_two_at_a_time_per_host(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "requests.jsonl"
    with log_path.open("a") as log:
        stop = await serve.start(port, log, delay=0.02)
        try:
            spec, dynamic = write_pipeline(tmp_path, port)
            pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=RunOptions(until_drained=True))
            result = await pipeline.run()
        finally:
            await stop()
    assert result.ok, result
    assert result.drained
    expected = expected_files(port)
    assert len(expected) == 49
    recorded = {line["key"][0]: line["row"] for line in state_lines(tmp_path / "state", name="processed_urls")}
    assert set(recorded) == set(expected)
    for url, row in recorded.items():
        assert (row["status"], row["bytes"], row["sha256"], row["emitted"]) == (200, *expected[url], 1), url
    requests = server_log(log_path)
    assert Counter(str(r["path"]) for r in requests).most_common(1)[0][1] == 1  # each file fetched once
    assert {r["in_flight"] for r in requests} == {1}  # never two requests at once to one host
    assert list(state_lines(tmp_path / "state", name="host_state")) == []  # every host cleared its state
