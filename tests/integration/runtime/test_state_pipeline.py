"""Keyed state and timers in whole pipelines (one process, SQLite, virtual clock): the retryable
async request example's feedback loop end to end, a second run, ``egress state dump``, and live
dynamic parameters."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from egress.cli.state import app as state_app
from egress.cli.state import state_lines
from egress.clock import VirtualClock
from egress.errors import SpecErrors
from egress.observe import Metrics
from egress.runtime import Pipeline, RunOptions, load_plan
from egress.runtime.partition_job import PartitionJob
from tests.conftest import REPO

pytestmark = pytest.mark.integration

RETRYABLE = REPO / "examples" / "retryable_async_request"
URL_DOWNLOADER = REPO / "examples" / "url_downloader"


def expected_totals() -> dict[str, int]:
    totals: Counter[str] = Counter()
    for line in (RETRYABLE / "data" / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        totals[event["key"]] += len(event["data"])
    return dict(totals)


async def run_retryable(state: Path) -> Pipeline:
    clock = VirtualClock(1_800_000_000.0)
    pipeline = Pipeline(load_plan(RETRYABLE / "spec.yaml"), state, clock=clock, options=RunOptions(until_drained=True))
    async with clock.autojumping():
        result = await pipeline.run()
    assert result.ok, result
    assert result.drained
    return pipeline


async def test_the_retryable_feedback_loop_counts_every_request_exactly_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = await run_retryable(state)
    totals = {line["key"][0]: line["row"]["total_length"] for line in state_lines(state, name="/state")}
    assert totals == expected_totals()
    assert list(state_lines(state, external=False)) == []  # every request succeeded: request_state cleared
    fired = first.metrics.value("egress_computation_timers_fired_total")
    assert fired > 0  # two thirds of the requests needed retries
    second = await run_retryable(state)  # a second run reads nothing new and changes nothing
    assert second.metrics.value("egress_computation_timers_fired_total") == 0
    assert {line["key"][0]: line["row"]["total_length"] for line in state_lines(state, name="/state")} == totals


async def test_state_dump_prints_committed_rows_as_json_lines(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await run_retryable(state)
    result = CliRunner().invoke(state_app, ["dump", str(state), "--name", "/state"])
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.output.splitlines()]
    assert len(lines) == len(expected_totals())
    assert (lines[0]["kind"], lines[0]["table"]) == ("external", "/state")
    assert {tuple(line["key"]): line["row"]["total_length"] for line in lines} == {
        (k,): v for k, v in expected_totals().items()}
    missing = CliRunner().invoke(state_app, ["dump", str(tmp_path / "nothing")])
    assert missing.exit_code == 1
    assert "no egress state here" in missing.output
    for name in ("/stat", "source"):  # a misspelt table; the source reader's position state, which is not shown
        nothing = CliRunner().invoke(state_app, ["dump", str(state), "--name", name])
        assert nothing.exit_code == 1
        assert nothing.stdout == ""
        assert nothing.stderr == f"egress: no committed rows named {name!r} in {state}; names with rows: /state\n"


def test_dynamic_parameters_are_validated_and_applied_live(tmp_path: Path) -> None:
    plan = load_plan(URL_DOWNLOADER / "spec.yaml", URL_DOWNLOADER / "dynamic_spec.yaml")
    computation = plan.computations["url_downloader"]
    assert computation.dynamic_parameters.check_host_period == 2.0
    assert computation.parameters.fetch == "http"
    job = PartitionJob(computation, 0, streams=plan.streams, partition_count=1, engine=None,  # type: ignore[arg-type]
                       clock=VirtualClock(), metrics=Metrics(), status=None, options=RunOptions(),  # type: ignore[arg-type]
                       notify_downstream=None)
    job.reconfigure_parameters({"check_host_period": "3s", "persist_limit": 10})
    assert job._dynamic_parameters.check_host_period == 3.0
    with pytest.raises(SpecErrors, match=r"computations/url_downloader/processing_function_parameters/"
                                         r"check_host_period: check_host_period must be more than 1 s"):
        job.reconfigure_parameters({"check_host_period": "500ms"})
    assert job._dynamic_parameters.persist_limit == 10  # the previous parameters stay


def test_invalid_static_parameters_name_the_spec_path(tmp_path: Path) -> None:
    spec = (RETRYABLE / "spec.yaml").read_text().replace("delay: 5s", "delay: soon")
    (tmp_path / "spec.yaml").write_text(spec)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "events.jsonl").write_text("")
    with pytest.raises(SpecErrors, match=r"computations/request_processor/processing_function_parameters/delay"):
        load_plan(tmp_path / "spec.yaml")
