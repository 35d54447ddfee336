"""Parameters of the firehose_http sink: Firehose's ranges, and an access key only by reference."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from egress.connectors.sinks.firehose_http import batch_request_id
from egress.connectors.sinks.firehose_parameters import (
    AccessKeyReference,
    AccessKeyUnavailable,
    FirehoseHttpSinkDynamicParameters,
    FirehoseHttpSinkParameters,
)
from egress.runtime import load_plan
from tests.conftest import REPO

BASE = {"url": "https://example.com/ingest", "payload_column": "payload", "stream_name": "flights"}


def parse(**changes: Any) -> FirehoseHttpSinkParameters:
    return FirehoseHttpSinkParameters.model_validate({**BASE, **changes})


def test_defaults_are_firehoses() -> None:
    parameters = parse()
    assert parameters.buffering_hints.size_in_mbs == 5
    assert parameters.buffering_hints.interval_in_seconds == 300
    assert parameters.retry_duration == 300
    assert parameters.content_encoding == "none"
    assert parameters.response_timeout == 180
    assert parameters.arn == "arn:aws:firehose:local:000000000000:deliverystream/flights"
    assert parameters.common_attributes_header is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"access_key": "s3cr3t"}, "never the key itself"),
    ({"access_key": {"env": "A", "file": "/k"}}, "exactly one of env or file"),
    ({"access_key": {}}, "exactly one of env or file"),
    ({"buffering_hints": {"size_in_mbs": 10}}, "requires the other"),
    ({"buffering_hints": {"size_in_mbs": 65, "interval_in_seconds": 60}}, "less than or equal to 64"),
    ({"buffering_hints": {"size_in_mbs": 0, "interval_in_seconds": 60}}, "greater than or equal to 1"),
    ({"buffering_hints": {"size_in_mbs": 1, "interval_in_seconds": 901}}, "less than or equal to 900"),
    ({"retry_duration": 7201}, "less than or equal to 7200"),
    ({"retry_duration": -1}, "greater than or equal to 0"),
    ({"content_encoding": "br"}, "'none' or 'gzip'"),
    ({"url": "ftp://example.com/"}, "must use http or https"),
    ({"source_arn": "arn:aws:firehose:us-east-1:1:deliverystream/s"}, "exactly one of source_arn and stream_name"),
    ({"stream_name": "bad name"}, "stream_name must be"),
    ({"common_attributes": {"": "x"}}, "invalid common attributes"),
    ({"common_attributes": {f"k{i}": "v" for i in range(51)}}, "at most 50"),
])
def test_rejected(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as raised:
        parse(**changes)
    assert "s3cr3t" not in str(raised.value)


def test_source_arn_instead_of_a_stream_name() -> None:
    arn = "arn:aws:firehose:us-east-1:111111111111:deliverystream/test"
    parameters = FirehoseHttpSinkParameters.model_validate({**BASE, "stream_name": None, "source_arn": arn})
    assert parameters.arn == arn


def test_access_key_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FH_TEST_KEY", "from-env")
    assert AccessKeyReference(env="FH_TEST_KEY").resolve() == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    reference = AccessKeyReference(file=str(key_file))
    assert reference.resolve() == "from-file"
    key_file.write_text("rotated")
    assert reference.resolve() == "rotated"  # read at every attempt
    assert "rotated" not in repr(reference)


@pytest.mark.parametrize("setup", ["unset", "empty", "missing-file", "two-lines", "huge"])
def test_unavailable_keys_name_the_place_not_the_value(setup: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    if setup == "unset":
        monkeypatch.delenv("FH_TEST_KEY", raising=False)
        reference = AccessKeyReference(env="FH_TEST_KEY")
    elif setup == "empty":
        monkeypatch.setenv("FH_TEST_KEY", "")
        reference = AccessKeyReference(env="FH_TEST_KEY")
    elif setup == "missing-file":
        reference = AccessKeyReference(file=str(key_file))
    elif setup == "two-lines":
        key_file.write_text("secret-one\nsecret-two\n")
        reference = AccessKeyReference(file=str(key_file))
    else:
        monkeypatch.setenv("FH_TEST_KEY", "secret-" * 600)
        reference = AccessKeyReference(env="FH_TEST_KEY")
    with pytest.raises(AccessKeyUnavailable) as raised:
        reference.resolve()
    assert "secret" not in str(raised.value)
    assert ("FH_TEST_KEY" in str(raised.value)) or (str(key_file) in str(raised.value))


def test_dynamic_parameters_override_url_and_key() -> None:
    dynamic = FirehoseHttpSinkDynamicParameters.model_validate(
        {"url": "http://127.0.0.1:9/x", "access_key": {"env": "NEXT_KEY"}, "retry_initial_delay": "10ms"})
    assert dynamic.retry_initial_delay == 0.01
    assert dynamic.retry_maximum_delay == 120
    with pytest.raises(ValidationError, match="never the key itself"):
        FirehoseHttpSinkDynamicParameters.model_validate({"access_key": "k"})


def test_request_id_is_a_deterministic_uuid() -> None:
    first = batch_request_id("deliver/firehose", b"\x01" * 16, b"\x02" * 16)
    assert first == batch_request_id("deliver/firehose", b"\x01" * 16, b"\x02" * 16)
    assert first != batch_request_id("deliver/firehose", b"\x01" * 16, b"\x03" * 16)
    assert first != batch_request_id("deliver/other", b"\x01" * 16, b"\x02" * 16)
    assert len(first) == 36
    assert first[14] == "4"


def test_spec_errors_name_the_path_and_never_the_key() -> None:
    from egress.errors import SpecErrors
    from egress.spec import validate_model

    with pytest.raises(SpecErrors) as raised:
        validate_model(FirehoseHttpSinkParameters, {**BASE, "access_key": "s3cr3t-value"}, file="spec.yaml",
                       prefix="computations/c/sinks/firehose/parameters")
    text = raised.value.format()
    assert "computations/c/sinks/firehose/parameters/access_key" in text
    assert "never the key itself" in text
    assert "s3cr3t" not in text


def test_an_unset_access_key_variable_fails_the_spec_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """egress validate and egress run stop before the first attempt, naming the variable."""
    from egress.connectors.sinks.firehose_http import FirehoseHttpSink
    from egress.spec import StreamSpec

    stream = StreamSpec.model_validate({"schema": [{"name": "record", "type": "string"}]})
    parameters = parse(access_key={"env": "EGRESS_TEST_UNSET_KEY"}, payload_column="record")
    monkeypatch.delenv("EGRESS_TEST_UNSET_KEY", raising=False)
    errors = FirehoseHttpSink.check(parameters, {"records": stream})
    assert [e.path for e in errors] == ["parameters/access_key"]
    assert "EGRESS_TEST_UNSET_KEY" in errors[0].message
    monkeypatch.setenv("EGRESS_TEST_UNSET_KEY", "secret")
    assert FirehoseHttpSink.check(parameters, {"records": stream}) == []


def test_a_relative_access_key_file_starts_at_the_specs_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one rule for relative paths in a Spec: the Spec's folder, whatever folder egress runs in."""
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "firehose_key").write_text("k3y\n")
    document = yaml.safe_load((REPO / "examples" / "firehose_delivery" / "spec.yaml").read_text())
    document["sources"]["flights_csv"]["parameters"]["path"] = str(REPO / "data" / "flights-2013.csv.gz")
    document["computations"]["to_record"]["sinks"]["firehose"]["parameters"]["access_key"] = {"file": "firehose_key"}
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    parameters = load_plan(spec).computations["to_record"].sinks["firehose"].parameters
    assert parameters.access_key.file == str(folder / "firehose_key")
    assert parameters.access_key.resolve() == "k3y"


def test_a_payload_column_not_in_the_stream_names_the_string_columns_it_could_be() -> None:
    from egress.connectors.sinks.firehose_http import FirehoseHttpSink
    from egress.spec import StreamSpec

    stream = StreamSpec.model_validate({"schema": [{"name": "record", "type": "string"},
                                                   {"name": "n", "type": "int64"}]})
    [error] = FirehoseHttpSink.check(parse(payload_column="recrod"), {"records": stream})
    assert error.path == "parameters/payload_column"
    assert error.message == ('Firehose HTTP sink payload column "recrod" must be a String column of the input '
                             "stream (its String columns: record)")


@pytest.mark.parametrize(("written", "seconds"), [
    (2, 2.0), (180, 180.0), (0.5, 0.5), ("180", 180.0), ("90s", 90.0), ("1m30s", 90.0), ("500ms", 0.5), (900, 900.0),
])
def test_response_timeout_is_seconds_as_retry_duration_or_a_duration_with_its_unit(
        written: object, seconds: float) -> None:
    """``response_timeout: 2`` is 2 s, not Flow's 2 ms for a bare integer: the sink's other times are
    Firehose's seconds (``retry_duration``, ``interval_in_seconds``), and so is each attempt's timeout."""
    from egress.connectors.sinks.firehose_http import FirehoseRetries

    parameters = parse(response_timeout=written, retry_duration=5)
    assert parameters.response_timeout == seconds
    retries = FirehoseRetries(float(parameters.retry_duration), parameters.response_timeout, random.Random(0),
                              FirehoseHttpSinkDynamicParameters)
    assert retries.attempt_timeout(0.0) == seconds
    assert parse(**parameters.model_dump(exclude_none=True)).response_timeout == seconds  # written back with a unit


@pytest.mark.parametrize(("written", "message"), [
    (180000, "response_timeout is in seconds.*180000 is not in \\(0, 900\\]; for milliseconds write '180000ms'"),
    ("2000", "for milliseconds write '2000ms'"),
    (0, "0 is not in \\(0, 900\\]"),
    (-1, "is not in"),
    ("901s", "901s is not in \\(0, 900\\]"),
    ("soon", "response_timeout must be seconds"),
    (True, "response_timeout must be seconds"),
])
def test_a_response_timeout_out_of_range_says_it_is_seconds(written: object, message: str) -> None:
    """A count of milliseconds (Flow's bare-integer convention, 1 s and more is ≥ 1000) is refused with the
    way to write it, not taken as 16 minutes or more."""
    with pytest.raises(ValidationError, match=message):
        parse(response_timeout=written)


def test_the_dynamic_spec_refuses_the_spec_parameters() -> None:
    """docs/firehose.md lists these under the Spec: the DynamicSpec model does not have them."""
    for name, value in (("max_in_flight", 2), ("response_timeout", 2), ("compression_level", 6),
                        ("tls_ca_file", "ca.pem"), ("propagate_trace_context", False), ("retry_duration", 5)):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            FirehoseHttpSinkDynamicParameters.model_validate({name: value})
        assert name in FirehoseHttpSinkParameters.model_fields
