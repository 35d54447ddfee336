"""Shared pieces of the end-to-end tests: a recording receiver and ``egress run`` processes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.waiting import eventually_sync, exited

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "http_delivery"
DATA = EXAMPLE / "data" / "flights-2013-01.csv.gz"
SPEC = EXAMPLE / "spec.yaml"
DYNAMIC_SPEC = EXAMPLE / "dynamic_spec.yaml"
SOURCE_ID = "flights_csv"
COMPUTATION_ID = "to_json"
SINK_ID = "http"
RUN_HEADER = "X-Egress-Test-Run"
FIRST_REQUEST_TIMEOUT = 30.0


# -- processes -----------------------------------------------------------------------------------


@dataclass
class Receiver:
    port: int
    record: Path
    process: subprocess.Popen[str]


def launch_receiver(record: Path, *options: str) -> Receiver:
    """Start ``egress receiver --port 0 --record RECORD OPTIONS...`` and wait until it listens."""
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "receiver", "--port", "0", "--record", str(record), *options],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        process.kill()
        pytest.fail(f"the receiver did not start: {line!r}")
    return Receiver(int(match.group(1)), record, process)


def terminate(process: subprocess.Popen[str]) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it has not exited within 10 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_receiver(receiver: Receiver) -> None:
    terminate(receiver.process)


def receiver_stats(receiver: Receiver, action: str = "") -> dict[str, Any]:
    """``GET /stats``, or with ``action`` (``hold?after=N``, ``release``) that ``POST``, which answers the same."""
    url = f"http://127.0.0.1:{receiver.port}/{action or 'stats'}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST" if action else "GET"), timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)
    return stats


def hold_after(receiver: Receiver, count: int) -> None:
    """The receiver answers ``count`` more requests (those it holds first), then holds every further one."""
    receiver_stats(receiver, f"hold?after={count}")


def release(receiver: Receiver) -> None:
    """The receiver answers what it holds and every later request."""
    receiver_stats(receiver, "release")


def wait_until_held(receiver: Receiver, process: subprocess.Popen[bytes], log: Path,
                    timeout: float = 60.0) -> dict[str, Any]:
    """Poll the receiver until it holds a request (the run is mid-way: it waits for an answer);
    returns its stats then. Fails if ``process`` exits first."""

    def held() -> dict[str, Any] | None:
        stats = receiver_stats(receiver)
        return stats if stats["held"] else None

    return eventually_sync(held, what="the receiver holding a request", timeout=timeout,
                           unless=exited(process, log), details=log.read_text)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    """One ``egress receiver --record`` on a free port for the whole test; stopped afterwards."""
    started = launch_receiver(tmp_path / "received.jsonl")
    try:
        yield started
    finally:
        stop_receiver(started)


FIREHOSE_ACCESS_KEY = "e2e-firehose-key"
"""The access key of :func:`firehose_receiver`, in the environment variable ``FIREHOSE_ACCESS_KEY``."""


@pytest.fixture
def firehose_receiver(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """``egress receiver --protocol firehose --record RECORD`` accepting :data:`FIREHOSE_ACCESS_KEY`;
    yields ``(port, record path)`` and stops it afterwards."""
    record = tmp_path / "received.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "receiver", "--protocol", "firehose", "--port", "0",
         "--access-key-env", "FIREHOSE_ACCESS_KEY", "--record", str(record)],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "FIREHOSE_ACCESS_KEY": FIREHOSE_ACCESS_KEY})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        assert found, f"the receiver did not start: {line!r}"
        yield int(found.group(1)), record
    finally:
        terminate(process)


def assert_firehose_requests_tile(expected: list[list[bytes]], requests: list[dict[str, object]]) -> None:
    """Check that the accepted requests of a Firehose receiver's ``--record`` file carry exactly the
    ``expected`` records (one list per partition, in input order), byte for byte.

    Each request of a partition's sink carries a contiguous run of that partition's records, and its
    line gives the count and a SHA-256 over the records (each prefixed by its 8-byte big-endian
    length): walking each partition's records and matching ``(count, digest)`` must tile the whole
    input with no request left over, or the check fails naming where.
    """
    remaining = {(r["records"], r["sha256"]) for r in requests}
    assert len(remaining) == len(requests)
    for part, records in enumerate(expected):
        position = 0
        while position < len(records):
            digest = hashlib.sha256()
            for end in range(position, len(records)):
                digest.update(len(records[end]).to_bytes(8, "big"))
                digest.update(records[end])
                found = (end + 1 - position, digest.hexdigest())
                if found in remaining:
                    remaining.discard(found)
                    position = end + 1
                    break
            else:
                pytest.fail(f"partition {part}: no request carries the records from #{position} on")
    assert remaining == set()  # and no request carried anything else


def write_spec(directory: Path, port: int, run: int) -> Path:
    """The example Spec with an absolute data path, the receiver's URL and the run-number header."""
    spec = yaml.safe_load(SPEC.read_text())
    spec["sources"][SOURCE_ID]["parameters"]["path"] = str(DATA)
    sink = spec["computations"][COMPUTATION_ID]["sinks"][SINK_ID]["parameters"]
    sink["url"] = f"http://127.0.0.1:{port}/events"
    sink["headers"][RUN_HEADER] = str(run)
    path = directory / f"spec-run{run}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def start_run(
    processes: list[subprocess.Popen[bytes]], directory: Path, spec: Path, state: Path, run: int,
    *, until_drained: bool,
) -> tuple[subprocess.Popen[bytes], Path]:
    command = [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(DYNAMIC_SPEC),
               "--state-dir", str(state), "--quiet"]
    if until_drained:
        command.append("--until-drained")
    log = directory / f"run{run}.stderr"
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=REPO, stdout=stderr, stderr=subprocess.STDOUT)
    processes.append(process)
    return process, log


def wait_for_first_request(record: Path, run: int, process: subprocess.Popen[bytes], log: Path) -> float:
    """Poll the receiver's record until a request of ``run`` appears; returns when it was seen."""
    marker = json.dumps({RUN_HEADER: str(run)})[1:-1].encode()
    offset, tail = 0, b""

    def seen() -> float | None:
        nonlocal offset, tail
        with record.open("rb") as file:
            file.seek(offset)
            chunk = file.read()
        offset += len(chunk)
        if marker in tail + chunk:
            return time.time()
        tail = (tail + chunk)[-len(marker):]
        return None

    return eventually_sync(seen, what=f"a request of run {run}", timeout=FIRST_REQUEST_TIMEOUT,
                           unless=exited(process, log), details=log.read_text)


