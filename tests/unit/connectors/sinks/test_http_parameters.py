"""Async HTTP sink parameters: upstream ParsesStaticCombinations, ParsesDynamicDefaults,
RejectsInvalidStaticParameters (20 inputs), RejectsInvalidDynamicParameters (14 inputs),
RejectsAtMostOnceDynamicConfiguration — with upstream's exact messages where it has them."""

from __future__ import annotations

from typing import Any

import pytest

from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.errors import SpecErrors
from egress.spec import validate_model

VALID = {"url": "https://receiver.example/api/events", "payload_column": "payload"}


def static_error(**changes: Any) -> str:
    data = {**VALID, **changes}
    data = {k: v for k, v in data.items() if v is not _MISSING}
    with pytest.raises(SpecErrors) as raised:
        validate_model(AsyncHttpSinkParameters, data)
    return str(raised.value)


_MISSING = object()
URL = "Async HTTP sink URL must use http or https and contain a host"
TOKENS = "Async HTTP sink header names must be valid HTTP tokens"
CRLF = "Async HTTP sink header values must not contain carriage returns or newlines"
HOP = "Async HTTP sink headers must not contain hop-by-hop or transport-managed names"
UNIQUE = "Async HTTP sink header names must be unique case-insensitively"
IDEMPOTENCY_NAME = "Async HTTP sink idempotency_header must be empty or a valid HTTP header name"
IDEMPOTENCY_HOP = "Async HTTP sink idempotency_header must not be hop-by-hop or transport-managed"
OVERRIDE = "Async HTTP sink headers must not override idempotency_header"

STATIC_INVALID = [
    pytest.param({"url": _MISSING}, "url: required field is missing", id="missing-url"),
    pytest.param({"url": ""}, URL, id="empty-url"),
    pytest.param({"payload_column": _MISSING}, "payload_column: required field is missing", id="missing-column"),
    pytest.param({"payload_column": ""}, "payload_column", id="empty-column"),
    pytest.param({"url": "ftp://receiver.example/x"}, URL, id="ftp"),
    pytest.param({"url": "https:///path"}, URL, id="no-host"),
    pytest.param({"headers": {"": "x"}}, TOKENS, id="empty-header-name"),
    pytest.param({"headers": {"Bad Header": "x"}}, TOKENS, id="space-in-header-name"),
    pytest.param({"headers": {"X-A": "a\rb"}}, CRLF, id="carriage-return"),
    pytest.param({"headers": {"X-A": "a\nb"}}, CRLF, id="newline"),
    pytest.param({"headers": {"Connection": "close"}}, HOP, id="connection"),
    pytest.param({"headers": {"Content-Length": "5"}}, HOP, id="content-length"),
    pytest.param({"headers": {"Host": "example.org"}}, HOP, id="host"),
    pytest.param({"headers": {"X-Trace": "1", "x-trace": "2"}}, UNIQUE, id="case-duplicates"),
    pytest.param({"headers": {"Idempotency-Key": "static"}}, OVERRIDE, id="static-idempotency-key"),
    pytest.param({"idempotency_header": "Bad Header"}, IDEMPOTENCY_NAME, id="bad-idempotency-header"),
    pytest.param({"idempotency_header": "Transfer-Encoding"}, IDEMPOTENCY_HOP, id="forbidden-idempotency-header"),
    pytest.param({"max_redirect_count": -1}, "max_redirect_count", id="negative-redirects"),
    pytest.param({"max_idle_connections": -1}, "max_idle_connections", id="negative-idle"),
    pytest.param({"at_most_once_strategy": {"enable": True}},
                 "Async HTTP sink does not support at_most_once_strategy", id="at-most-once"),
]


@pytest.mark.parametrize(("changes", "message"), STATIC_INVALID)
def test_rejects_invalid_static_parameters(changes: dict[str, Any], message: str) -> None:
    assert message in static_error(**changes)


def test_twenty_static_cases_are_covered() -> None:
    assert len(STATIC_INVALID) == 20


def test_parses_static_combinations_and_defaults() -> None:
    defaults = AsyncHttpSinkParameters.model_validate(VALID)
    assert (defaults.headers, defaults.idempotency_header, defaults.keep_alive, defaults.max_redirect_count,
            defaults.max_idle_connections) == ({}, "Idempotency-Key", True, 0, 8)
    custom = AsyncHttpSinkParameters.model_validate({
        **VALID, "url": "http://h:8080/p?q=1", "headers": {"Content-Type": "application/json", "X-A": "b"},
        "idempotency_header": "", "keep_alive": False, "max_redirect_count": 3, "max_idle_connections": 0})
    assert custom.idempotency_header == ""
    assert custom.keep_alive is False
    assert AsyncHttpSinkParameters.model_validate({**VALID, "idempotency_header": "X-Message-Id",
                                                   "headers": {"Idempotency-Key": "fine-now"}})


def dynamic_error(**changes: Any) -> str:
    with pytest.raises(SpecErrors) as raised:
        validate_model(AsyncHttpSinkDynamicParameters, changes)
    return str(raised.value)


def test_two_delays_out_of_order_name_both_values_and_which_is_the_default() -> None:
    """Setting ``retry_initial_delay`` alone below the default ``retry_minimum_delay`` (100ms) said only
    "retry_minimum_delay must not exceed retry_initial_delay", about a value the user never wrote."""
    assert dynamic_error(retry_initial_delay="10ms") == (
        "retry_minimum_delay must not exceed retry_initial_delay: retry_minimum_delay 100ms (the default) > "
        "retry_initial_delay 10ms; lower retry_minimum_delay or raise retry_initial_delay")


DYNAMIC_INVALID = [
    pytest.param({"request_timeout": "0s"}, "request_timeout", id="zero-request-timeout"),
    pytest.param({"attempt_timeout": 0}, "attempt_timeout", id="zero-attempt-timeout"),
    pytest.param({"retry_initial_delay": "0ms"}, "retry_initial_delay", id="zero-initial"),
    pytest.param({"retry_minimum_delay": "0ms"}, "retry_minimum_delay", id="zero-minimum"),
    pytest.param({"retry_maximum_delay": "0s"}, "retry_maximum_delay", id="zero-maximum"),
    pytest.param({"attempt_timeout": "2m"}, "attempt_timeout must not exceed request_timeout", id="attempt-over"),
    pytest.param({"retry_minimum_delay": "2s"}, "retry_minimum_delay must not exceed retry_initial_delay",
                 id="minimum-over-initial"),
    pytest.param({"retry_initial_delay": "31s"}, "retry_initial_delay must not exceed retry_maximum_delay",
                 id="initial-over-maximum"),
    pytest.param({"retry_multiplier": 1.0}, "retry_multiplier", id="multiplier-1.0"),
    pytest.param({"retry_multiplier": 100.1}, "retry_multiplier", id="multiplier-100.1"),
    pytest.param({"retry_jitter_ratio": -0.1}, "retry_jitter_ratio", id="jitter-negative"),
    pytest.param({"retry_jitter_ratio": 1.1}, "retry_jitter_ratio", id="jitter-over-one"),
    pytest.param({"max_attempt_count": 0}, "max_attempt_count", id="attempts-0"),
    pytest.param({"max_attempt_count": 101}, "max_attempt_count", id="attempts-101"),
]


@pytest.mark.parametrize(("changes", "message"), DYNAMIC_INVALID)
def test_rejects_invalid_dynamic_parameters(changes: dict[str, Any], message: str) -> None:
    assert message in dynamic_error(**changes)


def test_fourteen_dynamic_cases_are_covered() -> None:
    assert len(DYNAMIC_INVALID) == 14


def test_parses_dynamic_defaults() -> None:
    defaults = AsyncHttpSinkDynamicParameters()
    assert (defaults.request_timeout, defaults.attempt_timeout, defaults.retry_initial_delay,
            defaults.retry_minimum_delay, defaults.retry_multiplier, defaults.retry_maximum_delay,
            defaults.retry_jitter_ratio, defaults.max_attempt_count) == (60.0, 10.0, 1.0, 0.1, 2.0, 30.0, 0.2, 5)


def test_rejects_at_most_once_dynamic_configuration() -> None:
    assert "does not support at_most_once_strategy" in dynamic_error(at_most_once_strategy={"enable": True})
    assert AsyncHttpSinkDynamicParameters.model_validate({"at_most_once_strategy": {}})
