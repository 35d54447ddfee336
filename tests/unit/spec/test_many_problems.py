"""A Spec with very many problems is reported in at most SHOWN_PROBLEMS lines and a count of the
rest, and only the shown ones are worked out in detail ("did you mean", where it belongs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from egress.cli.main import app
from egress.errors import SHOWN_PROBLEMS, SpecError, SpecErrors
from egress.spec import Spec, validate_model

VALID = {"pipeline": "p", "streams": {"s": {"schema": [{"name": "a", "type": "string"}]}}}


def _unknown(count: int, name: str = "unknown_{}") -> dict[str, object]:
    return {**VALID, **{name.format(i): 1 for i in range(count)}}


def test_past_the_shown_problems_one_line_counts_the_rest() -> None:
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, _unknown(SHOWN_PROBLEMS + 12), file="spec.yaml")
    lines = caught.value.format().splitlines()
    assert len(caught.value.errors) == SHOWN_PROBLEMS + 12
    assert len(lines) == SHOWN_PROBLEMS + 1
    assert lines[0] == "spec.yaml: unknown_0: unknown field (check the spelling against the documentation)"
    assert lines[-1] == "spec.yaml: … and 12 more problems: fix these and check again to see them"


def test_one_problem_past_the_shown_ones_is_counted_in_the_singular() -> None:
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, _unknown(SHOWN_PROBLEMS + 1))
    assert caught.value.format().splitlines()[-1] == "… and 1 more problem: fix these and check again to see them"


def test_as_many_problems_as_are_shown_get_a_line_each_and_no_count() -> None:
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, _unknown(SHOWN_PROBLEMS))
    assert len(caught.value.format().splitlines()) == SHOWN_PROBLEMS
    assert "more problem" not in caught.value.format()


def test_the_shown_problems_keep_did_you_mean_and_the_rest_are_only_counted() -> None:
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, _unknown(3 * SHOWN_PROBLEMS, "pipelin{}"))
    first, last = caught.value.errors[0], caught.value.errors[-1]
    assert first.message == "unknown field; did you mean 'pipeline'?"
    assert "did you mean" not in last.message


def test_a_missing_field_stays_when_the_unknown_field_that_misspells_it_is_not_shown() -> None:
    data = {key: value for key, value in _unknown(2 * SHOWN_PROBLEMS).items() if key != "pipeline"}
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, {**data, "pipelinee": "p"})
    assert caught.value.format().splitlines()[0] == "pipeline: required field is missing"


def test_a_shown_misspelling_still_replaces_the_missing_line() -> None:
    data = {key: value for key, value in VALID.items() if key != "pipeline"}
    with pytest.raises(SpecErrors) as caught:
        validate_model(Spec, {**data, "pipelinee": "p", **_unknown(2 * SHOWN_PROBLEMS)})
    assert caught.value.format().splitlines()[0] == "pipelinee: unknown field; did you mean 'pipeline'?"


def test_egress_validate_prints_the_shown_problems_and_the_count(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("pipeline: p\nstreams: {s: {schema: [{name: a, type: string}]}}\n"
                    + "".join(f"unknown_{i}: 1\n" for i in range(1000)))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert lines[-1] == f"{spec}: … and 950 more problems: fix these and check again to see them"
    assert sum(line.startswith(f"{spec}: unknown_") for line in lines) == SHOWN_PROBLEMS


def test_the_count_names_every_file_its_problems_are_in() -> None:
    errors = [SpecError("x", path=str(i), file="spec.yaml") for i in range(SHOWN_PROBLEMS + 1)]
    errors.append(SpecError("y", path="z", file="dynamic.yaml"))
    assert SpecErrors(errors).format().splitlines()[-1] == (
        "spec.yaml, dynamic.yaml: … and 2 more problems: fix these and check again to see them")


def test_a_spec_error_that_is_not_many_formats_as_before() -> None:
    assert SpecErrors([SpecError("x", path="a")]).format() == "a: x"
