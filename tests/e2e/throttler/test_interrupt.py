"""Ctrl-C while a job waits for throttler quota: ``egress run`` gives the wait up, commits what
the endpoint acknowledged and exits within one epoch; the next run sends only what was not
acknowledged."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, launch_receiver, terminate
from tests.e2e.throttler.test_cluster import get
from tests.ports import free_port
from tests.receiver_record import recorded
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

FIRST, MORE = 5, 20
"""Messages in the file when the run starts, and lines appended once those are acknowledged."""
EXIT_WITHIN = 5.0
"""Seconds from SIGINT to exit the test allows: one epoch (50 ms), the final commit and the
process's own shutdown (the controller, the sinks, the HTTP server) on a loaded 2-core machine;
the wait it gives up would last ``MORE / limit`` = 200 s more."""


DELAY = 1.0
"""Seconds the receiver holds every request: the first messages' acknowledgements arrive while
the next batch already waits for quota, so only the final commit of the interrupted run can
record them."""


@pytest.fixture
def slow_receiver(tmp_path: Path) -> Iterator[Receiver]:
    receiver = launch_receiver(tmp_path / "received.jsonl", "--delay", f"{DELAY:g}")
    yield receiver
    terminate(receiver.process)


def rows(start: int, count: int) -> bytes:
    return b"".join(orjson.dumps({"id": i, "payload": f"message {i}"}) + b"\n" for i in range(start, start + count))


def followed_spec(tmp_path: Path, receiver: Receiver, limit: float) -> tuple[Path, Path, Path]:
    """A followed JSONL file of ``FIRST`` messages delivered to the receiver, every input batch
    throttled (``input_rows_throttler_id``) at ``limit`` messages/s with a burst of ``FIRST``;
    returns ``(spec, dynamic spec, data file)``."""
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events", [])
    document = yaml.safe_load(spec.read_text())
    source = document["sources"]["events_jsonl"]["parameters"]
    source["follow"] = True
    data = Path(source["path"])
    data.write_bytes(rows(0, FIRST))
    spec.write_text(yaml.safe_dump(document))
    dynamic_document = yaml.safe_load(dynamic.read_text())
    dynamic_document["throttlers"] = {"input": {"limit": limit, "period": f"{FIRST / limit:g}s"}}
    dynamic_document["computations"]["deliver"]["input_rows_throttler_id"] = "input"
    dynamic.write_text(yaml.safe_dump(dynamic_document))
    return spec, dynamic, data


def start(tmp_path: Path, spec: Path, dynamic: Path, port: int, run: int,
          processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    with (tmp_path / f"run{run}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
             "--state-dir", str(tmp_path / "state"), "--http-port", str(port), "--quiet"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def acknowledged(receiver: Receiver) -> list[dict[str, Any]]:
    return [r for r in recorded(receiver.record) if r["status"] == 200]


def metric(port: int, name: str) -> float | None:
    """The sum of a metric's samples on a run's /metrics (``None`` while it does not answer)."""
    body = get(f"http://127.0.0.1:{port}/metrics")
    if body is None:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name) and line[len(name)] in "{ ")


@pytest.mark.timeout(120)
def test_ctrl_c_while_a_job_waits_for_quota_commits_the_acknowledged_and_exits_within_one_epoch(
        tmp_path: Path, slow_receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    receiver = slow_receiver
    spec, dynamic, data = followed_spec(tmp_path, receiver, limit=0.1)
    port = free_port()
    process = start(tmp_path, spec, dynamic, port, 1, egress_processes)
    # The first batch takes the full bucket (FIRST messages); while the receiver holds its
    # requests, the next batch is read and waits for quota (MORE / limit = 200 s).
    eventually_sync(lambda: (metric(port, "egress_throttler_value_total") or 0) >= FIRST,
                    what="the first batch granted", timeout=30, interval=0.05)
    with data.open("ab") as file:
        file.write(rows(FIRST, MORE))
    eventually_sync(lambda: (metric(port, "egress_throttler_queue_size") or 0) >= 1,
                    what="the next batch waiting for quota at the controller", timeout=30, interval=0.05)
    eventually_sync(lambda: (metric(port, "egress_sink_records_delivered_total") or 0) >= FIRST,
                    what="the first batch acknowledged while the next one waits", timeout=30, interval=0.05)
    assert (metric(port, "egress_throttler_queue_size") or 0) >= 1, "the next batch got its quota: a longer wait"
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running 30 s after Ctrl-C:\n{(tmp_path / 'run1.log').read_text()}")
    took = time.monotonic() - interrupted
    print(f"\nexited {code} {took:.2f} s after Ctrl-C while waiting for quota")
    assert code == 0, (tmp_path / "run1.log").read_text()
    assert took <= EXIT_WITHIN, f"exited {took:.2f} s after Ctrl-C"
    first_run = acknowledged(receiver)
    assert len(first_run) == FIRST, "the batch that waited for quota must not have been sent"

    # The next run, with quota to spare, sends the rest and nothing the endpoint acknowledged before.
    dynamic_document = yaml.safe_load(dynamic.read_text())
    dynamic_document["throttlers"]["input"] = {"limit": 1000.0, "period": "1s"}
    dynamic.write_text(yaml.safe_dump(dynamic_document))
    process = start(tmp_path, spec, dynamic, port, 2, egress_processes)
    eventually_sync(lambda: len(acknowledged(receiver)) >= FIRST + MORE, what="the rest delivered", timeout=30,
                    interval=0.05)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0, (tmp_path / "run2.log").read_text()
    delivered = Counter(r["body_sha256"] for r in acknowledged(receiver))
    assert len(delivered) == FIRST + MORE
    assert sum(delivered.values()) == FIRST + MORE, "a message acknowledged in the first run was sent again"
