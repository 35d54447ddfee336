"""``egress run`` says how to go on after a run stopped by a bad source record, a replaced input file
or a raising process function, and each way on it names works (the CLI in process, a real pipeline
on SQLite)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import BAD_RECORD_FIX, PROCESS_FUNCTION_FIX, app
from egress.connectors.sources.identity import CHANGED_FILE_FIX
from egress.runtime.options import RunOptions
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


BAD_LINE = RunOptions().source_chunk + 405  # past the first chunk, which is committed before the bad record
BAD = b'{oops\n'


def bad_record_spec(tmp_path: Path, **parameters: Any) -> tuple[Path, Path]:
    """The payload pipeline without a sink, its source's line BAD_LINE not JSON; ``parameters`` added
    to the source's. Returns ``(spec, data file)``."""
    rows = [f"p{i}" for i in range(BAD_LINE + 500)]
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", rows)
    data = tmp_path / "payloads.jsonl"
    lines = data.read_bytes().splitlines(keepends=True)
    lines[BAD_LINE - 1] = BAD
    data.write_bytes(b"".join(lines))
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"] = {}
    document["sources"]["events_jsonl"]["parameters"].update(parameters)
    spec.write_text(yaml.safe_dump(document))
    return spec, data


def with_source_parameters(spec: Path, **parameters: Any) -> Path:
    document = yaml.safe_load(spec.read_text())
    document["sources"]["events_jsonl"]["parameters"].update(parameters)
    changed = spec.with_name(f"spec-{'-'.join(parameters)}.yaml")
    changed.write_text(yaml.safe_dump(document))
    return changed


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_after_a_bad_record_skip_with_the_file_as_it_is_goes_on(tmp_path: Path) -> None:
    spec, data = bad_record_spec(tmp_path)
    state = tmp_path / "state"
    code, printed = run_cli(spec, state)
    assert code == 1
    assert f"{data}:{BAD_LINE}: not valid JSON" in printed
    assert one_line(BAD_RECORD_FIX) in one_line(printed)
    assert run_cli(with_source_parameters(spec, on_bad_record="skip"), state) == (0, "")


def test_after_a_bad_record_a_correction_within_the_same_file_resumes(tmp_path: Path) -> None:
    spec, data = bad_record_spec(tmp_path)
    state = tmp_path / "state"
    assert run_cli(spec, state)[0] == 1
    inode = data.stat().st_ino
    with data.open("r+b") as file:  # the record rewritten where it is, as BAD_RECORD_FIX says
        file.seek(data.read_bytes().index(BAD))
        file.write(b"[1,2]\n")
    assert data.stat().st_ino == inode
    code, printed = run_cli(spec, state)
    assert code == 1  # read on from the committed position: the corrected line is a record, not of the schema
    assert f"{data}:{BAD_LINE}: expected a JSON object" in printed


def test_a_replaced_file_is_refused_naming_only_ways_on_that_work(tmp_path: Path) -> None:
    """``sed -i.bak``: the bad record fixed in a new file, the read one kept as FILE.bak. Neither
    ``on_bad_record`` nor ``follow: true`` resumes it; putting the read file back does."""
    spec, data = bad_record_spec(tmp_path)
    state = tmp_path / "state"
    assert run_cli(spec, state)[0] == 1
    backup = data.with_name(data.name + ".bak")
    os.rename(data, backup)
    data.write_bytes(backup.read_bytes().replace(BAD, b'{"id": 1, "payload": "fixed"}\n'))
    code, printed = run_cli(spec, state)
    assert code == 1
    assert one_line(f"{data}: source 'events_jsonl' already read {BAD_LINE - 1:,} record(s) of this path, but the "
                    "file was replaced (another inode) since; refusing to resume by record number, which would skip "
                    "new rows: "
                    f"{CHANGED_FILE_FIX}") in one_line(printed)
    assert "follow" not in printed
    assert "on_bad_record" not in printed
    for parameters in ({"on_bad_record": "skip"}, {"follow": True}):  # what the refusal does not offer: refused too
        code, printed = run_cli(with_source_parameters(spec, **parameters), state)
        assert code == 1
        assert "--state-dir" in printed
    os.replace(backup, data)  # mv FILE.bak FILE
    assert run_cli(with_source_parameters(spec, on_bad_record="skip"), state) == (0, "")
