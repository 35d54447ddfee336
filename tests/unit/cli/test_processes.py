"""``egress run``'s cluster options: the engine URL, the worker id's use, the Spec digest, and the
``--processes`` parent's pure parts (child command, restarts, one summary, exit code)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import app
from egress.cli.processes import ProcessesRun, exit_code, merge_reports
from egress.cli.report import summary_table
from egress.runtime import load_plan
from egress.runtime.cluster.worker import spec_digest
from egress.runtime.options import EngineChoice, parse_engine
from tests.conftest import payload_spec


def test_the_engine_is_sqlite_or_a_list_of_nats_servers() -> None:
    assert parse_engine("sqlite") == EngineChoice()
    assert parse_engine("nats://127.0.0.1:4222,10.0.0.2:4223").servers == (
        "nats://127.0.0.1:4222", "nats://10.0.0.2:4223")
    assert parse_engine("nats://a:1,nats://b:2").url == "nats://a:1,nats://b:2"


@pytest.mark.parametrize("text", ["postgres://x:1", "nats://host", "nats://:4222", "nats://h:0", "nats://h:port"])
def test_another_engine_value_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_engine(text)


def test_egress_run_refuses_an_engine_it_does_not_know(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    result = CliRunner().invoke(app, ["run", str(spec), "--engine", "nats:/oops"])
    assert result.exit_code == 2
    assert "--engine" in result.output


def test_a_worker_id_without_a_cluster_engine_is_refused_with_the_way(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    result = CliRunner().invoke(app, ["run", str(spec), "--worker-id", "w1"])
    assert result.exit_code == 2
    assert "--processes N" in result.output


def test_the_spec_digest_is_the_specs_not_its_files(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    as_json = tmp_path / "spec.json"
    as_json.write_text(json.dumps(yaml.safe_load(spec.read_text()), indent=3))
    assert spec_digest(load_plan(as_json).spec) == spec_digest(load_plan(spec).spec)
    (tmp_path / "other").mkdir()
    other, _ = payload_spec(tmp_path / "other", "http://127.0.0.1:10/events", ["a"])
    assert spec_digest(load_plan(other).spec) != spec_digest(load_plan(spec).spec)


def parent(tmp_path: Path, engine: str = "sqlite", http_port: int | None = None) -> ProcessesRun:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    return ProcessesRun(load_plan(spec), tmp_path / "state", parse_engine(engine), 2, [str(spec), "--until-drained"],
                        quiet=True, report=None, base_id="host-1", http_port=http_port)


def test_each_child_is_a_worker_of_its_own_id_on_the_shared_state_directory(tmp_path: Path) -> None:
    command = parent(tmp_path, http_port=9000).child_command(1)
    assert command[command.index("--worker-id") + 1] == "host-1-1"
    assert command[command.index("--state-dir") + 1] == str((tmp_path / "state").absolute())
    assert command[command.index("--http-port") + 1] == "9001"
    assert "--shared-state" in command
    assert "--until-drained" in command
    assert "--shared-state" not in parent(tmp_path, "nats://127.0.0.1:4222").child_command(0)


def test_a_child_killed_by_a_signal_is_restarted_one_that_exited_as_egress_does_is_not(tmp_path: Path) -> None:
    run = parent(tmp_path)
    assert run._should_restart(0, -signal.SIGKILL)
    assert run._should_restart(0, 137)
    for code in (0, 1, 2, 130):
        assert not run._should_restart(0, code)


def test_a_child_that_keeps_dying_is_given_up_after_the_restart_limit(tmp_path: Path) -> None:
    run = parent(tmp_path)
    restarts = sum(run._should_restart(0, -signal.SIGKILL) for _ in range(20))
    assert restarts == 10


def test_the_summary_adds_the_workers_reports_up(tmp_path: Path) -> None:
    for index, (delivered, code) in enumerate([(10, "200"), (5, "503")]):
        (tmp_path / f"w{index}.json").write_text(json.dumps(
            {"rows_read": 15 * (1 - index), "delivered": delivered, "responses": {code: delivered}, "drained": True,
             "blocked": [f"b{index}"] if index else [], "epochs": 3, "error_output_records": index + 1,
             "error_outputs": {"c/fh": {"path": "/x/fherr.jsonl", "records": index + 1}}}))
    merged = merge_reports([tmp_path / "w0.json", tmp_path / "w1.json"], elapsed=3.0)
    assert merged["error_output_records"] == 3
    assert merged["error_outputs"] == {"c/fh": {"path": "/x/fherr.jsonl", "records": 3}}
    summary_table(merged, title="egress run --processes 2")  # every row the table shows is there
    assert (merged["rows_read"], merged["delivered"], merged["epochs"]) == (15, 15, 6)
    assert merged["responses"] == {"200": 10, "503": 5}
    assert merged["blocked"] == ["b1"]
    assert merged["drained"] is True
    assert merged["messages_per_second"] == 5.0
    assert merge_reports([tmp_path / "missing.json"], elapsed=1.0)["drained"] is False


def test_the_runs_exit_code_is_the_most_serious_of_its_childrens() -> None:
    assert exit_code([0, 0]) == 0
    assert exit_code([0, 130]) == 130
    assert exit_code([130, 1]) == 1
    assert exit_code([1, 2]) == 2
    assert exit_code([0, -9]) == 1
