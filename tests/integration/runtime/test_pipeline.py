"""Whole pipelines in one process: source → process function → async HTTP sink → a real receiver."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from egress.errors import ProcessFunctionError, SourceDataError, SpecError
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from tests.conftest import ServerFactory, payload_spec

pytestmark = pytest.mark.integration


async def run(spec: Path, dynamic: Path, state: Path) -> tuple[RunResult, Pipeline]:
    pipeline = Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True))
    return await pipeline.run(), pipeline


def source_id(tmp_path: Path, position: int) -> bytes:
    """The id payload_spec's source gives the record at ``position`` (pipeline, source, file)."""
    return source_message_id(source_scope("test_pipeline", "events_jsonl", str(tmp_path / "payloads.jsonl")), 0,
                             position)


def key_of(tmp_path: Path, position: int) -> str:
    return idempotency_key(derived_message_id(source_id(tmp_path, position), 0))


def use_function(spec: Path, function: str) -> None:
    """Make ``spec``'s computation call ``function`` (``package.module:ClassName``)."""
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["processing_function"] = function
    spec.write_text(yaml.safe_dump(document))


@pytest.mark.parametrize(("partition_count", "function"), [
    (1, "tests.pipelines:Passthrough"), (3, "tests.pipelines:Passthrough"), (3, "tests.pipelines:PassthroughMap")])
async def test_every_non_null_payload_arrives_once_under_a_stable_key(
        tmp_path: Path, serve_app: ServerFactory, partition_count: int, function: str) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    payloads = [None if i % 5 == 0 else f'{{"n":{i}}}' for i in range(500)]
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", payloads, partition_count=partition_count)
    use_function(spec, function)
    result, pipeline = await run(spec, dynamic, tmp_path / "state")
    assert result.ok
    assert result.drained
    expected = {key_of(tmp_path, i) for i, p in enumerate(payloads) if p is not None}
    assert set(receiver.stats.delivered_keys) == expected
    assert receiver.stats.requests == len(expected)
    assert pipeline.metrics.total("egress_source_rows_total") == 500


async def test_a_second_run_posts_nothing_that_was_persisted(tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(300)], partition_count=2)
    first, _ = await run(spec, dynamic, tmp_path / "state")
    assert first.drained
    assert receiver.stats.requests == 300
    second, pipeline = await run(spec, dynamic, tmp_path / "state")
    assert second.drained
    assert receiver.stats.requests == 300
    assert pipeline.metrics.total("egress_source_rows_total") == 0


async def test_retries_through_injected_failures_lose_nothing(tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver(ReceiverConfig(fail_rate=0.3, seed=3))
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(400)],
                                 dynamic_parameters={"max_attempt_count": 30})
    result, pipeline = await run(spec, dynamic, tmp_path / "state")
    assert result.drained
    assert len(receiver.stats.delivered_keys) == 400
    assert receiver.stats.by_status[503] > 0
    assert pipeline.metrics.total("egress_sink_retries_total") == receiver.stats.by_status[503]


async def test_a_terminal_failure_blocks_the_partition_and_is_reported(tmp_path: Path,
                                                                        serve_app: ServerFactory) -> None:
    receiver = Receiver(ReceiverConfig(fail_rate=1.0, fail_status=500))
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(20)],
                                 dynamic_parameters={"max_attempt_count": 2})
    result, pipeline = await run(spec, dynamic, tmp_path / "state")
    assert not result.ok
    assert len(result.blocked) == 1
    assert "Async HTTP POST retry policy exhausted" in result.blocked[0]
    error = pipeline.status.error("/sinks/http/async_http_sink") or ""
    assert error.startswith("Async HTTP POST retry policy exhausted")
    assert pipeline.metrics.value("egress_status_broken", path="/sinks/http/async_http_sink") == 1


async def test_a_raising_process_function_names_the_message_and_commits_nothing(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(20)])
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["processing_function"] = "tests.pipelines:FailsOnSeven"
    spec.write_text(yaml.safe_dump(document))
    result, _ = await run(spec, dynamic, tmp_path / "state")
    assert isinstance(result.error, ProcessFunctionError)
    text = str(result.error)
    assert source_id(tmp_path, 7).hex().upper() in text
    assert "with key [7]" in text
    assert "ValueError: cannot handle seven" in text
    assert receiver.stats.requests == 0  # the batch with message 7 was not committed


def test_a_map_to_a_stream_the_computation_does_not_output_is_refused_before_anything_runs(tmp_path: Path) -> None:
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a", "b"])
    use_function(spec, "tests.pipelines:MapToNowhere")
    with pytest.raises(SpecError) as raised:
        load_plan(spec, dynamic)
    assert str(raised.value).startswith(f"{spec}: computations/deliver/processing_function: MapFunction "
                                        "MapToNowhere emits to output_stream_id 'nowhere', which is not one of the "
                                        "computation's output_stream_ids ['requests']: add 'nowhere' to them")


async def test_emitting_to_an_unknown_stream_is_a_clear_error(tmp_path: Path, serve_app: ServerFactory) -> None:
    base = await serve_app(Receiver().app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", ["a"])
    document = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["processing_function"] = "tests.pipelines:EmitsToUnknownStream"
    spec.write_text(yaml.safe_dump(document))
    result, _ = await run(spec, dynamic, tmp_path / "state")
    assert isinstance(result.error, ProcessFunctionError)
    assert "unknown output stream 'nowhere'" in str(result.error)


async def test_a_bad_source_record_stops_the_run_with_file_and_line(tmp_path: Path, serve_app: ServerFactory) -> None:
    base = await serve_app(Receiver().app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", ["a", "b"])
    data = tmp_path / "payloads.jsonl"
    data.write_text(data.read_text() + '{"id": "three", "payload": "c"}\n')
    result, _ = await run(spec, dynamic, tmp_path / "state")
    assert isinstance(result.error, SourceDataError)
    assert f"{data}:3: column id: expected int64" in str(result.error)


async def test_input_held_back_for_a_full_sink_is_read_again_once_acknowledged(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    """Regression: when every acknowledgement arrived before the job's next turn, the job used to go
    idle with input unread (nothing would wake it), and --until-drained stopped early."""
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(200)])
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state",
                        options=RunOptions(until_drained=True, max_unacknowledged=10, epoch_max_messages=10))
    result = await asyncio.wait_for(pipeline.run(), timeout=60)
    assert result.drained
    assert len(receiver.stats.delivered_keys) == 200
