"""``egress run`` and ``egress validate --state-dir`` with a Spec whose layout is not the one the
state directory was written with: exit code 2 and one line naming the change."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import app
from egress.engines import EpochCommit, SqliteEngine
from egress.runtime import Pipeline, load_plan
from egress.runtime.layout import LAYOUT_KEY, spec_layout
from tests.conftest import payload_spec

PAYLOADS = [f"p{i}" for i in range(40)]


def spec_without_sinks(tmp_path: Path, partition_count: int) -> Path:
    """tests/conftest.py's payload pipeline without its HTTP sink (nothing to serve)."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", PAYLOADS, partition_count=partition_count)
    document: dict[str, Any] = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"] = {}
    spec.write_text(yaml.safe_dump(document))
    return spec


def written_with(tmp_path: Path, partition_count: int, *, log: bool = False) -> Path:
    """A state directory that recorded the layout of ``spec_without_sinks(partition_count)``; with
    ``log``, holding the whole source in the log, read by no computation yet."""
    state = tmp_path / "state"
    plan = load_plan(spec_without_sinks(tmp_path, partition_count))

    async def write() -> None:
        engine = SqliteEngine(state, plan.spec.pipeline)
        await engine.open()
        await engine.write_meta(LAYOUT_KEY, orjson.dumps(spec_layout(plan)).decode())
        if log:
            generation = await engine.acquire("source:events_jsonl", 0)
            appends = [("events", i % partition_count, f"m{i}".encode(), f"[{i}]".encode(), None,
                        {"id": i, "payload": p}) for i, p in enumerate(PAYLOADS)]
            await engine.commit(EpochCommit("source:events_jsonl", 0, generation, {("", 0): len(PAYLOADS)},
                                            log_appends=appends))
        await engine.close()

    asyncio.run(write())
    return state


def lines_of(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(("recorded", "now"), [(4, 2), (2, 4)])
def test_run_refuses_a_changed_partition_count_with_exit_code_2_and_one_line(
        tmp_path: Path, recorded: int, now: int) -> None:
    state = written_with(tmp_path, recorded)
    spec = spec_without_sinks(tmp_path, now)
    result = CliRunner().invoke(app, ["run", str(spec), "--state-dir", str(state), "--until-drained", "--quiet"])
    assert result.exit_code == 2, result.output
    assert lines_of(result.output) == [
        f"{spec}: state directory {state} was written with partition_count {recorded}; the Spec now says {now}: "
        "everything committed there is already delivered, but this Spec cannot take over its state and source "
        "positions: give this Spec another --state-dir (its sources are then read from the start), or keep running "
        "the Spec it was written with"]  # drained (a Spec without sinks): no advice to drain it


def test_validate_with_a_state_dir_reports_the_mismatch_without_running(tmp_path: Path) -> None:
    state = written_with(tmp_path, 4)
    spec = spec_without_sinks(tmp_path, 2)
    refused = CliRunner().invoke(app, ["validate", str(spec), "--state-dir", str(state)])
    assert refused.exit_code == 2, refused.output
    assert lines_of(refused.output) == [
        f"{spec}: state directory {state} was written with partition_count 4; the Spec now says 2: run it with the "
        "Spec it was written with until drained, or give this Spec another --state-dir (egress does not move "
        "committed messages, state and timers to another layout)"]
    spec = spec_without_sinks(tmp_path, 4)
    accepted = CliRunner().invoke(app, ["validate", str(spec), "--state-dir", str(state)])
    assert accepted.exit_code == 0, accepted.output
    assert lines_of(accepted.output)[-1] == f"state directory {state} was written with this Spec's layout"
    fresh = CliRunner().invoke(app, ["validate", str(spec), "--state-dir", str(tmp_path / "new")])
    assert fresh.exit_code == 0, fresh.output
    assert lines_of(fresh.output)[-1] == f"state directory {tmp_path / 'new'} holds no committed state yet"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", [["validate"], ["run", "--until-drained", "--quiet"]])
def test_a_state_dir_of_another_pipeline_is_refused_with_exit_code_2_and_one_line(
        tmp_path: Path, command: list[str]) -> None:
    state = written_with(tmp_path, 4)
    spec = spec_without_sinks(tmp_path, 4)
    document = yaml.safe_load(spec.read_text())
    document["pipeline"] = "another"
    spec.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, [command[0], str(spec), "--state-dir", str(state), *command[1:]])
    assert result.exit_code == 2, result.output
    assert lines_of(result.output) == [
        f"{spec}: state directory {state} belongs to pipeline 'test_pipeline', not 'another': give this "
        "Spec another --state-dir"]


def test_run_never_reports_drained_while_committed_messages_are_out_of_reach(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = written_with(tmp_path, 4, log=True)

    async def bypassed(self: Pipeline, engine: object) -> None:
        return None

    monkeypatch.setattr(Pipeline, "_check_state_directory", bypassed)
    spec = spec_without_sinks(tmp_path, 2)
    result = CliRunner().invoke(app, ["run", str(spec), "--state-dir", str(state), "--until-drained", "--quiet"])
    assert result.exit_code == 2, result.output
    assert lines_of(result.output) == [
        f"unreachable in state directory {state}: stream events partition 2: 10 committed messages no job of this "
        "Spec reads (partition_count is 2)",
        f"unreachable in state directory {state}: stream events partition 3: 10 committed messages no job of this "
        "Spec reads (partition_count is 2)",
        f"not drained: this Spec cannot reach committed work in state directory {state}; run it with the Spec it was "
        "written with until drained, or give this Spec another --state-dir (egress does not move committed messages, "
        "state and timers to another layout)",
    ]
