"""Invalid specs: one clear line per problem, naming the file and the path inside it."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import app
from egress.clock import VirtualClock
from egress.errors import SpecErrors
from egress.observe import StatusTree
from egress.runtime import load_plan
from egress.runtime.dynamic_spec import DynamicSpecFile
from egress.spec import DynamicSpec
from tests.conftest import REPO

BASE: dict[str, Any] = {
    "pipeline": "checks",
    "streams": {
        "lines": {"schema": [{"name": "payload", "type": "string"}]},
        "requests": {"schema": [{"name": "payload", "type": "string"}]},
    },
    "sources": {"lines_csv": {"source_class_name": "csv", "output_stream_id": "lines",
                              "parameters": {"path": "lines.csv"}}},
    "computations": {"to_json": {
        "processing_function": "tests.pipelines:Passthrough",
        "input_stream_ids": ["lines"],
        "output_stream_ids": ["requests"],
        "sinks": {"http": {"sink_class_name": "NYT::NFlow::TAsyncHttpSink", "input_stream_ids": ["requests"],
                           "parameters": {"url": "http://127.0.0.1:9/events", "payload_column": "payload"}}},
    }},
}
SINK = ("computations", "to_json", "sinks", "http")


def write(tmp_path: Path, spec: dict[str, Any], dynamic: dict[str, Any] | None = None) -> tuple[Path, Path | None]:
    (tmp_path / "lines.csv").write_text("payload\na\n")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    dynamic_path = None
    if dynamic is not None:
        dynamic_path = tmp_path / "dynamic.yaml"
        dynamic_path.write_text(yaml.safe_dump(dynamic))
    return spec_path, dynamic_path


def mutated(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    node = spec
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return spec


_DELETE = object()

CASES = [
    pytest.param((*SINK, "sink_class_name"), "TNoSuchSink",
                 "computations/to_json/sinks/http/sink_class_name: No sink class \"TNoSuchSink\" is registered",
                 id="unknown-sink-class"),
    pytest.param((*SINK, "parameters", "url"), _DELETE,
                 "computations/to_json/sinks/http/parameters/url: required field is missing", id="missing-url"),
    pytest.param((*SINK, "parameters", "url"), "ftp://example.org/x",
                 "computations/to_json/sinks/http/parameters/url: "
                 "Async HTTP sink URL must use http or https and contain a host", id="ftp-url"),
    pytest.param(("computations", "to_json", "input_stream_ids"), ["flights"],
                 'computations/to_json/input_stream_ids/0: unknown stream id "flights"', id="unknown-stream"),
    pytest.param(("sources", "lines_csv", "parameters", "path"), "missing.csv.gz",
                 "sources/lines_csv/parameters/path: file not found", id="unknown-source-file"),
    pytest.param(("sources", "lines_csv", "source_class_name"), "parquet",
                 'sources/lines_csv/source_class_name: No source class "parquet" is registered; '
                 "registered: NYT::NFlow::THttpSource, NYT::NFlow::TNatsSource, csv, http, jsonl, lines, nats",
                 id="unknown-source-class"),
    pytest.param(("computations", "to_json", "computation_class_name"), "TNope",
                 'computations/to_json/computation_class_name: No computation class "TNope" is registered; '
                 "registered: NYT::NFlow::TProcessFunctionComputation, process_function",
                 id="unknown-computation-class"),
    pytest.param(("computations", "to_json", "processing_function"), "tests.pipelines:Nope",
                 'computations/to_json/processing_function: module "tests.pipelines" has no class "Nope"',
                 id="unknown-function"),
    pytest.param(("streams", "requests", "schema"), [{"name": "payload", "type": "int64"}],
                 'computations/to_json/sinks/http/parameters/payload_column: Async HTTP sink payload column '
                 '"payload" must be the only String column: stream "requests" has the one column "payload" '
                 '(int64); make it a string column', id="payload-not-string"),
    pytest.param(("computations", "to_json", "sinks", "http", "input_stream_ids"), ["lines"],
                 'computations/to_json/sinks/http/input_stream_ids/0: stream "lines" is not an output stream',
                 id="sink-reads-input-stream"),
    pytest.param(("streams", "lines", "colour"), "red", "streams/lines/colour: unknown field", id="typo-field"),
    pytest.param(("streams", "lines", "schemas"), [], "streams/lines/schemas: unknown field; did you mean 'schema'?",
                 id="typo-field-suggested"),
    pytest.param(("computations", "to_json", "sinks", "http", "parameters", "payload_colum"), "payload",
                 "computations/to_json/sinks/http/parameters/payload_colum: unknown field; did you mean "
                 "'payload_column'?", id="typo-sink-parameter-suggested"),
    pytest.param((*SINK, "parameters", "max_attempt_count"), 3,
                 "computations/to_json/sinks/http/parameters/max_attempt_count: max_attempt_count is a DynamicSpec "
                 "parameter: put it under computations/to_json/sinks/http/parameters in the DynamicSpec file "
                 "(egress run --dynamic-spec FILE), where it applies without a restart",
                 id="retry-parameter-in-the-spec"),
    pytest.param((*SINK, "parameters", "request_timeout"), "10s",
                 "computations/to_json/sinks/http/parameters/request_timeout: request_timeout is a DynamicSpec "
                 "parameter: put it under computations/to_json/sinks/http/parameters in the DynamicSpec file",
                 id="request-timeout-in-the-spec"),
    pytest.param(("computations", "to_json", "input_rows_throttler_id"), "rows",
                 "computations/to_json/input_rows_throttler_id: input_rows_throttler_id is a DynamicSpec field: put "
                 "it under computations/to_json in the DynamicSpec file", id="throttler-id-in-the-spec"),
    pytest.param(("throttlers",), {}, "throttlers: throttlers is a DynamicSpec field: put it at the top level in the "
                 "DynamicSpec file", id="throttlers-in-the-spec"),
    pytest.param(("streams", "lines", "group_by"), "payload",
                 "streams/lines/group_by: group_by must be a list (the names of the columns whose values form the "
                 "key), got the string 'payload': write it as a list: [payload]", id="group-by-not-a-list"),
    pytest.param(("partition_count",), 0,
                 "partition_count: partition_count must be at least 1 (the number of partitions of the "
                 "computation), got 0", id="partition-count-zero"),
    pytest.param(("partition_count",), 5000,
                 "partition_count: partition_count must be at most 4096 (the number of partitions of the "
                 "computation), got 5000", id="partition-count-too-high"),
    pytest.param(("computations", "to_json", "input_stream_ids"), [],
                 "computations/to_json/input_stream_ids: input_stream_ids must not be empty (the ids of the streams "
                 "it reads)", id="no-input-streams"),
    pytest.param(("streams", "lines", "schema", 0, "type"), "float",
                 "streams/lines/schema/0/type: type must be 'string', 'int64', 'double' or 'boolean', got the "
                 "string 'float'", id="unknown-column-type"),
    pytest.param(("streams",), ["lines"], "streams: streams must be a map of 'name: value' entries, got a list",
                 id="streams-not-a-map"),
    pytest.param(("streams", "requests", "schema"), [{"name": "payload", "type": "string"},
                                                     {"name": "extra", "type": "string"}],
                 "computations/to_json/sinks/http/parameters/payload_column: Async HTTP sink expects exactly one "
                 "payload column, got 2", id="two-columns"),
    pytest.param(("sources", "lines_csv", "output_stream_id"), ["lines"],
                 "sources/lines_csv/output_stream_id: expected a string, got a list: write one value here, not a list",
                 id="list-for-a-string"),
    pytest.param(("streams", "lines", "schema"), [{"name": "line", "type": "string"}, {"name": "n", "type": "int64"},
                                                  {"name": "line", "type": "int64"}],
                 'streams/lines/schema: column "line" is named twice (schema/0 and schema/2): rename or remove one',
                 id="column-named-twice"),
    pytest.param(("streams", "requests", "schema"), [{"name": "body", "type": "string"}],
                 'computations/to_json/sinks/http/parameters/payload_column: Async HTTP sink payload column '
                 '"payload" must be the only String column: stream "requests" has the one column "body" (string); set '
                 'payload_column to "body" or rename the column', id="column-name-mismatch"),
]


@pytest.mark.parametrize(("path", "value", "expected"), CASES)
def test_invalid_spec_names_file_and_path(tmp_path: Path, path: tuple[str, ...], value: Any, expected: str) -> None:
    spec_path, _ = write(tmp_path, mutated(path, value))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    lines = str(raised.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{spec_path}: {expected}")


def test_unparseable_duration_in_the_dynamic_spec_names_that_file(tmp_path: Path) -> None:
    spec_path, dynamic_path = write(tmp_path, BASE, {"computations": {"to_json": {"sinks": {"http": {
        "parameters": {"request_timeout": "10 parsecs"}}}}}})
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path, dynamic_path)
    assert str(raised.value) == (
        f"{dynamic_path}: computations/to_json/sinks/http/parameters/request_timeout: cannot parse duration "
        "'10 parsecs': write a duration like 100ms, 10s, 1m, 1h or an integer number of milliseconds")


@pytest.mark.parametrize(("dynamic", "expected"), [
    pytest.param({"computations": {"to_json": {"sinks": {"http": {"parameters": {"url": "http://127.0.0.1:9/"}}}}}},
                 "computations/to_json/sinks/http/parameters/url: url is a Spec parameter: put it under "
                 "computations/to_json/sinks/http/parameters in the Spec file (read once, when egress run starts)",
                 id="sink-url"),
    pytest.param({"computations": {"to_json": {"processing_function": "tests.pipelines:Passthrough"}}},
                 "computations/to_json/processing_function: processing_function is a Spec field: put it under "
                 "computations/to_json in the Spec file", id="processing-function"),
    pytest.param({"partition_count": 2}, "partition_count: partition_count is a Spec field: put it at the top level "
                 "in the Spec file", id="partition-count"),
    pytest.param({"computations": {"to_json": {"sinks": {"http": {"parameters": {"max_attempt_count": 0}}}}}},
                 "computations/to_json/sinks/http/parameters/max_attempt_count: max_attempt_count must be at least 1, "
                 "got 0", id="retry-bound"),
    pytest.param({"computations": {"to_json": {"sinks": {"http": {"parameters": {"request_timeout": 0}}}}}},
                 "computations/to_json/sinks/http/parameters/request_timeout: request_timeout must be more than 0s, "
                 "got 0s", id="duration-bound"),
])
def test_a_spec_field_in_the_dynamic_spec_says_where_it_belongs(tmp_path: Path, dynamic: dict[str, Any],
                                                                 expected: str) -> None:
    spec_path, dynamic_path = write(tmp_path, BASE, dynamic)
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path, dynamic_path)
    lines = str(raised.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{dynamic_path}: {expected}")


def test_a_sink_with_two_input_streams_is_rejected(tmp_path: Path) -> None:
    spec = copy.deepcopy(BASE)
    spec["streams"]["other"] = {"schema": [{"name": "payload", "type": "string"}]}
    spec["computations"]["to_json"]["output_stream_ids"] = ["requests", "other"]
    spec["computations"]["to_json"]["sinks"]["http"]["input_stream_ids"] = ["requests", "other"]
    spec_path, _ = write(tmp_path, spec)
    with pytest.raises(SpecErrors, match="computations/to_json/sinks/http/input_stream_ids: Async HTTP sink "
                                         "expects exactly one input stream, got 2"):
        load_plan(spec_path)


def test_dynamic_spec_naming_an_unknown_sink_is_an_error(tmp_path: Path) -> None:
    spec_path, dynamic_path = write(tmp_path, BASE, {"computations": {"to_json": {"sinks": {"htp": {}}}}})
    with pytest.raises(SpecErrors, match='computations/to_json/sinks/htp: unknown sink "htp"'):
        load_plan(spec_path, dynamic_path)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    spec = mutated((*SINK, "parameters", "url"), "ftp://x")
    spec["sources"]["lines_csv"]["parameters"]["path"] = "nope.csv"
    spec_path, _ = write(tmp_path, spec)
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    assert len(raised.value.errors) == 2


@pytest.mark.parametrize(("path", "value", "expected"), CASES[:6])
def test_cli_prints_one_line_and_writes_no_state(tmp_path: Path, path: tuple[str, ...], value: Any,
                                                  expected: str) -> None:
    spec_path, _ = write(tmp_path, mutated(path, value))
    state = tmp_path / "state"
    for command in (["validate", str(spec_path)], ["run", str(spec_path), "--state-dir", str(state)]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert expected in lines[0]
    assert not state.exists()


def test_cli_validate_accepts_the_example(tmp_path: Path) -> None:
    example = REPO / "examples" / "http_delivery"
    result = CliRunner().invoke(app, ["validate", str(example / "spec.yaml"), "--dynamic-spec",
                                      str(example / "dynamic_spec.yaml")])
    assert result.exit_code == 0, result.output
    assert "valid pipeline 'flights_to_webhook'" in result.output


@pytest.mark.parametrize(("source", "expected"), [
    pytest.param("import egress_no_such_dependency\n",
                 'importing module "{module}" failed: ModuleNotFoundError: No module named '
                 "'egress_no_such_dependency' at {file}:1; install egress_no_such_dependency or remove the import",
                 id="missing-dependency"),
    pytest.param("import yaml.egress_no_such_sub\n",
                 'importing module "{module}" failed: ModuleNotFoundError: No module named '
                 "'yaml.egress_no_such_sub' at {file}:1; module yaml (installed) has no submodule "
                 "egress_no_such_sub: correct the import or remove it", id="missing-submodule"),
    pytest.param("x = 1\ndef broken(:\n",
                 'module "{module}" has a syntax error: invalid syntax at {file}:2; fix the file', id="syntax-error"),
    pytest.param("import os\nraise RuntimeError('no API key')\n",
                 'importing module "{module}" failed: RuntimeError: no API key at {file}:2', id="raises-at-import"),
])
def test_a_function_module_that_fails_at_import_reports_the_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, source: str,
        expected: str) -> None:
    module = f"egress_user_{request.node.callspec.id.replace('-', '_')}"  # fresh: not in sys.modules
    module_file = tmp_path / f"{module}.py"
    module_file.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_path, _ = write(tmp_path, mutated(("computations", "to_json", "processing_function"), f"{module}:Fn"))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    (line,) = str(raised.value).splitlines()
    message = expected.format(module=module, file=module_file)
    assert line == f"{spec_path}: computations/to_json/processing_function: {message}"
    assert "folder that contains" not in line


def test_a_function_module_not_on_the_import_path_gets_the_folder_hint(tmp_path: Path) -> None:
    spec_path, _ = write(tmp_path, mutated(("computations", "to_json", "processing_function"),
                                           "egress_nowhere.pipeline:Fn"))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    assert str(raised.value) == (
        f'{spec_path}: computations/to_json/processing_function: cannot import module "egress_nowhere.pipeline" '
        "(ModuleNotFoundError: No module named 'egress_nowhere'); run egress from the folder that contains the "
        "package, or install it")


def test_a_function_class_that_needs_constructor_arguments_fails_validation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_file = tmp_path / "egress_user_needs_x.py"
    module_file.write_text("import egress\nclass F(egress.ProcessFunction):\n    def __init__(self, x):\n"
                           "        self.x = x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_path, _ = write(tmp_path, mutated(("computations", "to_json", "processing_function"),
                                           "egress_user_needs_x:F"))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    assert str(raised.value) == (
        f"{spec_path}: computations/to_json/processing_function: class F ({module_file}) cannot be constructed "
        "as egress does, with no arguments: missing a required argument: 'x'; give its __init__ parameters "
        "defaults, or take them as processing_function_parameters (ctx.parameters in init)")


def test_a_function_class_with_defaulted_constructor_arguments_validates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "egress_user_default_x.py").write_text(
        "import egress\nclass F(egress.ProcessFunction):\n    def __init__(self, x=1, *rest, **named):\n"
        "        self.x = x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_path, _ = write(tmp_path, mutated(("computations", "to_json", "processing_function"),
                                           "egress_user_default_x:F"))
    assert load_plan(spec_path).computations["to_json"].function_class.__name__ == "F"


@pytest.mark.parametrize(("reference", "side"), [("tests.pipelines:Passthrough ", "a trailing"),
                                                 (" tests.pipelines:Passthrough", "a leading")])
def test_a_space_around_the_function_reference_is_named(tmp_path: Path, reference: str, side: str) -> None:
    spec_path, _ = write(tmp_path, mutated(("computations", "to_json", "processing_function"), reference))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    assert str(raised.value) == (f"{spec_path}: computations/to_json/processing_function: {reference!r} has "
                                 f"{side} space: remove it")


def test_a_function_parameter_written_under_the_computation_belongs_under_its_parameters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "egress_user_with_model.py").write_text(
        "import pydantic, egress\nclass P(pydantic.BaseModel):\n    greeting: str = 'hi'\n"
        "class F(egress.ProcessFunction):\n    parameters_model = P\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = mutated(("computations", "to_json", "processing_function"), "egress_user_with_model:F")
    spec["computations"]["to_json"]["greeting"] = "hello"
    spec_path, _ = write(tmp_path, spec)
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    assert str(raised.value) == (f"{spec_path}: computations/to_json/greeting: greeting belongs under "
                                 "computations/to_json/processing_function_parameters")


def test_a_reloaded_dynamic_spec_places_a_sink_parameter_and_refuses_a_duplicate_key(tmp_path: Path) -> None:
    spec_path, dynamic_path = write(tmp_path, BASE, {"computations": {"to_json": {"sinks": {"http": {
        "parameters": {"max_attempt_count": 3}}}}}})
    assert dynamic_path is not None
    plan = load_plan(spec_path, dynamic_path)
    applied: list[DynamicSpec] = []
    watched = DynamicSpecFile(lambda: plan, lambda _plan, dynamic: applied.append(dynamic), StatusTree(),
                              clock=VirtualClock(), period=1.0, stop=asyncio.Event())
    dynamic_path.write_text("computations:\n  to_json:\n    sinks:\n      http:\n        max_attempt_count: 3\n")
    assert not watched.reload()
    assert watched.error == (f"ignored, the previous DynamicSpec stays in force: {dynamic_path}: "
                             "computations/to_json/sinks/http/max_attempt_count: max_attempt_count belongs under "
                             "computations/to_json/sinks/http/parameters")
    dynamic_path.write_text("computations:\n  to_json:\n    sinks:\n      http:\n        parameters:\n"
                            "          max_attempt_count: 3\n          max_attempt_count: 4\n")
    assert not watched.reload()
    assert watched.error is not None
    assert "written twice (lines 6 and 7)" in watched.error
    assert applied == []


@pytest.mark.parametrize(("throttler", "problem"), [
    ({"limit": -5, "period": "1s"}, "throttlers/api/limit"),
    ({"limit": 10, "period": "1s", "classes": {"gold": {"weight": 1}}, "bogus": 1}, "throttlers/api/bogus"),
    ({"limit": float("nan"), "period": "1s"},
     "throttlers/api/limit: limit must be a finite number, got the number nan: write a number, not .nan or .inf"),
])
def test_a_wrong_throttler_is_one_problem_not_also_a_missing_one_for_the_sink_that_names_it(
        tmp_path: Path, throttler: dict[str, Any], problem: str) -> None:
    from egress.errors import SpecErrors
    from egress.runtime import load_plan
    from tests.conftest import payload_spec

    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["p"],
                                 sink_parameters={"throttler_id": "api"})
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"api": throttler}
    dynamic.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec, dynamic)
    lines = str(raised.value).splitlines()
    assert any(problem in line for line in lines), lines
    assert not any("is not configured" in line for line in lines), lines
