"""Validation rules of DynamicSpec ``throttlers`` and the computations' throttler fields."""

from __future__ import annotations

from typing import Any

import pytest

from egress.errors import SpecErrors
from egress.spec.models import DynamicSpec
from egress.throttler.models import (
    ThrottlerSpec,
    check_computation_throttlers,
    validate_dynamic_throttlers,
    validate_throttlers,
)


def messages(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecErrors) as caught:
        validate_throttlers(data, file="dyn.yaml")
    return [error.format() for error in caught.value.errors]


def test_defaults_follow_upstream() -> None:
    spec = validate_throttlers({"q": {}})["q"]
    assert (spec.limit, spec.period, spec.request_period, spec.rpc_timeout) == (None, 10.0, 5.0, 30.0)
    assert spec.retrying_channel.retry_attempts == 100
    assert spec.retrying_channel.retry_timeout == 600.0
    assert spec.retrying_channel.enable_exponential_retry_backoffs
    assert spec.classes == {}
    assert spec.max_grant_amount is None
    assert not spec.use_class_weights_as_limit
    assert spec.rate is None
    assert spec.max_prefetch == 1e9


def test_seed_example_loads() -> None:
    spec = validate_throttlers({"output_quota": {
        "limit": 1000.0, "period": "1s", "request_period": "500ms", "max_grant_amount": 50,
        "classes": {"vip": {"weight": 5.0}, "regular": {"weight": 3.0}, "bulk": {"weight": 1.0}}}})["output_quota"]
    assert spec.request_period == 0.5
    assert spec.max_prefetch == 500
    assert spec.classes["vip"].weight == 5.0


def test_class_id_pattern_and_reserved_default() -> None:
    assert messages({"q": {"classes": {"bad id": {"weight": 1}}}}) == [
        'dyn.yaml: throttlers/q/classes: Quota class id "bad id" must match [0-9A-Za-z_-]+']
    assert messages({"q": {"classes": {"default": {"weight": 2}}}}) == [
        'dyn.yaml: throttlers/q/classes: Quota class id "default" is reserved (weight 1.0)']


def test_weights_as_limit_needs_a_class_and_excludes_limit() -> None:
    assert messages({"q": {"use_class_weights_as_limit": True}}) == [
        'dyn.yaml: throttlers/q: use_class_weights_as_limit requires at least one class in "classes"']
    assert messages({"q": {"use_class_weights_as_limit": True, "limit": 5, "classes": {"a": {}}}}) == [
        'dyn.yaml: throttlers/q: use_class_weights_as_limit cannot be combined with "limit"']
    spec = ThrottlerSpec.model_validate({"use_class_weights_as_limit": True, "request_period": "1s",
                                         "classes": {"a": {"weight": 5}, "b": {"weight": 3}}})
    assert spec.rate == 8.0
    assert spec.max_prefetch == 8


def test_field_rules_name_their_paths() -> None:
    found = messages({"q": {"limit": -1, "period": "0s", "max_grant_amount": 0, "classes": {"a": {"weight": 0}},
                            "colour": "red"}})
    assert any(m.startswith("dyn.yaml: throttlers/q/limit: ") for m in found)
    assert any(m.startswith("dyn.yaml: throttlers/q/period: must be a positive duration") for m in found)
    assert any(m.startswith("dyn.yaml: throttlers/q/max_grant_amount: ") for m in found)
    assert any(m.startswith("dyn.yaml: throttlers/q/classes/a/weight: ") for m in found)
    assert "dyn.yaml: throttlers/q/colour: unknown field (check the spelling against the documentation)" in found


def test_computation_fields_are_checked_before_start() -> None:
    dynamic = DynamicSpec.model_validate({
        "throttlers": {"rows": {"limit": 10, "classes": {"vip": {}}}, "bytes": {"limit": 1000}},
        "computations": {
            "same": {"input_rows_throttler_id": "rows", "input_bytes_throttler_id": "rows"},
            "unknown": {"input_rows_throttler_id": "nope"},
            "bad_class": {"input_rows_throttler_id": "rows", "input_rows_throttler_class_id": "gold"},
            "orphan_class": {"input_bytes_throttler_class_id": "vip"},
            "fine": {"input_rows_throttler_id": "rows", "input_rows_throttler_class_id": "vip",
                     "input_bytes_throttler_id": "bytes", "input_bytes_throttler_class_id": "default"},
        }})
    with pytest.raises(SpecErrors) as caught:
        validate_dynamic_throttlers(dynamic)
    assert [e.format() for e in caught.value.errors] == [
        "computations/same/input_bytes_throttler_id: input_rows_throttler_id and input_bytes_throttler_id must "
        'name different throttlers, both are "rows" (one bucket cannot count both messages and bytes)',
        'computations/unknown/input_rows_throttler_id: Unknown throttler "nope": declare it in dynamic_spec/throttlers',
        'computations/bad_class/input_rows_throttler_class_id: Unknown quota class "gold" of throttler "rows" '
        "(known: default, vip)",
        "computations/orphan_class/input_bytes_throttler_class_id: input_bytes_throttler_class_id needs "
        "input_bytes_throttler_id",
    ]


def test_computations_must_exist_when_the_spec_is_known() -> None:
    dynamic = DynamicSpec.model_validate({"throttlers": {"t": {}},
                                          "computations": {"ghost": {"input_rows_throttler_id": "t"}}})
    errors = check_computation_throttlers(dynamic, validate_throttlers(dynamic.throttlers), computation_ids=["real"])
    assert [e.format() for e in errors] == ['computations/ghost: Unknown computation "ghost": not in the Spec']
