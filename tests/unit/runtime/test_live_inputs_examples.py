"""The live_inputs examples are valid Specs (what ``egress validate`` checks)."""

from __future__ import annotations

import pytest

from egress.runtime import load_plan
from tests.conftest import REPO

EXAMPLES = REPO / "examples" / "live_inputs"


@pytest.mark.parametrize("spec", ["nats_spec.yaml", "webhook_spec.yaml", "follow_spec.yaml"])
def test_each_live_input_example_is_a_valid_spec(spec: str) -> None:
    plan = load_plan(EXAMPLES / spec)
    assert len(plan.sources) == 1
