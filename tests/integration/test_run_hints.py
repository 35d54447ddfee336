"""``egress run`` says how to go on after a run stopped by a bad source record or a raising process
function (the CLI in process, a real pipeline on SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from egress.cli.main import BAD_RECORD_FIX, PROCESS_FUNCTION_FIX, app
from tests.conftest import payload_spec

pytestmark = pytest.mark.integration


def run_cli(spec: Path, state: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", str(spec), "--state-dir", str(state), "--until-drained", "--quiet"])
    return result.exit_code, result.output


def test_a_bad_record_under_fail_stops_the_run_and_says_how_to_go_on(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a", "b", "c"])
    data = tmp_path / "payloads.jsonl"
    data.write_bytes(data.read_bytes() + b'{"id": "seven", "payload": "d"}\n')
    code, printed = run_cli(spec, tmp_path / "state")
    assert code == 1
    assert f"{data}:4: column id: expected int64" in printed
    assert " ".join(BAD_RECORD_FIX.split()) in " ".join(printed.split())


def test_a_raising_process_function_stops_the_run_and_says_what_stays_committed(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", [f"p{i}" for i in range(10)],
                           processing_function="tests.pipelines:FailsOnSeven")
    code, printed = run_cli(spec, tmp_path / "state")
    assert code == 1
    assert "ValueError: cannot handle seven" in printed
    assert " ".join(PROCESS_FUNCTION_FIX.split()) in " ".join(printed.split())
