"""Dead letters end to end with real processes: ``egress run`` against a failing ``egress receiver``
goes on past exhausted deliveries, ``egress redrive`` delivers them once with their original keys, and
a SIGKILL while dead letters are being written loses and duplicates nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from egress.connectors.dead_letters import read_dead_letters
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, launch_receiver, stop_receiver

pytestmark = pytest.mark.e2e


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def egress(processes: list[subprocess.Popen[bytes]], *arguments: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "egress", *arguments], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def finish(process: subprocess.Popen[bytes], timeout: float = 100) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output.decode()


def delivered_keys(receiver: Receiver) -> Counter[str]:
    lines = [json.loads(line) for line in receiver.record.read_text().splitlines()]
    return Counter(line["idempotency_key"] for line in lines if line["status"] == 200)


def with_url(spec: Path, url: str) -> Path:
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"] = url
    path = spec.with_name("spec-healthy.yaml")
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.timeout(180)
def test_a_run_goes_on_past_exhausted_deliveries_and_redrive_delivers_them_once(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    dead = tmp_path / "dead.jsonl"
    flaky = launch_receiver(tmp_path / "flaky.jsonl", "--fail-rate", "0.5", "--seed", "3")
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{flaky.port}/events",
                                     [f"message {i}" for i in range(200)], partition_count=2,
                                     sink_parameters={"dead_letter_path": str(dead)},
                                     dynamic_parameters={"max_attempt_count": 2})
        code, output = finish(egress(processes, "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir",
                                     str(tmp_path / "state"), "--quiet", "--until-drained"))
    finally:
        stop_receiver(flaky)
    assert code == 0, output
    letters, torn = read_dead_letters(dead)
    assert torn == 0
    dead_keys = Counter(letter.idempotency_key for letter in letters)
    assert dead_keys, "no delivery exhausted its two attempts: raise --fail-rate"
    assert max(dead_keys.values()) == 1
    first_delivered = delivered_keys(flaky)
    assert set(dead_keys).isdisjoint(first_delivered)
    assert len(dead_keys) + len(first_delivered) == 200  # each message delivered or dead-lettered
    assert f"dead letter(s) of deliver/http written to {dead}" in output
    assert f"egress redrive {dead} {spec} --sink deliver/http --dynamic-spec {dynamic}" in output

    healthy = launch_receiver(tmp_path / "healthy.jsonl")
    try:
        healthy_spec = with_url(spec, f"http://127.0.0.1:{healthy.port}/events")
        command = ("redrive", str(dead), str(healthy_spec), "--sink", "deliver/http", "--dynamic-spec", str(dynamic))
        code, output = finish(egress(processes, *command))
        assert code == 0, output
        assert f"{len(dead_keys)} delivered, 0 already redriven, 0 failed" in output
        assert delivered_keys(healthy) == dead_keys  # the original keys, each once
        code, output = finish(egress(processes, *command))
        assert code == 0, output
        assert f"0 delivered, {len(dead_keys)} already redriven, 0 failed" in output
        assert delivered_keys(healthy) == dead_keys
    finally:
        stop_receiver(healthy)


@pytest.mark.timeout(240)
def test_sigkill_while_dead_letters_are_written_loses_and_duplicates_nothing(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    messages = 3000
    dead = tmp_path / "dead.jsonl"
    down = launch_receiver(tmp_path / "down.jsonl", "--fail-rate", "1.0", "--fail-status", "500")
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{down.port}/events",
                                     [f"message {i}" for i in range(messages)], partition_count=2,
                                     sink_parameters={"dead_letter_path": str(dead)},
                                     dynamic_parameters={"max_attempt_count": 1})
        run = ("run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(tmp_path / "state"), "--quiet")
        first = egress(processes, *run)
        deadline = time.monotonic() + 60
        while not (dead.exists() and dead.stat().st_size > 300 * 200):  # a few hundred lines of ~250 bytes
            assert first.poll() is None, finish(first)[1]
            assert time.monotonic() < deadline, "no dead letters within 60 s"
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_with = len(read_dead_letters(dead)[0])
        assert killed_with < messages, "the run finished before the kill: raise the message count"
        code, output = finish(egress(processes, *run, "--until-drained"), timeout=200)
    finally:
        stop_receiver(down)
    assert code == 0, output
    letters, torn = read_dead_letters(dead)
    assert torn == 0
    keys = Counter(letter.idempotency_key for letter in letters)
    assert len(keys) == messages  # nothing lost
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1][:5]  # nothing twice
    assert all(letter.error.endswith("last error: HTTP status 500") for letter in letters)
