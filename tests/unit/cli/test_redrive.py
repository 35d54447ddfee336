"""``egress redrive`` refuses what it cannot do with one line naming the fix (exit code 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from egress.cli.main import app
from egress.connectors.base import SINKS
from egress.connectors.dead_letters import (
    Attempt,
    DeadLetter,
    decode_dead_letter,
    encode_dead_letter,
    encode_redriven,
    redrive_record_path,
)
from egress.spec import StreamSpec
from tests.conftest import payload_spec


class _Nothing(BaseModel):
    pass


@SINKS.register("tests.counting_sink")
class CountingSink:
    """A sink that is not an HTTP sink (it has no redrive_progress); it is never created here."""

    parameters_model: ClassVar[type[BaseModel]] = _Nothing
    dynamic_parameters_model: ClassVar[type[BaseModel]] = _Nothing

    @classmethod
    def check(cls, parameters: Any, input_streams: dict[str, StreamSpec]) -> list[Any]:
        return []


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", [])
    document = yaml.safe_load(path.read_text())
    document["computations"]["deliver"]["sinks"]["count"] = {
        "sink_class_name": "tests.counting_sink", "input_stream_ids": ["requests"], "parameters": {}}
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def dead(tmp_path: Path) -> Path:
    path = tmp_path / "dead.jsonl"
    path.write_bytes(encode_dead_letter(DeadLetter("deliver", "http", 0, 1, b"m", "6D", b"x", (Attempt(1.0, 503),),
                                                   "exhausted", 2.0)))
    return path


def redrive(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["redrive", *arguments])
    return result.exit_code, result.output


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_a_missing_dead_letter_file_is_named_with_the_fix(tmp_path: Path, spec: Path) -> None:
    code, output = redrive(str(tmp_path / "nope.jsonl"), str(spec), "--sink", "deliver/http")
    assert code == 2
    assert one_line(output) == (f"egress redrive: {tmp_path / 'nope.jsonl'}: no such dead-letter file: give the "
                                "file the sink's dead_letter_path names (a relative dead_letter_path starts at the "
                                "Spec's folder, this path at the current folder)")


@pytest.mark.parametrize("name", ["deliver/htp", "nowhere/http", "deliver"])
def test_an_unknown_sink_lists_the_http_sinks(dead: Path, spec: Path, name: str) -> None:
    code, output = redrive(str(dead), str(spec), "--sink", name)
    assert code == 2
    assert one_line(output) == (f"egress redrive: --sink {name}: no such sink in {spec}; give COMPUTATION/SINK, "
                                "one of: deliver/http")


def test_a_sink_that_is_not_an_http_sink_is_refused(dead: Path, spec: Path) -> None:
    code, output = redrive(str(dead), str(spec), "--sink", "deliver/count")
    assert code == 2
    assert one_line(output) == ("egress redrive: --sink deliver/count is a CountingSink, not an HTTP sink: redrive "
                                "sends through an async_http, firehose_http, batching_http or webhook_http sink, "
                                "one of: deliver/http")


def test_a_line_that_is_not_a_dead_letter_is_named_with_its_number(dead: Path, spec: Path) -> None:
    dead.write_bytes(dead.read_bytes() + b'{"computation": "deliver"}\n')
    code, output = redrive(str(dead), str(spec), "--sink", "deliver/http")
    assert code == 2
    assert one_line(output).startswith(f"egress redrive: {dead}: line 2: not a dead letter (")


def test_an_invalid_spec_is_reported_as_by_validate(dead: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("pipeline: x\n")
    code, output = redrive(str(dead), str(broken), "--sink", "deliver/http")
    assert code == 2
    assert str(broken) in output


def test_an_incomplete_last_line_is_not_redriven_and_exits_1_with_the_fix(dead: Path, spec: Path) -> None:
    """A whole letter without its newline (cut by a crash before it, or edited by hand) is not read:
    the letters are not all sent, so the exit code is 1 and the output says how to fix the line."""
    dead.write_bytes(dead.read_bytes().rstrip(b"\n"))
    code, output = redrive(str(dead), str(spec), "--sink", "deliver/http")
    assert code == 1
    size = dead.stat().st_size
    assert output.splitlines()[0] == (f"redrive {dead} through deliver/http: 0 delivered, 0 already redriven, "
                                      f"0 failed, the incomplete last line ({size} bytes) not redriven")
    assert (f"the last {size} byte(s) of {dead} are not a complete line (cut by a crash, or being written now): "
            "not redriven; if that line is a whole letter, add the missing newline at its end and run egress "
            "redrive again") in output


def test_redrive_checks_only_the_named_sink_so_it_runs_from_any_folder(tmp_path: Path, dead: Path) -> None:
    """The process function cannot be imported here, the source's file and the Spec's own
    dead_letter_path folder are missing: none of them is needed to send through the sink."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", [], processing_function="nowhere.at_all:Function",
                           sink_parameters={"dead_letter_path": "not/here/dead.jsonl"})
    (tmp_path / "payloads.jsonl").unlink()
    redrive_record_path(dead).write_bytes(encode_redriven(decode_dead_letter(dead.read_bytes()), 3.0))
    code, output = redrive(str(dead), str(spec), "--sink", "deliver/http")
    assert (code, output.splitlines()[0]) == (0, f"redrive {dead} through deliver/http: 0 delivered, "
                                                 "1 already redriven, 0 failed")


def test_redrive_still_checks_the_parameters_of_the_named_sink(tmp_path: Path, dead: Path) -> None:
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", [], processing_function="nowhere:Function",
                                 dynamic_parameters={"max_attempt_count": 0})
    code, output = redrive(str(dead), str(spec), "--sink", "deliver/http", "--dynamic-spec", str(dynamic))
    assert code == 2
    assert one_line(output).startswith(f"{dynamic}: computations/deliver/sinks/http/parameters/max_attempt_count: ")
