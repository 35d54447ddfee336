"""Exactly-once keyed state under SIGKILL: the retryable async request example, killed at random
points while it runs, then finished with ``--until-drained``. The external ``total_length`` of
every key must equal the exact sum of its requests' lengths: no response counted twice (a replayed
batch whose state change was already committed) and none lost (a committed request whose retry
timer or response vanished)."""

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

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "retryable_async_request"
KILLS = 10
EVENTS = 60_000
KEYS = 50
SEED = int(os.environ.get("EGRESS_TEST_SEED", "20260412"))

pytestmark = pytest.mark.e2e


def write_pipeline(directory: Path, rng: random.Random, events_count: int = EVENTS,
                   keys: int = KEYS, retry_delay: str = "1s") -> tuple[Path, Counter[str]]:
    """``events_count`` events with random keys (of ``keys``) and data; returns the spec (retry
    delay ``retry_delay``) and the expected totals."""
    expected: Counter[str] = Counter()
    lines = []
    for _ in range(events_count):
        key = f"key-{rng.randrange(keys)}"
        data = "x" * rng.randint(1, 40)
        expected[key] += len(data)
        lines.append(orjson.dumps({"key": key, "data": data}))
    events = directory / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"]["events"]["parameters"]["path"] = str(events)
    spec["computations"]["request_processor"]["processing_function_parameters"]["delay"] = retry_delay
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, expected


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
    while time.monotonic() - started < 60:
        assert process.poll() is None, f"the run ended before the kill:\n{log.read_text()}"
        if snapshot(state) != before:
            return time.monotonic() - started
        time.sleep(0.02)
    pytest.fail(f"no commit changed the state within 60 s:\n{log.read_text()}")


def totals(state: Path) -> dict[str, int]:
    return {line["key"][0]: line["row"]["total_length"] for line in state_lines(state, name="/state")}


@pytest.mark.timeout(240)
def test_sigkill_at_random_points_never_counts_a_response_twice_or_loses_one(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    spec, expected = write_pipeline(tmp_path, rng)
    state = tmp_path / "state"
    print(f"\nseed {SEED}: {EVENTS} events over {KEYS} keys, {sum(expected.values())} bytes of requests")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        progress = []
        for run in range(KILLS):
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
    mid_work = [counted for counted in progress if counted < sum(expected.values())]
    assert len(mid_work) == KILLS, f"some kills came after all work was done: {progress}"
