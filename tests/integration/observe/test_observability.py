"""The operator's endpoint of a real run: sink series by computation, lag and latency sensors,
``/readyz`` telling a blocked run from a ready one while ``/healthz`` stays live."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, payload_spec
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class ToFirst(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("first_requests", {"payload": message.row["payload"]})


class ToSecond(ProcessFunction):
    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("second_requests", {"payload": message.row["payload"]})


def two_computations_spec(tmp_path: Path, url: str, count: int) -> Path:
    """Two computations reading one source, each with a sink named ``http`` POSTing to ``url``."""
    data = tmp_path / "payloads.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": i, "payload": f"p{i}"}) + b"\n" for i in range(count)))
    payload = {"schema": [{"name": "payload", "type": "string"}]}

    def computation(function: str, stream: str) -> dict[str, Any]:
        return {"processing_function": f"tests.integration.observe.test_observability:{function}",
                "input_stream_ids": ["events"], "output_stream_ids": [stream],
                "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": [stream],
                                   "parameters": {"url": url, "payload_column": "payload"}}}}

    spec = {
        "pipeline": "two_computations",
        "partition_count": 2,
        "streams": {"events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                               "group_by": ["id"]},
                    "first_requests": payload, "second_requests": payload},
        "sources": {"input": {"source_class_name": "jsonl", "output_stream_id": "events",
                              "parameters": {"path": str(data)}}},
        "computations": {"first": computation("ToFirst", "first_requests"),
                         "second": computation("ToSecond", "second_requests")},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


async def blocking_spec(tmp_path: Path, serve_app: ServerFactory, count: int,
                        partition_count: int = 1) -> tuple[Path, Path]:
    """:func:`payload_spec` of ``count`` payloads to a receiver that answers 500 to everything, with
    2 attempts per delivery: every partition's sink blocks at once."""
    receiver = Receiver(ReceiverConfig(fail_rate=1.0, fail_status=500))
    base = await serve_app(receiver.app)
    return payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(count)],
                        partition_count=partition_count, dynamic_parameters={"max_attempt_count": 2})


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` with exactly ``labels`` in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


async def test_the_sinks_of_two_computations_are_separate_series_with_latency_and_lag(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    pipeline = Pipeline(load_plan(two_computations_spec(tmp_path, f"{base}/in", 40)), tmp_path / "state",
                        http_port=0)
    run = asyncio.create_task(pipeline.run())
    try:
        await eventually(lambda: pipeline.metrics.total("egress_sink_records_delivered_total") == 80)
        assert pipeline.server is not None
        status, text = await get(f"http://{pipeline.server.address}/metrics")
        assert status == 200
        for computation in ("first", "second"):
            labels = {"computation_id": computation, "sink_id": "http"}
            assert sample(text, "egress_sink_records_delivered_total", **labels, sink_class="async_http") == 40
            assert sample(text, "egress_sink_attempt_duration_seconds_count", **labels) == 40
            for partition in ("0", "1"):
                unit = {"computation": computation, "partition": partition}
                assert sample(text, "egress_partition_input_lag", **unit) == 0
                assert sample(text, "egress_partition_input_lag_seconds", **unit) == 0
                assert sample(text, "egress_partition_unacknowledged", **unit, sink_id="http") is not None

        # counted as the jobs take the acknowledgements
        await eventually(lambda: pipeline.metrics.total("egress_sink_delivery_latency_seconds_count") == 80)
        assert pipeline.metrics.value("egress_sink_delivery_latency_seconds_count", computation_id="first") == 40
        assert sample(text, "process_cpu_seconds_total") is not None
    finally:
        pipeline.request_stop()
        assert (await run).ok


async def test_readyz_says_503_with_the_reason_while_a_sink_is_blocked_and_healthz_stays_live(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    spec, dynamic = await blocking_spec(tmp_path, serve_app, 5)
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", http_port=0)
    run = asyncio.create_task(pipeline.run())
    try:
        # `running` turns true when the engine opens, before the status server has bound its port
        await eventually(lambda: pipeline.server is not None and pipeline.server.port is not None and pipeline.running)
        assert pipeline.server is not None
        address = f"http://{pipeline.server.address}"

        async def not_ready() -> bool:
            return (await get(f"{address}/readyz"))[0] == 503

        await eventually(not_ready)
        _, text = await get(f"{address}/readyz")
        ready = orjson.loads(text)
        assert ready["ready"] is False
        assert any("deliver/http partition 0" in reason and "Async HTTP POST retry policy exhausted" in reason
                   for reason in ready["reasons"])
        assert await get(f"{address}/healthz") == (200, "ok\n")
        document = orjson.loads((await get(f"{address}/status"))[1])
        assert document["ready"] == ready
        assert document["running"] is True
    finally:
        pipeline.request_stop()
        await run


async def test_readyz_says_200_once_a_run_delivers(tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(5)])
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", http_port=0)
    run = asyncio.create_task(pipeline.run())
    try:
        await eventually(lambda: receiver.stats.requests == 5 and pipeline.server is not None)
        assert pipeline.server is not None
        status, text = await get(f"http://{pipeline.server.address}/readyz")
        assert (status, orjson.loads(text)) == (200, {"ready": True, "reasons": []})
    finally:
        pipeline.request_stop()
        assert (await run).ok


async def test_egress_status_of_any_worker_shows_every_partition_as_its_owner_reports_it(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    from egress.cli.status import fetch, whole_pipeline
    from egress.runtime.pipeline import shared_sqlite_engine

    spec, dynamic = await blocking_spec(tmp_path, serve_app, 40, partition_count=4)
    options = RunOptions(lease_ttl=2.0, heartbeat_period=0.5, remote_poll_period=0.5, drained_check_period=0.2)
    workers = [Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=options, http_port=0,
                        engine_factory=shared_sqlite_engine, worker_id=name) for name in ("worker-a", "worker-b")]
    runs = [asyncio.create_task(worker.run()) for worker in workers]
    try:
        def both_block_partitions() -> bool:
            return all(w.worker is not None and len(w.worker.members) == 2 and w.jobs
                       and all(job.blocked_error for job in w.jobs) for w in workers) and \
                sum(len(w.jobs) for w in workers) == 4

        await eventually(both_block_partitions, timeout=60)
        a = workers[0]
        assert a.server is not None
        url = f"http://{a.server.address}/status"
        alone = await asyncio.to_thread(fetch, url)
        merged = await asyncio.to_thread(whole_pipeline, alone, url)
        assert sum(1 for p in alone["partitions"] if p.get("blocked")) < 4  # a worker knows its own sinks only
        assert [p.get("blocked") is not None for p in merged["partitions"]] == [True] * 4
        assert {p["owner"] for p in merged["partitions"]} == {"worker-a", "worker-b"}
        assert {key.split(":")[0] for key in merged["status"]} == {"worker-a", "worker-b"}
        assert merged["ready"]["ready"] is False
        assert merged["unreachable"] == []
        assert [s["unread_records"] for s in merged["sources"].values()] == [0]  # read to its end
    finally:
        for worker in workers:
            worker.request_stop()
        await asyncio.gather(*runs)
