"""``egress run``'s messages while it runs: the first dead letter of each sink and file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from egress.cli.main import _Reporter
from egress.connectors.dead_letters import DeadLetter, DeadLetterFiles
from egress.observe import StatusTree
from egress.runtime import Pipeline


def test_egress_run_prints_the_first_dead_letter_of_each_sink_and_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sinks' first letters are printed, though the latest letter at the progress tick is another."""
    files = DeadLetterFiles()

    async def write() -> None:
        output = files.open(tmp_path / "dead.jsonl")
        await output.append([_letter("http", 1), _letter("audit", 2), _letter("http", 3)])

    asyncio.run(write())
    pipeline = SimpleNamespace(dead_letters=files, server=None, dynamic_spec_version=0, dynamic_spec_error=None,
                               status=StatusTree())
    reporter = _Reporter(cast(Pipeline, pipeline))
    reporter.news()
    reporter.news()
    printed = [line for line in capsys.readouterr().err.splitlines() if line]
    assert [line.split(" written to ")[0] for line in printed] == [
        "dead letter of deliver/http partition 0 seq 1", "dead letter of deliver/audit partition 0 seq 2"]


def _letter(sink: str, seq: int) -> DeadLetter:
    return DeadLetter("deliver", sink, 0, seq, b"m%d" % seq, "6D", b"x", (), "exhausted", 2.0)
