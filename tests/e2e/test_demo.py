"""`make demo` as a user runs it: every non-cancelled January flight arrives, with and without faults."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def report_value(output: str, name: str) -> int:
    found = re.search(rf"^\s+{re.escape(name)}\s+([\d,]+)\s*$", output, re.MULTILINE)
    assert found, f"no {name!r} line in:\n{output}"
    return int(found.group(1).replace(",", ""))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail_rate", [0.0, 0.2])
def test_demo_delivers_every_non_cancelled_flight(tmp_path: Path, fail_rate: float) -> None:
    run = subprocess.run(
        [sys.executable, "examples/http_delivery/demo.py", "--fail-rate", str(fail_rate), "--keep", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )
    output = run.stdout
    assert run.returncode == 0, output + run.stderr
    assert report_value(output, "rows read") == 27_004
    assert report_value(output, "distinct idempotency keys received") == 26_483
    assert report_value(output, "expected (non-cancelled flights)") == 26_483
    assert report_value(output, "missing") == 0
    assert "OK: every message arrived" in output
    retries = report_value(output, "retries")
    if fail_rate:
        assert retries > 0
        assert report_value(output, "requests received") == 26_483 + retries
    else:
        assert retries == 0
    assert (tmp_path / "received.jsonl").exists()
