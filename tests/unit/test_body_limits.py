"""The body deadlines of egress's servers are validated where they are configured: the http
source's ``body_timeout`` by its Spec model (a SpecError naming the path), the Firehose receiver's by
``ReceiverOptions``."""

from __future__ import annotations

from typing import Any

import pytest

from egress.connectors.sources.http import HttpSourceParameters
from egress.errors import SpecErrors
from egress.firehose import ReceiverOptions
from egress.spec import validate_model


@pytest.mark.parametrize(("value", "message"), [(0, "greater than 0"), (-1.5, "greater than 0"),
                                                 ("soon", "expected a number")])
def test_a_bad_http_source_body_timeout_is_named_by_path(value: Any, message: str) -> None:
    prefix = "sources/hooks/parameters"
    with pytest.raises(SpecErrors) as raised:
        validate_model(HttpSourceParameters, {"port": 8088, "body_timeout": value}, file="spec.yaml", prefix=prefix)
    (error,) = raised.value.errors
    assert (error.file, error.path) == ("spec.yaml", f"{prefix}/body_timeout")
    assert message in error.message


def test_the_http_source_waits_30_s_for_a_body_by_default() -> None:
    assert HttpSourceParameters(port=8088).body_timeout == 30.0
    assert HttpSourceParameters.model_validate({"port": 8088, "body_timeout": 2.5}).body_timeout == 2.5


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_firehose_receiver_body_timeout_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="body_timeout must be > 0"):
        ReceiverOptions(body_timeout=value)
    assert ReceiverOptions().body_timeout == 180.0
