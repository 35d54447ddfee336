"""Binary payloads end to end with real processes: ``egress run`` of a pipeline whose process
function emits ``bytes`` for a string column (all 256 byte values in every payload, NUL and invalid
UTF-8 included; every tenth payload text), delivered by each sink to the project's receiver, which
records a SHA-256 of what it got: the body per request (async HTTP), or the base64-decoded record
data of each request (Firehose). Both must be the process function's bytes exactly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import payload_key, payload_spec
from tests.e2e.conftest import (
    FIREHOSE_ACCESS_KEY,
    REPO,
    Receiver,
    assert_firehose_requests_tile,
)
from tests.pipelines import expected_body
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e
MESSAGES = 256  # one of each rotation of the 256 byte values


def egress_run(spec: Path, dynamic: Path, state: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(state),
         "--until-drained", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=100, check=False,
        env={**os.environ, "FIREHOSE_ACCESS_KEY": FIREHOSE_ACCESS_KEY})
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.timeout(120)
def test_egress_run_posts_every_byte_value_exactly_to_egress_receiver(tmp_path: Path, receiver: Receiver) -> None:
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events", [None] * MESSAGES,
                                 partition_count=2, processing_function="tests.pipelines:EmitsBinary")
    egress_run(spec, dynamic, tmp_path / "state")
    requests = recorded(receiver.record)
    assert {r["idempotency_key"]: (r["body_sha256"], r["body_bytes"]) for r in requests} == {
        payload_key(tmp_path, i): (hashlib.sha256(expected_body(i)).hexdigest(), len(expected_body(i)))
        for i in range(MESSAGES)}
    assert len(requests) == MESSAGES
    assert {r["status"] for r in requests} == {200}


@pytest.mark.timeout(120)
def test_egress_run_sends_every_byte_value_exactly_as_firehose_record_data(
        tmp_path: Path, firehose_receiver: tuple[int, Path]) -> None:
    port, record = firehose_receiver
    spec_path, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{port}/", [None] * MESSAGES,
                                      processing_function="tests.pipelines:EmitsBinary")
    spec = yaml.safe_load(spec_path.read_text())
    spec["computations"]["deliver"]["sinks"]["http"] = {
        "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
        "parameters": {"url": f"http://127.0.0.1:{port}/", "payload_column": "payload", "stream_name": "binary",
                       "access_key": {"env": "FIREHOSE_ACCESS_KEY"}, "content_encoding": "gzip",
                       "buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 0}}}
    spec_path.write_text(yaml.safe_dump(spec))
    dynamic.write_text("{}")
    egress_run(spec_path, dynamic, tmp_path / "state")
    requests = recorded(record)
    assert sum(r["records"] for r in requests) == MESSAGES
    assert_firehose_requests_tile([[expected_body(i) for i in range(MESSAGES)]], requests)
