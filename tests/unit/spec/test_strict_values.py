"""Validation catches what a run would only find later: a URL that cannot be sent to (a bad port, a
space in the host) and a boolean or string where a number belongs (pydantic strict types), in
the Spec, the connectors' parameters and the DynamicSpec. One line naming the file, the path and
the fix; exit 2 from ``egress validate`` and ``egress run``, before any state is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from egress.errors import SpecErrors
from egress.runtime import load_plan
from egress.spec.urls import endpoint_url_problem
from tests.unit.runtime.test_plan_validation import BASE, SINK, mutated, write
from tests.unit.runtime.test_plan_validation import (
    test_cli_prints_one_line_and_writes_no_state as cli_prints_one_line_and_writes_no_state,
)

URL = (*SINK, "parameters", "url")
URL_PATH = "computations/to_json/sinks/http/parameters/url: Async HTTP sink URL "

SPEC_CASES = [
    pytest.param(URL, "http://127.0.0.1:99999/events",
                 URL_PATH + "has port '99999', not a number from 1 to 65535", id="port-out-of-range"),
    pytest.param(URL, "http://127.0.0.1:80a/events",
                 URL_PATH + "has port '80a', not a number from 1 to 65535", id="port-not-a-number"),
    pytest.param(URL, "http://127.0.0.1:0/events", URL_PATH + "has port 0: use a port from 1 to 65535",
                 id="port-zero"),
    pytest.param(URL, "http://api .example.com/events", URL_PATH + "contains a space at position 11: remove it",
                 id="space-in-host"),
    pytest.param(URL, "http://api.example.com/a\tb", URL_PATH + "contains the control character '\\t'",
                 id="tab-in-path"),
    pytest.param(URL, "http://api!example.com/", URL_PATH + "has host 'api!example.com', which is not a host name",
                 id="bad-host-character"),
    pytest.param(("partition_count",), True,
                 "partition_count: expected an integer, got the boolean true: write a whole number", id="bool-for-int"),
    pytest.param(("partition_count",), "4",
                 "partition_count: expected an integer, got the string '4': write it without quotes",
                 id="string-for-int"),
    pytest.param((*SINK, "parameters", "max_in_flight"), True,
                 "computations/to_json/sinks/http/parameters/max_in_flight: expected an integer, got the boolean "
                 "true", id="bool-for-sink-int"),
    pytest.param((*SINK, "parameters", "keep_alive"), "no",
                 "computations/to_json/sinks/http/parameters/keep_alive: expected true or false, got the string "
                 "'no': write true or false", id="string-for-bool"),
    pytest.param((*SINK, "parameters", "headers"), {"X-Flag": True},
                 "computations/to_json/sinks/http/parameters/headers/X-Flag: expected a string, got the boolean "
                 "true: put it in quotes", id="bool-for-string"),
    pytest.param(("streams", "lines", "schema", 0, "required"), "yes",
                 "streams/lines/schema/0/required: expected true or false, got the string 'yes'",
                 id="string-for-schema-bool"),
]


@pytest.mark.parametrize(("path", "value", "expected"), SPEC_CASES)
def test_a_spec_value_a_run_would_trip_on_is_refused_with_file_path_and_fix(
        tmp_path: Path, path: tuple[Any, ...], value: Any, expected: str) -> None:
    spec_path, _ = write(tmp_path, mutated(path, value))  # type: ignore[arg-type]
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path)
    lines = str(raised.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{spec_path}: {expected}")


DYNAMIC_CASES = [
    pytest.param({"max_attempt_count": True},
                 "max_attempt_count: expected an integer, got the boolean true: write a whole number",
                 id="bool-for-int"),
    pytest.param({"max_attempt_count": "20"}, "max_attempt_count: expected an integer, got the string '20': "
                 "write it without quotes", id="string-for-int"),
    pytest.param({"retry_multiplier": "2.5"}, "retry_multiplier: expected a number, got the string '2.5': "
                 "write it without quotes", id="string-for-number"),
    pytest.param({"retry_multiplier": "1e3"}, "retry_multiplier: expected a number, got the string '1e3': "
                 "write it without quotes; in YAML write 1000 (YAML reads 1e3 unquoted as text too)",
                 id="yaml-exponent-without-a-dot"),
]


@pytest.mark.parametrize(("parameters", "expected"), DYNAMIC_CASES)
def test_a_dynamic_spec_value_of_the_wrong_type_is_refused_naming_that_file(
        tmp_path: Path, parameters: dict[str, Any], expected: str) -> None:
    spec_path, dynamic_path = write(tmp_path, BASE, {"computations": {"to_json": {"sinks": {"http": {
        "parameters": parameters}}}}})
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec_path, dynamic_path)
    assert str(raised.value) == f"{dynamic_path}: computations/to_json/sinks/http/parameters/{expected}"


def test_numbers_durations_and_ipv6_hosts_written_as_intended_still_load(tmp_path: Path) -> None:
    spec = mutated(URL, "https://[::1]:8443/events?a=b")
    spec["partition_count"] = 3
    spec_path, dynamic_path = write(tmp_path, spec, {"computations": {"to_json": {"sinks": {"http": {"parameters": {
        "retry_multiplier": 3, "max_attempt_count": 7, "request_timeout": 60000, "attempt_timeout": "10s"}}}}}})
    plan = load_plan(spec_path, dynamic_path)
    assert plan.spec.partition_count == 3


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/x", "https://api.example.com", "http://bücher.example/",
                                 "http://internal_host:80/", "http://[2001:db8::1]/", "http://h.example.com./p"])
def test_a_usable_endpoint_url_has_no_problem(url: str) -> None:
    assert endpoint_url_problem(url) is None


@pytest.mark.parametrize(("path", "value", "expected"), [SPEC_CASES[0], SPEC_CASES[3], SPEC_CASES[7]])
def test_egress_validate_and_run_print_one_line_and_exit_2(tmp_path: Path, path: tuple[str, ...], value: Any,
                                                           expected: str) -> None:
    cli_prints_one_line_and_writes_no_state(tmp_path, path, value, expected.split(": ")[-1])
