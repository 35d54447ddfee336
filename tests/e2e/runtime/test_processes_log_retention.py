"""``egress run --processes N`` trims the embedded log its workers share (``egress.runtime.retention``):
the worker running the first computation's partition 0 trims while the run goes on, each worker once
on its way out, and a state directory drained again and again stays flat."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from egress.runtime import RunOptions
from tests.e2e.conftest import REPO
from tests.integration.runtime.test_retention import (
    FLAT_RATIO,
    FLAT_SLACK,
    append_events,
    directory_size,
    log_rows,
    two_step_spec,
)

pytestmark = pytest.mark.e2e

CHUNK = 10_000
RUNS = 3
BATCH = max(RunOptions.epoch_max_messages, RunOptions.source_chunk)  # messages a log batch holds at most


def drain_with_two_processes(spec: Path, state: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--processes", "2", "--until-drained",
                          "--quiet", "--state-dir", str(state)], cwd=REPO, capture_output=True, text=True,
                         timeout=200, check=False)
    assert run.returncode == 0, run.stderr


@pytest.mark.timeout(400)
def test_two_processes_on_one_state_directory_trim_the_log_and_the_directory_stays_flat(tmp_path: Path) -> None:
    """RUNS (3) runs of ``--processes 2``, each draining CHUNK (10,000) more source rows through two
    computations: after each, every log partition holds at most its last batch, and the directory
    after the last run is within FLAT_RATIO (+ FLAT_SLACK) of its size after the first."""
    spec, state, events = two_step_spec(tmp_path), tmp_path / "state", tmp_path / "events.jsonl"
    sizes = []
    for run in range(RUNS):
        append_events(events, run * CHUNK, CHUNK)
        drain_with_two_processes(spec, state)
        rows = log_rows(state)
        assert max(rows["events"], rows["mid"]) <= 2 * BATCH, (run, rows)  # a batch in each of 2 partitions
        sizes.append(directory_size(state))
    print(f"--processes 2, {RUNS * CHUNK:,} source rows: directory sizes {[f'{s / 1e6:.1f} MB' for s in sizes]}")
    assert sizes[-1] <= sizes[0] * FLAT_RATIO + FLAT_SLACK, sizes
