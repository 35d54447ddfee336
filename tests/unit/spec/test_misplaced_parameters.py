"""A connector's or process function's parameter written beside ``parameters`` is said to belong
under it; misspellings get "did you mean" in either file, and without a "missing" line first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from egress.errors import SpecError
from egress.runtime import load_plan
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "http_delivery"


def _files(tmp_path: Path) -> tuple[Path, Path, dict, dict]:
    for name in ("spec.yaml", "dynamic_spec.yaml"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    dynamic = yaml.safe_load((tmp_path / "dynamic_spec.yaml").read_text())
    return tmp_path / "spec.yaml", tmp_path / "dynamic_spec.yaml", spec, dynamic


def _problems(spec_file: Path, dynamic_file: Path, spec: dict, dynamic: dict) -> list[str]:
    spec_file.write_text(yaml.safe_dump(spec))
    dynamic_file.write_text(yaml.safe_dump(dynamic))
    with pytest.raises(SpecError) as caught:
        load_plan(spec_file, dynamic_file)
    return str(caught.value).splitlines()


def test_a_spec_sink_parameter_beside_parameters_is_said_to_belong_under_them(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["computations"]["to_json"]["sinks"]["http"]["dead_letter_path"] = "dead.jsonl"
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{spec_file}: computations/to_json/sinks/http/dead_letter_path: dead_letter_path belongs under "
        "computations/to_json/sinks/http/parameters"]


def test_a_dynamic_parameter_beside_the_spec_sinks_parameters_names_the_dynamic_spec(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["computations"]["to_json"]["sinks"]["http"]["max_attempt_count"] = 3
    [problem] = _problems(spec_file, dynamic_file, spec, dynamic)
    assert problem.startswith(f"{spec_file}: computations/to_json/sinks/http/max_attempt_count: max_attempt_count "
                              "is a DynamicSpec parameter: put it under computations/to_json/sinks/http/parameters "
                              "in the DynamicSpec file")


def test_a_dynamic_spec_sink_parameter_beside_parameters_belongs_under_them(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    dynamic["computations"]["to_json"]["sinks"]["http"]["max_attempt_count"] = 3
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{dynamic_file}: computations/to_json/sinks/http/max_attempt_count: max_attempt_count belongs under "
        "computations/to_json/sinks/http/parameters"]


def test_a_static_sink_parameter_under_the_dynamic_spec_sink_names_the_spec(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    dynamic["computations"]["to_json"]["sinks"]["http"]["url"] = "http://x"
    [problem] = _problems(spec_file, dynamic_file, spec, dynamic)
    assert "url is a Spec parameter: put it under computations/to_json/sinks/http/parameters in the Spec" in problem


def test_a_sink_parameter_under_the_computation_names_the_sinks_parameters(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["computations"]["to_json"]["url"] = "http://x"
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{spec_file}: computations/to_json/url: url belongs under computations/to_json/sinks/http/parameters"]


def test_an_unknown_field_that_is_no_parameter_keeps_the_spelling_hint(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["computations"]["to_json"]["sinks"]["http"]["colour"] = 1
    [problem] = _problems(spec_file, dynamic_file, spec, dynamic)
    assert problem.endswith("colour: unknown field (check the spelling against the documentation)")


def test_a_misspelled_spec_parameter_in_the_dynamic_spec_gets_did_you_mean(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    dynamic["computations"]["to_json"]["sinks"]["http"]["parameters"]["payload_colum"] = "p"
    # Checked with the plan, where the copied Spec's relative source file is missing too.
    [problem] = [p for p in _problems(spec_file, dynamic_file, spec, dynamic) if "payload_colum" in p]
    assert problem.startswith(f"{dynamic_file}: computations/to_json/sinks/http/parameters/payload_colum: unknown "
                              "field; did you mean 'payload_column'? payload_column is a Spec parameter")


def test_a_misspelled_required_field_gets_only_did_you_mean(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    sink = spec["computations"]["to_json"]["sinks"]["http"]
    sink["sink_class_nam"] = sink.pop("sink_class_name")
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{spec_file}: computations/to_json/sinks/http/sink_class_nam: unknown field; did you mean "
        "'sink_class_name'?"]


def test_a_dynamic_sink_parameter_at_the_spec_top_level_names_the_sinks_parameters_in_the_dynamic_spec(
        tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["max_attempt_count"] = 3
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{spec_file}: max_attempt_count: max_attempt_count is a DynamicSpec parameter: put it under "
        "computations/to_json/sinks/http/parameters in the DynamicSpec file (egress run --dynamic-spec FILE), "
        "where it applies without a restart"]


def test_a_static_sink_parameter_at_the_spec_top_level_belongs_under_the_sinks_parameters(tmp_path: Path) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    spec["payload_column"] = "payload"
    assert _problems(spec_file, dynamic_file, spec, dynamic) == [
        f"{spec_file}: payload_column: payload_column belongs under computations/to_json/sinks/http/parameters"]


@pytest.mark.parametrize(("name", "value", "message"), [
    ("max_attempt_count", 3, "max_attempt_count belongs under computations/to_json/sinks/http/parameters"),
    ("url", "http://x", "url is a Spec parameter: put it under computations/to_json/sinks/http/parameters in the "
                        "Spec file"),
])
def test_a_sink_parameter_at_the_dynamic_spec_top_level_names_where_it_belongs(
        tmp_path: Path, name: str, value: object, message: str) -> None:
    spec_file, dynamic_file, spec, dynamic = _files(tmp_path)
    dynamic[name] = value
    [problem] = _problems(spec_file, dynamic_file, spec, dynamic)
    assert problem.startswith(f"{dynamic_file}: {name}: {message}")
