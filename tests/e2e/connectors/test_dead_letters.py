"""Dead letters end to end with real processes: ``egress run`` against a failing ``egress receiver``
goes on past exhausted deliveries, ``egress redrive`` delivers them once with their original keys, and
a SIGKILL while dead letters are being written loses and duplicates nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from egress.connectors.dead_letters import read_dead_letters
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, launch_receiver, release, stop_receiver
from tests.receiver_record import recorded
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e


def dead_letter_spec(tmp_path: Path, receiver: Receiver, messages: int, attempts: int) -> tuple[Path, Path]:
    """``messages`` payloads on 2 partitions to ``receiver``, ``attempts`` each, dead letters to dead.jsonl."""
    return payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                        [f"message {i}" for i in range(messages)], partition_count=2,
                        sink_parameters={"dead_letter_path": str(tmp_path / "dead.jsonl")},
                        dynamic_parameters={"max_attempt_count": attempts})


def egress(processes: list[subprocess.Popen[bytes]], *arguments: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "egress", *arguments], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def finish(process: subprocess.Popen[bytes], timeout: float = 100) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output.decode()


def delivered_keys(receiver: Receiver) -> Counter[str]:
    lines = recorded(receiver.record)
    return Counter(line["idempotency_key"] for line in lines if line["status"] == 200)


def keys_once(dead: Path) -> Counter[str]:
    """The idempotency keys of the dead-letter file, checked complete (no torn line) and once each."""
    letters, torn = read_dead_letters(dead)
    assert torn == 0
    keys = Counter(letter.idempotency_key for letter in letters)
    assert max(keys.values(), default=1) == 1, [k for k, n in keys.items() if n > 1][:5]  # nothing twice
    return keys


def with_url(spec: Path, url: str) -> Path:
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"] = url
    path = spec.with_name("spec-healthy.yaml")
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.timeout(180)
def test_a_run_goes_on_past_exhausted_deliveries_and_redrive_delivers_them_once(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    dead = tmp_path / "dead.jsonl"
    flaky = launch_receiver(tmp_path / "flaky.jsonl", "--fail-rate", "0.5", "--seed", "3")
    try:
        spec, dynamic = dead_letter_spec(tmp_path, flaky, 200, attempts=2)
        code, output = finish(egress(egress_processes, "run", str(spec), "--dynamic-spec", str(dynamic),
                                     "--state-dir", str(tmp_path / "state"), "--quiet", "--until-drained"))
    finally:
        stop_receiver(flaky)
    assert code == 0, output
    dead_keys = keys_once(dead)
    assert dead_keys, "no delivery exhausted its two attempts: raise --fail-rate"
    first_delivered = delivered_keys(flaky)
    assert set(dead_keys).isdisjoint(first_delivered)
    assert len(dead_keys) + len(first_delivered) == 200  # each message delivered or dead-lettered
    assert f"dead letter(s) of deliver/http written to {dead}" in output
    assert f"egress redrive {dead} {spec} --sink deliver/http --dynamic-spec {dynamic}" in output

    healthy = launch_receiver(tmp_path / "healthy.jsonl")
    try:
        healthy_spec = with_url(spec, f"http://127.0.0.1:{healthy.port}/events")
        command = ("redrive", str(dead), str(healthy_spec), "--sink", "deliver/http", "--dynamic-spec", str(dynamic))
        code, output = finish(egress(egress_processes, *command, "--report", str(tmp_path / "report.json")))
        assert code == 0, output
        assert f"{len(dead_keys)} delivered, 0 already redriven, 0 failed" in output
        assert delivered_keys(healthy) == dead_keys  # the original keys, each once
        report = json.loads((tmp_path / "report.json").read_text())
        assert Counter(d["idempotency_key"] for d in report["delivered"]) == dead_keys
        code, output = finish(egress(egress_processes, *command))
        assert code == 0, output
        assert f"0 delivered, {len(dead_keys)} already redriven, 0 failed" in output
        assert delivered_keys(healthy) == dead_keys
    finally:
        stop_receiver(healthy)


@pytest.mark.timeout(240)
def test_sigkill_while_dead_letters_are_written_loses_and_duplicates_nothing(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    messages = 3000
    dead = tmp_path / "dead.jsonl"
    # Fails the first 2,000 requests, then holds the rest: the run cannot finish before the kill.
    down = launch_receiver(tmp_path / "down.jsonl", "--fail-rate", "1.0", "--fail-status", "500",
                           "--hold-after", "2000")
    try:
        spec, dynamic = dead_letter_spec(tmp_path, down, messages, attempts=1)
        run = ("run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(tmp_path / "state"), "--quiet")
        first = egress(egress_processes, *run)
        eventually_sync(lambda: dead.exists() and dead.stat().st_size > 300 * 200,  # a few hundred lines of ~250 bytes
                        what="a few hundred dead letters", timeout=60, interval=0.005, unless=exited(first))
        first.send_signal(signal.SIGKILL)
        first.wait()
        release(down)
        killed_with = len(read_dead_letters(dead)[0])
        assert killed_with < messages, "the run finished before the kill"
        code, output = finish(egress(egress_processes, *run, "--until-drained"), timeout=200)
    finally:
        stop_receiver(down)
    assert code == 0, output
    assert len(keys_once(dead)) == messages  # nothing lost, nothing twice
    assert all(letter.error.endswith("last error: HTTP status 500") for letter in read_dead_letters(dead)[0])
