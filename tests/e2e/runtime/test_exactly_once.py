"""Exactly-once keyed state under SIGKILL: the retryable async request example, killed at random
points while it runs, then finished with ``--until-drained``. The external ``total_length`` of
every key must equal the exact sum of its requests' lengths: no response counted twice (a replayed
batch whose state change was already committed) and none lost (a committed request whose retry
timer or response vanished).

The events file is followed and written in ``KILLS + 1`` slices, one before each run: every kill
lands while work is left (the last slice is written only for the final run) however fast the
machine, and a run killed after it took in its slice is killed with retries pending."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml

from egress.cli.state import state_lines
from tests.conftest import REPO
from tests.waiting import eventually_sync, exited

EXAMPLE = REPO / "examples" / "retryable_async_request"
KILLS = 10
EVENTS = 60_000
KEYS = 50
SEED = int(os.environ.get("EGRESS_TEST_SEED", "20260412"))

pytestmark = pytest.mark.e2e


def make_events(rng: random.Random, events_count: int, keys: int) -> tuple[list[bytes], Counter[str]]:
    """``events_count`` JSON lines (newline-terminated) with random keys (of ``keys``) and data,
    and the expected ``total_length`` per key."""
    expected: Counter[str] = Counter()
    lines = []
    for _ in range(events_count):
        key = f"key-{rng.randrange(keys)}"
        data = "x" * rng.randint(1, 40)
        expected[key] += len(data)
        lines.append(orjson.dumps({"key": key, "data": data}) + b"\n")
    return lines, expected


def write_spec(directory: Path, events: Path, retry_delay: str, *, follow: bool = False) -> Path:
    """The example's Spec reading ``events`` (followed with ``follow``), retrying after ``retry_delay``."""
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"]["events"]["parameters"].update(path=str(events), follow=follow)
    spec["computations"]["request_processor"]["processing_function_parameters"]["delay"] = retry_delay
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_pipeline(directory: Path, rng: random.Random, events_count: int = EVENTS,
                   keys: int = KEYS, retry_delay: str = "1s") -> tuple[Path, Counter[str]]:
    """``events_count`` events with random keys (of ``keys``) and data in one file; returns the
    spec (retry delay ``retry_delay``) and the expected totals."""
    lines, expected = make_events(rng, events_count, keys)
    events = directory / "events.jsonl"
    events.write_bytes(b"".join(lines))
    return write_spec(directory, events, retry_delay), expected


def start(spec: Path, state: Path, log: Path, *, until_drained: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(state), "--quiet"]
    if until_drained:
        command.append("--until-drained")
    with log.open("wb") as output:
        return subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)


def snapshot(state: Path) -> list[dict[str, object]]:
    return list(state_lines(state)) if (state / "egress.sqlite3").exists() else []


def wait_for_progress(state: Path, before: list[dict[str, object]], process: subprocess.Popen[bytes],
                      log: Path) -> float:
    """Poll the committed state (read-only) until this run has changed it; returns the seconds waited."""
    started = time.monotonic()
    eventually_sync(lambda: snapshot(state) != before, what="a commit changing the state", timeout=60, interval=0.02,
                    unless=exited(process, log), details=log.read_text)
    return time.monotonic() - started


def totals(state: Path) -> dict[str, int]:
    return {line["key"][0]: line["row"]["total_length"] for line in state_lines(state, name="/state")}


@pytest.mark.timeout(240)
def test_sigkill_at_random_points_never_counts_a_response_twice_or_loses_one(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    lines, expected = make_events(rng, EVENTS, KEYS)
    events = tmp_path / "events.jsonl"
    events.touch()
    spec = write_spec(tmp_path, events, "1s", follow=True)
    slice_size = -(-EVENTS // (KILLS + 1))

    def append_slice(number: int) -> None:
        with events.open("ab") as file:
            file.writelines(lines[number * slice_size:(number + 1) * slice_size])

    state = tmp_path / "state"
    print(f"\nseed {SEED}: {EVENTS} events over {KEYS} keys, {sum(expected.values())} bytes of requests")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        progress = []
        for run in range(KILLS):
            append_slice(run)
            log = tmp_path / f"run{run}.log"
            process = start(spec, state, log, until_drained=False)
            processes.append(process)
            before = snapshot(state)
            waited = wait_for_progress(state, before, process, log)
            delay = rng.uniform(0.0, 0.4)
            time.sleep(delay)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            counted = sum(totals(state).values())
            progress.append(counted)
            print(f"kill {run}: {waited:.2f} s to its first commit, then {delay:.3f} s; {counted} bytes counted, "
                  f"{len(list(state_lines(state, external=False)))} requests in retry state")
            # Whatever was committed is exact so far: no key over its expected total.
            over = {k: v for k, v in totals(state).items() if v > expected[k]}
            assert not over, f"kill {run}: keys counted beyond their requests: {over}"
        append_slice(KILLS)
        log = tmp_path / "final.log"
        final = start(spec, state, log, until_drained=True)
        processes.append(final)
        assert final.wait(timeout=120) == 0, log.read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert totals(state) == dict(expected)
    assert list(state_lines(state, internal=True, external=False)) == [], "requests still in retry state"
    assert progress == sorted(progress), f"a kill lost counted bytes: {progress}"
