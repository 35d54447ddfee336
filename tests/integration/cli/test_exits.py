"""The ``egress`` commands' exit codes and error lines as a user's shell sees them: each command is a
real subprocess, its stdout and stderr pipes (not a terminal)."""

from __future__ import annotations

import os
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
