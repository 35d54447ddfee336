"""Spec and DynamicSpec files: YSON, YAML and JSON load alike; seed 000's fragments load as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.errors import SpecError
from egress.runtime import load_plan
from egress.spec import load_document, load_dynamic_spec
from egress.spec.loader import parse_text
from tests.conftest import REPO

DATA = REPO / "tests" / "data"


def test_seed_000_sink_block_loads_unchanged_inside_a_full_spec() -> None:
    plan = load_plan(DATA / "seed000_spec.yson")
    sink = plan.computations["to_http"].sinks["http"]
    assert sink.parameters == AsyncHttpSinkParameters(
        url="https://receiver.example/api/events", payload_column="payload",
        headers={"Content-Type": "application/octet-stream"}, idempotency_header="Idempotency-Key",
        keep_alive=True, max_redirect_count=0, max_idle_connections=8)
    fragment = load_document(DATA / "seed000_computations_fragment.yson")
    full = load_document(DATA / "seed000_spec.yson")
    assert fragment["computations"]["<computation>"]["sinks"] == full["computations"]["to_http"]["sinks"]


def test_seed_000_dynamic_fragment_parses_to_the_documented_defaults() -> None:
    fragment = load_document(DATA / "seed000_dynamic_fragment.yson")
    parameters = fragment["computations"]["<computation>"]["sinks"]["<sink>"]["parameters"]
    assert AsyncHttpSinkDynamicParameters.model_validate(parameters) == AsyncHttpSinkDynamicParameters()
    dynamic = load_dynamic_spec(DATA / "seed000_dynamic_fragment.yson")
    assert dynamic.sink_parameters("<computation>", "<sink>")["max_attempt_count"] == 5


def test_yson_yaml_and_json_give_the_same_spec(tmp_path: Path) -> None:
    document = load_document(DATA / "seed000_spec.yson")
    (tmp_path / "requests.csv").write_text("payload\nx\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "spec.json").write_text(json.dumps(document))
    assert load_document(tmp_path / "spec.yaml") == document == load_document(tmp_path / "spec.json")
    assert load_plan(tmp_path / "spec.yaml").spec == load_plan(tmp_path / "spec.json").spec


def test_yson_booleans_and_entities_become_plain_python(tmp_path: Path) -> None:
    path = tmp_path / "d.yson"
    path.write_text('{"a" = %true; "b" = #; "c" = 5; "d" = [1; "x"]}')
    assert load_document(path) == {"a": True, "b": None, "c": 5, "d": [1, "x"]}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("spec.toml", "", "unknown spec format '.toml'"),
        ("spec.yaml", "a: [1, 2", "does not parse as YAML"),
        ("spec.json", "{", "does not parse as JSON"),
        ("spec.yson", "{a = ", "does not parse as YSON"),
        ("spec.yaml", "- 1\n- 2\n", "the top level must be a map, got list"),
    ],
)
def test_unreadable_files_name_the_file_and_the_problem(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_document(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.yaml: file not found"):
        load_document(tmp_path / "nope.yaml")


def test_a_directory_is_named_as_one_with_the_spec_files_in_it(tmp_path: Path) -> None:
    """Was "unknown spec format '(no extension)'" for ``egress validate examples/http_delivery``."""
    (tmp_path / "spec.yaml").write_text("pipeline: p\n")
    (tmp_path / "dynamic_spec.yaml").write_text("{}\n")
    (tmp_path / "functions.py").write_text("")
    with pytest.raises(SpecError) as raised:
        load_document(tmp_path)
    assert str(raised.value) == (f"{tmp_path}: is a directory: name the Spec file in it "
                                 "(there: dynamic_spec.yaml, spec.yaml)")


def test_a_yaml_syntax_error_names_the_offending_tab_and_the_line() -> None:
    with pytest.raises(SpecError) as caught:
        parse_text(b"a:\n\tb: 1\n", ".yaml")
    assert caught.value.message == ("does not parse as YAML: while scanning for the next token found character "
                                    "'\\t' that cannot start any token line 2, column 1: b: 1 ^")


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".yson"])
def test_a_byte_that_is_not_utf8_is_named_with_its_line_column_and_the_fix(tmp_path: Path, suffix: str) -> None:
    spec = tmp_path / f"spec{suffix}"
    spec.write_bytes({".yaml": b'pipeline: p\nname: "caf\xe9"\n', ".json": b'{"pipeline": "p",\n "name": "caf\xe9"}',
                      ".yson": b'pipeline = p;\nname = "caf\xe9"'}[suffix])
    column = {".yaml": 11, ".json": 14, ".yson": 12}[suffix]
    with pytest.raises(SpecError) as caught:
        load_document(spec)
    byte = spec.read_bytes().index(0xe9) + 1
    assert str(caught.value) == (f"{spec}: the byte 0xe9 at line 2, column {column} (byte {byte} of the file) "
                                 "is not UTF-8: save the file as UTF-8")


def test_a_json_spec_in_utf16_with_its_byte_order_mark_still_loads(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_bytes('{"pipeline": "café"}'.encode("utf-16"))
    assert load_document(spec) == {"pipeline": "café"}
