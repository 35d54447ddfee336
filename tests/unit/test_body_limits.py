"""The body limits and deadlines of egress's servers are validated where they are configured: the http
source's ``body_timeout``, ``keepalive_timeout`` and ``max_body_bytes`` by its Spec model (a SpecError naming the path),
the Firehose receiver's by ``ReceiverOptions``."""

from __future__ import annotations

from typing import Any

import pytest

from egress.connectors.sources.http import HttpSourceParameters
from egress.errors import SpecErrors
from egress.firehose import ReceiverOptions
from egress.spec import validate_model


@pytest.mark.parametrize(("name", "value", "message"), [
    ("body_timeout", 0, "body_timeout must be more than 0, got 0"),
    ("body_timeout", -1.5, "body_timeout must be more than 0, got -1.5"),
    ("body_timeout", "soon", "expected a number"),
    ("keepalive_timeout", 0, "keepalive_timeout must be more than 0, got 0"),
    ("keepalive_timeout", "later", "expected a number"),
    ("max_body_bytes", "2GiB", "2GiB is more than the limit, 1GiB"),
    ("max_body_bytes", "1 gigabyte", "KiB, MiB, GiB"), ("max_body_bytes", 0, "less than the least")])
def test_a_bad_http_source_body_limit_is_named_by_path_with_its_fix(name: str, value: Any, message: str) -> None:
    prefix = "sources/hooks/parameters"
    with pytest.raises(SpecErrors) as raised:
        validate_model(HttpSourceParameters, {"port": 8088, name: value}, file="spec.yaml", prefix=prefix)
    (error,) = raised.value.errors
    assert (error.file, error.path) == ("spec.yaml", f"{prefix}/{name}")
    assert message in error.message


def test_the_http_source_waits_30_s_for_a_body_by_default() -> None:
    assert HttpSourceParameters(port=8088).body_timeout == 30.0
    assert HttpSourceParameters.model_validate({"port": 8088, "body_timeout": 2.5}).body_timeout == 2.5


def test_the_http_source_closes_a_connection_idle_for_75_s_by_default_as_aiohttps_run_app() -> None:
    assert HttpSourceParameters(port=8088).keepalive_timeout == 75.0
    assert HttpSourceParameters.model_validate({"port": 8088, "keepalive_timeout": 0.5}).keepalive_timeout == 0.5


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_firehose_receiver_body_timeout_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="body_timeout must be > 0"):
        ReceiverOptions(body_timeout=value)
    assert ReceiverOptions().body_timeout == 180.0


@pytest.mark.parametrize(("value", "size"), [(1024, 1024), ("16MiB", 16 << 20), ("2MB", 2_000_000), ("1GiB", 1 << 30)])
def test_the_http_source_max_body_bytes_takes_bytes_or_a_size_with_a_unit(value: Any, size: int) -> None:
    assert HttpSourceParameters.model_validate({"port": 8088, "max_body_bytes": value}).max_body_bytes == size
