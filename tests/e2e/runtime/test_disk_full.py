"""The state directory on a filesystem that fills up (issue 15): a 2 MiB tmpfs mounted by the test
(skipped, saying why, where mounts are not permitted). The retryable async request example runs on
it until the filesystem is full: egress must stop with one line naming the directory and the free
space it needs, the SQLite files must pass ``PRAGMA integrity_check`` with what was committed
intact (no key counted beyond its requests), and once the filesystem is grown a restart must
resume and end with every key's ``total_length`` exact."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO
from tests.e2e.runtime.test_exactly_once import totals, write_pipeline

pytestmark = pytest.mark.e2e

EVENTS = 12_000  # their log, requests and responses need more than the 2 MiB


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``tmp_path/small``, unmounted afterwards."""
    directory = tmp_path / "small"
    directory.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(directory)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here: the disk-full test mounts a small tmpfs")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def run(spec: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(state), "--quiet",
                           "--until-drained"], cwd=REPO, capture_output=True, text=True, timeout=120)


def integrity(state: Path) -> list[str]:
    database = sqlite3.connect(f"{(state / 'egress.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        return [row[0] for row in database.execute("PRAGMA integrity_check")]
    finally:
        database.close()


@pytest.mark.timeout(180)
def test_a_full_state_filesystem_stops_with_one_line_keeps_the_commits_and_resumes_once_grown(
        tmp_path: Path, small_filesystem: Path) -> None:
    spec, expected = write_pipeline(tmp_path, random.Random(15), EVENTS)
    state = small_filesystem / "state"

    full = run(spec, state)
    output = (full.stdout + full.stderr).strip()
    assert full.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    last = output.splitlines()[-1]
    assert last.startswith(f"error: {state}: the state directory's filesystem is full ("), last
    assert "MiB free): free at least 32.0 MiB there" in last, last
    assert integrity(state) == ["ok"]
    committed = totals(state)
    assert all(total <= expected[key] for key, total in committed.items()), "a key counted beyond its requests"
    assert sum(committed.values()) < sum(expected.values()), "the filesystem filled only after all the work"

    subprocess.run(["mount", "-o", "remount,size=256m", str(small_filesystem)], check=True)
    resumed = run(spec, state)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert integrity(state) == ["ok"]
    assert totals(state) == dict(expected)
