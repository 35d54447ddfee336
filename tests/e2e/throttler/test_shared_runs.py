"""``egress run`` processes share one ``egress throttler serve`` through their HTTP sinks'
``throttler_id``: the receiver sees at most ``limit·T + limit·period`` requests in every window of
every length ``T`` (one unit more for the requests' own travel), a quick restart of the service
included, and killing the service for a while and restarting it loses no message."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.throttler.envelope import worst_excess
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, launch_receiver, stop_receiver
from tests.receiver_record import recorded, recorded_count
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e
LIMIT, PERIOD, REQUEST_PERIOD = 40, 1.0, 0.5
RUNS, MESSAGES = 3, 100
OUTAGE = 10.0  # seconds the service is away (the issue: "killing the service for 10 s")


def serve(dynamic: Path, port: int = 0) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([sys.executable, "-m", "egress", "throttler", "serve", "--dynamic-spec", str(dynamic),
                                "--port", str(port), "--state-file", str(dynamic.with_suffix(".state.json"))],
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not found:
        process.kill()
        pytest.fail(f"the throttler service did not start: {line!r}")
    return process, int(found.group(1))


def throttlers(limit: float, period: float, request_period: float, backoff: str, **more: Any) -> dict[str, Any]:
    return {"throttlers": {"endpoint": {
        "limit": limit, "period": f"{period:g}s", "request_period": f"{int(request_period * 1000)}ms",
        "retrying_channel": {"retry_backoff_time": backoff, "enable_exponential_retry_backoffs": False}, **more}}}


def start_runs(tmp_path: Path, receiver: Receiver, shared: dict[str, Any], port: int, runs: int, messages: int,
               partitions: int = 1) -> list[subprocess.Popen[bytes]]:
    """``runs`` pipelines, each delivering ``messages`` requests through the throttler ``endpoint``."""
    processes = []
    for run in range(runs):
        directory = tmp_path / f"run{run}"
        directory.mkdir()
        spec, dynamic = payload_spec(directory, f"http://127.0.0.1:{receiver.port}/events",
                                     [f"run {run} message {i}" for i in range(messages)],
                                     partition_count=partitions, sink_parameters={"throttler_id": "endpoint"})
        document = yaml.safe_load(dynamic.read_text())
        document.update(shared)
        dynamic.write_text(yaml.safe_dump(document))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
             "--state-dir", str(directory / "state"), "--until-drained", "--quiet",
             "--throttler-url", f"http://127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT))
    return processes


def wait_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        assert process.wait(timeout=120) == 0, process.stdout.read().decode() if process.stdout else ""


def received(receiver: Receiver) -> list[dict[str, Any]]:
    return recorded(receiver.record)


@dataclass
class Shared:
    """A receiver, the throttler service (``restart()`` kills it and starts it again on its port) and
    the runs started against them."""

    tmp_path: Path
    receiver: Receiver
    service_spec: Path
    service: subprocess.Popen[str]
    port: int
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def kill_service(self) -> None:
        self.service.send_signal(signal.SIGKILL)
        self.service.wait()

    def start_service(self) -> None:
        self.service, _ = serve(self.service_spec, self.port)


@contextmanager
def shared_service(tmp_path: Path, shared: dict[str, Any]) -> Iterator[Shared]:
    """The receiver and the service for a test; whatever still runs at the end is stopped."""
    service_spec = tmp_path / "throttlers.yaml"
    service_spec.write_text(yaml.safe_dump(shared))
    receiver = launch_receiver(tmp_path / "received.jsonl")
    service, port = serve(service_spec)
    setup = Shared(tmp_path, receiver, service_spec, service, port)
    try:
        yield setup
    finally:
        for process in setup.runs:
            if process.poll() is None:
                process.kill()
        setup.service.send_signal(signal.SIGTERM)
        setup.service.wait(timeout=10)
        stop_receiver(receiver)


@pytest.mark.timeout(120)
def test_runs_sharing_one_service_keep_the_envelope_at_the_receiver(tmp_path: Path) -> None:
    # Two partitions per run: six HTTP sink clients, each with many POSTs waiting at once, in three
    # processes; chunks of 2 units; once the burst and some more have gone, the service is killed
    # and restarted at once, well within one period (it resumes from its restart horizon).
    limit, period, runs, messages = 10.0, 2.0, 3, 24
    shared = throttlers(limit, period, 0.25, "100ms", max_grant_amount=2)
    with shared_service(tmp_path, shared) as setup:
        setup.runs = start_runs(tmp_path, setup.receiver, shared, setup.port, runs, messages, partitions=2)
        eventually_sync(lambda: recorded_count(setup.receiver.record) >= limit * period + limit,
                        what=f"{limit * period + limit:g} requests delivered", timeout=60, interval=0.05)
        setup.kill_service()
        setup.start_service()
        wait_all(setup.runs)
    records = received(setup.receiver)
    assert len({r["body_sha256"] for r in records if r["status"] == 200}) == runs * messages
    excess = worst_excess([(r["time"], 1.0) for r in records], limit, limit * period)
    print(f"worst window at the receiver: {excess:+.2f} requests beyond limit·T + limit·period")  # seen with -s
    assert excess <= 1.0, f"{excess:.2f} requests beyond limit·T + limit·period in the worst window"


@pytest.mark.timeout(180)
def test_three_runs_share_one_limit_and_survive_a_service_outage(tmp_path: Path) -> None:
    # Clients retry the absent service every 200 ms, so granting resumes promptly after the restart.
    shared = throttlers(LIMIT, PERIOD, REQUEST_PERIOD, "200ms")
    with shared_service(tmp_path, shared) as setup:
        setup.runs = start_runs(tmp_path, setup.receiver, shared, setup.port, RUNS, MESSAGES)
        # Granting: a second's worth of the limit arrived, and the rest takes the limit 6.5 s more.
        eventually_sync(lambda: recorded_count(setup.receiver.record) >= LIMIT * PERIOD,
                        what=f"{LIMIT * PERIOD:g} requests granted and delivered")
        setup.kill_service()
        killed = time.time()
        time.sleep(OUTAGE)
        setup.start_service()
        restarted = time.time()
        wait_all(setup.runs)
    records = received(setup.receiver)
    # The three pipelines number their messages alike (same source id and positions): count bodies.
    assert len({r["body_sha256"] for r in records if r["status"] == 200}) == RUNS * MESSAGES
    times = sorted(r["time"] for r in records)
    # Prefetched quota lasts one lease (request_period here) after its grant, then it is dropped.
    assert [t for t in times if killed + REQUEST_PERIOD + 0.1 < t < restarted] == []
    after = [t for t in times if t >= restarted]
    assert after, "granting never resumed"
    assert after[0] - restarted <= REQUEST_PERIOD + 0.2 + 0.5  # one request period, one retry, slack
    assert worst_excess([(t, 1.0) for t in times], LIMIT, LIMIT * PERIOD) <= 1.0
