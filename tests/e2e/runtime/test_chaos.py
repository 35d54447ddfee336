"""The chaos harness in CI: ``benchmarks/chaos.py`` with 10 seeded faults on a small round, as a real
process, embedded (2,000 flights, 2,000 retryable events) and on a NATS cluster of 2 workers (1,000
flights, 1,000 events): small rounds, since every kill sends its committed outbox again. Its audit
must pass: every flight delivered under its key, every duplicate explained by the causal condition
of the fault that made it, the retryable example's totals exact and every SQLite file
``integrity_check`` ok. ``EGRESS_CHAOS_SEED`` picks another schedule; the harness prints its
summary (``pytest -s``) and keeps its work directory when the audit fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SEED = int(os.environ.get("EGRESS_CHAOS_SEED", "20261201"))
FAULTS = 10

pytestmark = pytest.mark.e2e


def run_harness(directory: Path, *arguments: str) -> str:
    """Run the harness with :data:`FAULTS` faults of :data:`SEED` and ``arguments``; its summary
    line, checked to be a pass that counted :data:`FAULTS` faults."""
    harness = subprocess.Popen(
        [sys.executable, "benchmarks/chaos.py", "--faults", str(FAULTS), "--seed", str(SEED), *arguments,
         "--directory", str(directory)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = harness.communicate(timeout=105)
    except subprocess.TimeoutExpired:
        harness.terminate()  # SIGTERM: the harness stops its receiver and egress runs on the way out
        stdout, stderr = harness.communicate(timeout=30)
        pytest.fail(f"the chaos harness did not finish within 105 s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    print(stdout)
    summary = stdout.strip().splitlines()[-1]
    assert harness.returncode == 0, f"{summary}\n{stderr[-3000:]}"
    assert summary.startswith(f"chaos seed {SEED}: {FAULTS} faults"), summary
    assert re.search(r"delivered (\d+) of \1, lost 0, unexpected 0", summary), summary
    assert "unexplained" not in summary, summary
    assert "audit PASS" in summary, summary
    return summary


@pytest.mark.timeout(115)
def test_ten_random_faults_lose_no_flight_and_keep_the_retryable_state_exact(tmp_path: Path) -> None:
    run_harness(tmp_path / "chaos", "--rows", "2000", "--events", "2000")


@pytest.mark.timeout(115)
def test_ten_random_faults_on_a_cluster_of_two_workers_lose_no_flight(tmp_path: Path) -> None:
    summary = run_harness(tmp_path / "chaos", "--cluster", "--rows", "1000", "--events", "1000")
    assert "worker_kill" in summary or "nats_restart" in summary, summary  # the schedule reached the cluster
