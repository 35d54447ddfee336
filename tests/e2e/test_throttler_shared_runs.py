"""Three ``egress run`` processes share one ``egress throttler serve`` through their HTTP sinks'
``throttler_id``: the endpoint sees at most ``limit·T + limit·period`` requests in every window, and
killing the service for a while and restarting it loses no message."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, launch_receiver, stop_receiver

pytestmark = pytest.mark.e2e
LIMIT, PERIOD, REQUEST_PERIOD = 40, 1.0, 0.5
RUNS, MESSAGES = 3, 100
OUTAGE = 10.0  # seconds the service is away (the issue: "killing the service for 10 s")


def serve(dynamic: Path, port: int = 0) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([sys.executable, "-m", "egress", "throttler", "serve", "--dynamic-spec", str(dynamic),
                                "--port", str(port)], stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not found:
        process.kill()
        pytest.fail(f"the throttler service did not start: {line!r}")
    return process, int(found.group(1))


@pytest.mark.timeout(180)
def test_three_runs_share_one_limit_and_survive_a_service_outage(tmp_path: Path) -> None:
    throttlers = {"throttlers": {"endpoint": {
        "limit": LIMIT, "period": f"{PERIOD:g}s", "request_period": f"{int(REQUEST_PERIOD * 1000)}ms",
        # Clients retry the absent service every 200 ms, so granting resumes promptly after the restart.
        "retrying_channel": {"retry_backoff_time": "200ms", "enable_exponential_retry_backoffs": False}}}}
    service_spec = tmp_path / "throttlers.yaml"
    service_spec.write_text(yaml.safe_dump(throttlers))
    receiver = launch_receiver(tmp_path / "received.jsonl")
    service, port = serve(service_spec)
    runs: list[subprocess.Popen[bytes]] = []
    try:
        for run in range(RUNS):
            directory = tmp_path / f"run{run}"
            directory.mkdir()
            spec, dynamic = payload_spec(directory, f"http://127.0.0.1:{receiver.port}/events",
                                         [f"run {run} message {i}" for i in range(MESSAGES)],
                                         sink_parameters={"throttler_id": "endpoint"})
            document = yaml.safe_load(dynamic.read_text())
            document.update(throttlers)
            dynamic.write_text(yaml.safe_dump(document))
            runs.append(subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                 "--state-dir", str(directory / "state"), "--until-drained", "--quiet",
                 "--throttler-url", f"http://127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT))
        time.sleep(2.0)
        service.send_signal(signal.SIGKILL)
        service.wait()
        killed = time.time()
        time.sleep(OUTAGE)
        service, _ = serve(service_spec, port)
        restarted = time.time()
        for process in runs:
            assert process.wait(timeout=120) == 0, process.stdout.read().decode() if process.stdout else ""
    finally:
        for process in runs:
            if process.poll() is None:
                process.kill()
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=10)
        stop_receiver(receiver)
    records = [json.loads(line) for line in (tmp_path / "received.jsonl").read_text().splitlines()]
    # The three pipelines number their messages alike (same source id and positions): count bodies.
    assert len({r["body_sha256"] for r in records if r["status"] == 200}) == RUNS * MESSAGES
    times = sorted(r["time"] for r in records)
    during_outage = [t for t in times if killed + 0.1 < t < restarted]
    # Quota prefetched before the kill may still be spent; nothing beyond one period's worth.
    assert len(during_outage) <= LIMIT * PERIOD
    after = [t for t in times if t >= restarted]
    assert after, "granting never resumed"
    assert after[0] - restarted <= REQUEST_PERIOD + 0.2 + 0.5  # one request period, one retry, slack
    # The restarted service starts with a full bucket: one extra burst of limit·period is allowed there.
    for length in (1.0, 2.0, 4.0):
        for start, moment in enumerate(times):
            inside = sum(1 for t in times[start:] if t < moment + length)
            extra = LIMIT * PERIOD if moment <= restarted <= moment + length else 0
            assert inside <= LIMIT * length + LIMIT * PERIOD + extra, (length, moment, inside)
