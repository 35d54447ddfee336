"""The ``egress`` commands' exit codes and error lines as a user's shell sees them: each command is a
real subprocess, its stdout and stderr pipes (not a terminal)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, payload_spec

pytestmark = pytest.mark.integration


def egress(*arguments: str, cwd: Path, **options: Any) -> subprocess.CompletedProcess[str]:
    """``python -m egress ARGUMENTS`` in ``cwd``, to its end (a generous deadline guards a hang)."""
    return subprocess.run([sys.executable, "-m", "egress", *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **options)


def test_throttler_serve_names_a_missing_dynamic_spec_and_exits_2(tmp_path: Path) -> None:
    """As ``egress run missing.yaml`` does: one line naming the file, no traceback, exit 2."""
    served = egress("throttler", "serve", "--dynamic-spec", "missing.yaml", "--port", "0", cwd=tmp_path)
    assert served.returncode == 2
    assert served.stderr == "missing.yaml: file not found\n"
    run = egress("run", "missing.yaml", cwd=tmp_path)
    assert (run.returncode, run.stderr) == (served.returncode, served.stderr)


def secrets_spec(tmp_path: Path) -> Path:
    """tests/conftest.py's payload pipeline with a secret by reference of each kind: an http source's
    ``bearer_token_env``, a nats source's ``user_env`` and ``password_env``, a Firehose sink's
    ``access_key: {env: ...}``."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    document = yaml.safe_load(spec.read_text())
    document["sources"]["hooks"] = {"source_class_name": "http", "output_stream_id": "events",
                                    "parameters": {"port": 0, "bearer_token_env": "EGRESS_TEST_TOKEN"}}
    document["sources"]["orders"] = {"source_class_name": "nats", "output_stream_id": "events",
                                     "parameters": {"stream": "ORDERS", "user_env": "EGRESS_TEST_USER",
                                                    "password_env": "EGRESS_TEST_PASSWORD"}}
    document["computations"]["deliver"]["sinks"]["firehose"] = {
        "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
        "parameters": {"url": "http://127.0.0.1:9/firehose", "payload_column": "payload", "stream_name": "s",
                       "access_key": {"env": "EGRESS_TEST_FIREHOSE_KEY"}}}
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_validate_and_run_refuse_every_unset_secret_variable_alike_naming_each(tmp_path: Path) -> None:
    spec = secrets_spec(tmp_path)
    names = ("EGRESS_TEST_TOKEN", "EGRESS_TEST_USER", "EGRESS_TEST_PASSWORD", "EGRESS_TEST_FIREHOSE_KEY")
    environment = {name: value for name, value in os.environ.items() if name not in names}
    environment["EGRESS_TEST_PASSWORD"] = "set"
    validated = egress("validate", str(spec), cwd=REPO, env=environment)
    assert validated.returncode == 2
    assert validated.stderr.splitlines() == [
        f"{spec}: sources/hooks/parameters/bearer_token_env: environment variable EGRESS_TEST_TOKEN is not set or "
        "empty: export it before egress run",
        f"{spec}: sources/orders/parameters/user_env: environment variable EGRESS_TEST_USER is not set or empty: "
        "export it before egress run",
        f"{spec}: computations/deliver/sinks/firehose/parameters/access_key: access key environment variable "
        "EGRESS_TEST_FIREHOSE_KEY is not set or empty"]
    run = egress("run", str(spec), "--state-dir", str(tmp_path / "state"), cwd=REPO, env=environment)
    assert (run.returncode, run.stderr) == (validated.returncode, validated.stderr)
    assert not (tmp_path / "state").exists()
    every = {**environment, **dict.fromkeys(names, "set")}
    assert egress("validate", str(spec), cwd=REPO, env=every).returncode == 0


def test_records_of_the_firehose_error_output_show_in_the_summary_and_report_as_dead_letters_do(
        tmp_path: Path) -> None:
    """Every batch fails (nothing listens; ``retry_duration: 0``, one attempt): the records go to
    ``error_output``; the run goes on and exits 0, as with the async HTTP sink's dead letters, and its
    summary, its report and a line naming the file count them (none of them was delivered)."""
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", [f"record {i}" for i in range(30)])
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"] = {"firehose": {
        "sink_class_name": "firehose_http", "input_stream_ids": ["requests"],
        "parameters": {"url": "http://127.0.0.1:9/firehose", "payload_column": "payload", "stream_name": "s",
                       "retry_duration": 0, "error_output": "fherr.jsonl"}}}
    spec.write_text(yaml.safe_dump(document))
    dynamic.write_text("{}\n")
    run = egress("run", str(spec), "--until-drained", "--state-dir", str(tmp_path / "state"),
                 "--report", str(tmp_path / "report.json"), cwd=REPO)
    assert run.returncode == 0, run.stderr
    errors = tmp_path / "fherr.jsonl"
    assert len(errors.read_text().splitlines()) == 30
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["delivered"], report["error_output_records"]) == (0, 30)
    assert report["error_outputs"] == {"deliver/firehose": {"path": str(errors), "records": 30}}
    assert re.search(r"error output records\W+30\b", run.stderr)
    assert (f"30 record(s) of deliver/firehose not delivered, written to the error output {errors}; "
            "egress redrive reads dead letters") in " ".join((run.stdout + run.stderr).split())
