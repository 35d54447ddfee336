"""The async HTTP sink end to end with real processes: transient failures, terminal failure, recovery,
live DynamicSpec changes and the /status endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, launch_receiver, stop_receiver
from tests.receiver_record import recorded
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e
MESSAGES = 300


def egress_run(processes: list[subprocess.Popen[bytes]], spec: Path, dynamic: Path, state: Path,
               *options: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(state),
         "--quiet", *options], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def records(receiver: Receiver) -> list[dict[str, Any]]:
    return recorded(receiver.record)


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_two_503s_then_200_means_exactly_three_posts_per_message(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    receiver = launch_receiver(tmp_path / "received.jsonl", "--fail-first", "2")
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                                     [f"message {i}" for i in range(MESSAGES)], partition_count=2)
        process = egress_run(egress_processes, spec, dynamic, tmp_path / "state", "--until-drained")
        assert process.wait(timeout=100) == 0, process.stdout.read() if process.stdout else ""
    finally:
        stop_receiver(receiver)
    attempts = Counter(r["idempotency_key"] for r in records(receiver))
    assert len(attempts) == MESSAGES
    assert set(attempts.values()) == {3}
    statuses = Counter(r["status"] for r in records(receiver))
    assert statuses == {503: 2 * MESSAGES, 200: MESSAGES}


@pytest.mark.timeout(150)
def test_exhausted_retries_stop_the_sink_until_a_restart_after_the_fix(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]], unused_tcp_port: int) -> None:
    record = tmp_path / "received.jsonl"
    broken = launch_receiver(record, "--fail-rate", "1", "--fail-status", "500")
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{broken.port}/events",
                                 [f"message {i}" for i in range(MESSAGES)],
                                 dynamic_parameters={"max_attempt_count": 3})
    state = tmp_path / "state"
    try:
        process = egress_run(egress_processes, spec, dynamic, state, "--http-port", str(unused_tcp_port))
        status_url = f"http://127.0.0.1:{unused_tcp_port}/status"
        document = eventually_sync(lambda: "exhausted" in str((d := get_json(status_url))["status"]) and d,
                                   timeout=60, what="a terminal error in /status", interval=0.1, ignoring=(OSError,))
        error = document["status"]["/sinks/http/async_http_sink"]
        assert error.startswith("Async HTTP POST retry policy exhausted after 3 attempt(s)")
        assert document["partitions"][0]["blocked"]
        assert document["partitions"][0]["held"] == []  # blocked is not held: nothing waits for a commit or a lease
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{unused_tcp_port}/metrics", timeout=5).read().decode()
        assert 'egress_status_broken{path="/sinks/http/async_http_sink"} 1.0' in metrics
        # Every delivery started before the terminal failure ends on its own budget (the process says
        # so: no delivery in flight), and none starts after it: what the receiver has now is all it gets.
        eventually_sync(lambda: get_json(status_url)["partitions"][0]["in_flight"] == {"http": 0}, timeout=60,
                        what="every delivery to end after the terminal failure", interval=0.1, ignoring=(OSError,))
        seen = len(records(broken))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 1  # stopped cleanly, but a sink is blocked
        assert len(records(broken)) == seen, "no message may be POSTed after the terminal failure"
        assert max(Counter(r["idempotency_key"] for r in records(broken)).values()) <= 3
        output = process.stdout.read().decode() if process.stdout else ""
        assert "blocked: deliver/http partition 0: Async HTTP POST retry policy exhausted" in output
    finally:
        stop_receiver(broken)
    persisted = _persisted_seq(state)
    assert persisted == 0, "nothing may be acknowledged past the failed message"

    fixed = launch_receiver(record)
    try:
        document = yaml.safe_load(spec.read_text())
        document["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"] = \
            f"http://127.0.0.1:{fixed.port}/events"
        spec.write_text(yaml.safe_dump(document))
        process = egress_run(egress_processes, spec, dynamic, state, "--until-drained")
        assert process.wait(timeout=60) == 0
    finally:
        stop_receiver(fixed)
    delivered = {r["idempotency_key"] for r in records(fixed) if r["status"] == 200}
    assert len(delivered) == MESSAGES


@pytest.mark.timeout(120)
def test_a_live_dynamic_spec_change_reaches_a_delivery_already_retrying(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]], unused_tcp_port: int) -> None:
    """max_attempt_count 2 → 3 while the only delivery pauses after its first failure, so that its second
    failure is not its last; a bad file in between is ignored."""
    receiver = launch_receiver(tmp_path / "received.jsonl", "--fail-first", "2")
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events", ["only"],
                                     dynamic_parameters={"max_attempt_count": 2, "retry_initial_delay": "5s",
                                                         "retry_maximum_delay": "5s", "retry_jitter_ratio": 0.0})
        process = egress_run(egress_processes, spec, dynamic, tmp_path / "state", "--until-drained",
                             "--http-port", str(unused_tcp_port))
        eventually_sync(lambda: receiver.record.exists() and records(receiver), timeout=30, what="the first attempt",
                        interval=0.1, ignoring=(OSError,))
        status_url = f"http://127.0.0.1:{unused_tcp_port}/status"
        document = yaml.safe_load(dynamic.read_text())
        document["computations"]["deliver"]["sinks"]["http"]["parameters"]["max_attempt_count"] = "two"
        dynamic.write_text(yaml.safe_dump(document))
        error = eventually_sync(lambda: get_json(status_url)["dynamic_spec"]["error"], timeout=10,
                                what="the bad file to be reported", interval=0.1, ignoring=(OSError,))
        assert "max_attempt_count" in error
        document["computations"]["deliver"]["sinks"]["http"]["parameters"]["max_attempt_count"] = 3
        dynamic.write_text(yaml.safe_dump(document))
        eventually_sync(lambda: get_json(status_url)["dynamic_spec"]["version"] == 1, timeout=10,
                        what="the fixed file to apply", interval=0.1, ignoring=(OSError,))
        assert len(records(receiver)) == 1, "the change must land within the 5 s pause"
        assert process.wait(timeout=30) == 0
    finally:
        stop_receiver(receiver)
    assert [r["status"] for r in records(receiver)] == [503, 503, 200]


def _persisted_seq(state: Path) -> int:
    import sqlite3

    database = sqlite3.connect(f"{(state / 'egress.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        row = database.execute("SELECT MAX(max_persisted_seq_no) FROM sink_progress").fetchone()
    finally:
        database.close()
    return int(row[0] or 0)


@pytest.mark.timeout(120)
def test_a_second_run_with_nothing_new_says_so(tmp_path: Path) -> None:
    receiver = launch_receiver(tmp_path / "received.jsonl")
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events", ["a", "b", "c"])
        command = [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir",
                   str(tmp_path / "state"), "--until-drained"]
        first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                               env={**os.environ, "COLUMNS": "200"})
        second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "COLUMNS": "200"})
    finally:
        stop_receiver(receiver)
    assert first.returncode == 0, first.stderr
    assert "nothing new" not in first.stderr
    assert second.returncode == 0, second.stderr
    assert (f"nothing new: state directory {tmp_path / 'state'} already holds everything the sources had; to start "
            "over, give this Spec another --state-dir") in second.stderr
    assert len(records(receiver)) == 3
