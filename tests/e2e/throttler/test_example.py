"""``examples/throttled_api``: three classes 5:3:1 share one limit; the chart is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from examples.throttled_api.run import run

pytestmark = pytest.mark.e2e


async def test_throttled_api_shares_follow_the_weights(tmp_path: Path) -> None:
    chart = tmp_path / "chart.png"
    shares = await run(5.0, chart, None)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Real time, 4 measured seconds, prefetch granularity: loose, but far from equal shares (1/3 each).
    assert shares["vip"] == pytest.approx(5 / 9, abs=0.08)
    assert shares["regular"] == pytest.approx(3 / 9, abs=0.08)
    assert shares["bulk"] == pytest.approx(1 / 9, abs=0.05)
