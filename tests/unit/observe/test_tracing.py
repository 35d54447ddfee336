"""egress.observe.tracing without a receiver: off unless asked, the standard sampler variables (and
the error naming the fix for others), the W3C trace context as carried, and `egress validate`
refusing unknown tracing options with the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import app
from egress.errors import SpecErrors, TracingConfigError
from egress.observe import tracing
from egress.runtime import load_plan
from tests.conftest import payload_spec

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_tracing_is_off_without_an_endpoint_and_importing_egress_loads_no_opentelemetry() -> None:
    assert tracing.configure(None, environ={}) is None
    assert tracing.active is None
    assert tracing.configure("http://127.0.0.1:9", environ={"OTEL_SDK_DISABLED": "true"}) is None
    code = ("import sys, egress, egress.cli.main, egress.runtime.partition_job, egress.connectors.sinks.async_http; "
            "print(any(m.startswith('opentelemetry') for m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


@pytest.mark.parametrize(("environ", "ratio", "follows"), [
    ({}, 1.0, True),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}, 0.01, True),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, 0.25, False),
    ({"OTEL_TRACES_SAMPLER": "always_off"}, 0.0, False),
    ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, 0.0, True),
])
def test_the_standard_sampler_variables_set_the_ratio_and_whether_a_parent_decides(
        environ: dict[str, str], ratio: float, follows: bool) -> None:
    sampling = tracing.Sampling.from_environment(environ)
    assert (sampling.ratio, sampling.follows_parent) == (ratio, follows)


def test_a_parent_based_sampler_follows_the_carried_sampled_flag_and_a_ratio_samples_about_that_share() -> None:
    sampling = tracing.Sampling(0.0, follows_parent=True)
    assert sampling.child(VALID)  # flags 01
    assert not sampling.child(VALID[:-2] + "00")
    assert sampling.child(VALID[:-2] + "03")  # sampled and random (W3C level 2)
    assert not sampling.child(None)  # a root: the ratio, 0
    tenth = tracing.Sampling(0.1, follows_parent=False)
    assert 500 < sum(tenth.root() for _ in range(10_000)) < 1_500


@pytest.mark.parametrize(("environ", "fix"), [
    ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "use one of always_on"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1%"}, "give a number from 0 to 1"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "give a number from 0 to 1"),
])
def test_a_sampler_egress_does_not_know_is_refused_naming_the_variable_and_the_fix(
        environ: dict[str, str], fix: str) -> None:
    with pytest.raises(TracingConfigError, match=fix) as raised:
        tracing.Sampling.from_environment(environ)
    assert "OTEL_TRACES_SAMPLER" in str(raised.value)


def test_an_endpoint_that_is_not_an_http_url_is_refused_with_an_example() -> None:
    with pytest.raises(TracingConfigError, match=re.escape("--otlp-endpoint http://127.0.0.1:4318")):
        tracing.configure("127.0.0.1:4318", environ={})


def test_the_traces_url_adds_the_otlp_path_once() -> None:
    assert tracing.traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert tracing.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert tracing.traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"


def test_an_incoming_traceparent_is_carried_with_its_tracestate_and_an_invalid_one_is_dropped() -> None:
    assert tracing.context_of_headers(VALID, "vendor=1,other=2") == f"{VALID}\nvendor=1,other=2"
    assert tracing.context_of_headers(VALID.upper()) == VALID
    assert tracing.headers_of_context(f"{VALID}\nvendor=1") == [f"traceparent: {VALID}", "tracestate: vendor=1"]
    assert tracing.headers_of_context(VALID) == [f"traceparent: {VALID}"]
    assert tracing.trace_id_of(VALID) == "4bf92f3577b34da6a3ce929d0e0e4736"
    for bad in (None, "", "garbage", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"):
        assert tracing.context_of_headers(bad) is None, bad
    assert tracing.context_of_headers(VALID, "a=1\r\nX-Injected: 1") == VALID  # never a header line of its own


@pytest.mark.parametrize(("key", "fix"), [
    ("propagate_trace_contexts", "did you mean 'propagate_trace_context'?"),
    ("tracing", "propagate_trace_context: false"),
    ("trace_context", "--otlp-endpoint"),
])
def test_validate_refuses_an_unknown_tracing_option_of_a_sink_with_file_path_and_fix(
        tmp_path: Path, key: str, fix: str) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/", ["a"], sink_parameters={key: False})
    with pytest.raises(SpecErrors) as raised:
        load_plan(spec)
    message = raised.value.format()
    assert str(spec) in message
    assert f"computations/deliver/sinks/http/parameters/{key}" in message
    assert fix in message
    result = CliRunner().invoke(app, ["validate", str(spec)], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert fix in result.output


def test_propagate_trace_context_false_is_a_valid_sink_parameter(tmp_path: Path) -> None:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/", ["a"], sink_parameters={"propagate_trace_context": False})
    plan = load_plan(spec)
    assert plan.computations["deliver"].sinks["http"].parameters.propagate_trace_context is False
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"]["http"]["parameters"]["propagate_trace_context"] = "no"
    spec.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecErrors, match="true or false"):
        load_plan(spec)


OTHER_SINKS = {
    "webhook_http": {"payload_column": "payload", "url_column": "payload"},
    "firehose_http": {"url": "http://127.0.0.1:9/", "payload_column": "payload", "stream_name": "flights"},
}


def other_sink_spec(tmp_path: Path, sink_class: str, **parameters: object) -> Path:
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/", ["a"])
    document = yaml.safe_load(spec.read_text())
    sink = document["computations"]["deliver"]["sinks"]["http"]
    sink["sink_class_name"] = sink_class
    sink["parameters"] = {**OTHER_SINKS[sink_class], **parameters}
    spec.write_text(yaml.safe_dump(document))
    return spec


@pytest.mark.parametrize("sink_class", sorted(OTHER_SINKS))
def test_the_webhook_and_firehose_sinks_take_propagate_trace_context_and_refuse_a_misspelling(
        tmp_path: Path, sink_class: str) -> None:
    plan = load_plan(other_sink_spec(tmp_path, sink_class, propagate_trace_context=False))
    assert plan.computations["deliver"].sinks["http"].parameters.propagate_trace_context is False
    with pytest.raises(SpecErrors) as raised:
        load_plan(other_sink_spec(tmp_path, sink_class, propagate_trace_contexts=False))
    message = raised.value.format()
    assert "computations/deliver/sinks/http/parameters/propagate_trace_contexts" in message
    assert "did you mean 'propagate_trace_context'?" in message
    with pytest.raises(SpecErrors, match="true or false"):
        load_plan(other_sink_spec(tmp_path, sink_class, propagate_trace_context="no"))
