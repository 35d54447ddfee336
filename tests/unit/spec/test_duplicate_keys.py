"""A YAML mapping or a JSON object with a key written twice is refused (PyYAML and the stdlib
would keep one value and drop the other)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from egress.cli.main import app
from egress.errors import SpecError
from egress.spec import load_document, load_dynamic_spec
from egress.spec.loader import parse_text
from tests.conftest import REPO


@pytest.mark.parametrize(("name", "text", "lines"), [
    ("spec.yaml", "computations:\n  to_json:\n    sinks:\n      http:\n        parameters:\n"
                  "          url: http://a\n          url: http://b\n", "lines 6 and 7"),
    ("spec.yson", '"computations" = {\n  to_json = {\n    sinks = {http = {parameters = {\n'
                  '      url = "http://a";\n      "url" = "http://b";\n    }}}}};\n', "lines 4 and 5"),
])
def test_a_duplicate_sink_parameter_names_the_file_the_path_both_lines_and_the_fix(
        tmp_path: Path, name: str, text: str, lines: str) -> None:
    spec = tmp_path / name
    spec.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_document(spec)
    assert str(caught.value) == (
        f"{spec}: computations/to_json/sinks/http/parameters/url: the key 'url' is written twice "
        f"({lines}); only one value would be kept: remove one of them")


def test_a_duplicate_dynamic_spec_parameter_is_refused(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic.yml"
    dynamic.write_text("computations:\n  c:\n    sinks:\n      s:\n        parameters:\n"
                       "          request_timeout: 5s\n          max_attempt_count: 3\n          request_timeout: 9s\n")
    with pytest.raises(SpecError, match=r"parameters/request_timeout: .*lines 6 and 8"):
        load_dynamic_spec(dynamic)


def test_duplicates_inside_a_list_item_name_its_index() -> None:
    with pytest.raises(SpecError) as caught:
        parse_text(b"streams:\n  s:\n    schema:\n      - name: a\n        name: b\n", ".yaml")
    assert caught.value.path == "streams/s/schema/0/name"


def test_the_same_key_in_sibling_mappings_and_merge_overrides_are_accepted() -> None:
    text = b"base: &b {x: 1}\na: {x: 1}\nb: {x: 2}\nc:\n  <<: *b\n  x: 3\n"
    assert parse_text(text, ".yaml") == {"base": {"x": 1}, "a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}}


def test_keys_that_differ_only_as_typed_values_are_not_duplicates() -> None:
    assert parse_text(b"1: a\n'1': b\n", ".yaml") == {1: "a", "1": "b"}


def test_egress_validate_refuses_a_duplicate_instead_of_calling_the_pipeline_valid(tmp_path: Path) -> None:
    example = REPO / "examples" / "http_delivery"
    spec = tmp_path / "spec.yaml"
    spec.write_text((example / "spec.yaml").read_text().replace(
        "          payload_column: payload\n", "          payload_column: payload\n          url: http://other\n"))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert "computations/to_json/sinks/http/parameters/url: the key 'url' is written twice" in result.output
    assert "valid pipeline" not in result.output



def test_a_json_spec_with_a_key_twice_names_the_file_the_path_and_the_fix(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"computations": {"to_json": {"partition_count": 4, "partition_count": 8}}}')
    with pytest.raises(SpecError) as caught:
        load_document(spec)
    assert str(caught.value) == (
        f"{spec}: computations/to_json/partition_count: the key 'partition_count' is written twice in one "
        "object; only one value would be kept: remove one of them")


@pytest.mark.parametrize(("text", "path"), [
    (b'{"a": 1, "a": 2}', "a"),
    (b'{"streams": {"s": {"schema": [{"name": "x"}, {"name": "y", "name": "z"}]}}}', "streams/s/schema/1/name"),
])
def test_a_json_duplicate_is_named_by_its_path_at_any_depth(text: bytes, path: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_text(text, ".json")
    assert caught.value.path == path


def test_a_json_document_whose_keys_differ_loads_as_before() -> None:
    assert parse_text(b'{"a": {"b": [1, {"c": 2}]}, "d": null}', ".json") == {"a": {"b": [1, {"c": 2}]}, "d": None}


def test_a_yaml_flow_map_with_a_key_twice_on_one_line_names_the_line_once_and_both_columns() -> None:
    with pytest.raises(SpecError) as caught:
        parse_text(b"pipeline: p\nheaders: {a: 1, a: 2}\n", ".yaml")
    assert caught.value.path == "headers/a"
    assert caught.value.message == ("the key 'a' is written twice (line 2, columns 11 and 17); only one value "
                                    "would be kept: remove one of them")


@pytest.mark.parametrize(("text", "path", "where"), [
    (b"{a=1; a=2}", "a", "line 1, columns 2 and 7"),
    (b"a=1;\nb=2;\na=3", "a", "lines 1 and 3"),
    (b"{streams={s={schema=[{name=x};{name=y;name=z}]}}}", "streams/s/schema/1/name", "line 1, columns 32 and 39"),
    (b"{a=<q=1;q=2>{}}", "a/@/q", "line 1, columns 5 and 9"),
])
def test_a_yson_duplicate_is_named_by_its_path_at_any_depth(text: bytes, path: str, where: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_text(text, ".yson")
    assert caught.value.path == path
    assert f"({where})" in caught.value.message


def test_a_dynamic_spec_yson_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic.yson"
    dynamic.write_text("{computations={c={sinks={s={parameters={max_attempt_count=3;max_attempt_count=5}}}}}}")
    with pytest.raises(SpecError, match=r"dynamic.yson: computations/c/sinks/s/parameters/max_attempt_count: "
                                        r"the key 'max_attempt_count' is written twice"):
        load_dynamic_spec(dynamic)


def test_yson_keys_that_repeat_only_in_sibling_maps_and_lists_load_as_before() -> None:
    text = b'{a={x=1};b={x=2};c=[{x=1};{x=2}];"d e"=<x=1>{x=2}}'
    assert parse_text(text, ".yson") == {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}],
                                         "d e": {"$attributes": {"x": 1}, "$value": {"x": 2}}}
