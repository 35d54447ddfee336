"""Cluster workers sharing one pipeline, on NATS JetStream and on a shared SQLite state directory:
two workers deliver everything to a real receiver, a joining worker takes its share by orderly
hand-over, and a worker that stops renewing (SIGSTOP) loses its units to the other within the
lease TTL plus a heartbeat and an epoch, then goes on with its share once it runs again."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from egress.engines import Engine, EngineUnavailableError, EpochCommit, MemberInfo, SqliteEngine
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import EngineFactory, Pipeline, RunOptions, RunResult, load_plan
from egress.runtime.cluster.worker import ClusterSpecError
from egress.runtime.layout import LAYOUT_KEY
from egress.runtime.pipeline import nats_engine_factory, shared_sqlite_engine
from egress.runtime.unit import Unit
from tests.conftest import REPO, ServerFactory, payload_spec
from tests.sqlite_pause import pause_outside_write_transaction
from tests.waiting import eventually

pytestmark = pytest.mark.integration

TTL = 2.0
HEARTBEAT = 0.5
OPTIONS = RunOptions(until_drained=True, lease_ttl=TTL, heartbeat_period=HEARTBEAT, remote_poll_period=0.5,
                     drained_check_period=0.2)
SLOW_SINK = {"max_idle_connections": 2}  # 8 requests in flight per partition: a hand-over sends few twice
IN_FLIGHT = 2 * 4  # connections x the sink's send window per connection
PARTITIONS = 4
UNITS = PARTITIONS + 1  # and the source reader
LOADED = 60.0  # seconds a positive signal may take on a machine at load average 10


@dataclass
class Cluster:
    """Workers of one pipeline: ``pipeline`` names it (a NATS bucket of its own per test)."""

    spec: Path
    dynamic: Path
    state: Path
    engine: str
    factory: EngineFactory
    pipeline: str

    def worker(self, worker_id: str, options: RunOptions = OPTIONS, **keywords: object) -> Pipeline:
        return Pipeline(load_plan(self.spec, self.dynamic), self.state, options=options, engine_factory=self.factory,
                        worker_id=worker_id, **keywords)  # type: ignore[arg-type]

    def command(self, worker_id: str) -> list[str]:
        """``egress run`` of a worker of this cluster in another process."""
        engine = ["--shared-state"] if self.engine == "sqlite" else ["--engine", os.environ["EGRESS_TEST_NATS_URL"]]
        return [sys.executable, "-m", "egress", "run", str(self.spec), "--dynamic-spec", str(self.dynamic),
                "--state-dir", str(self.state), "--worker-id", worker_id, "--lease-ttl", str(TTL),
                "--heartbeat-period", str(HEARTBEAT), "--until-drained", "--quiet", *engine]


@pytest.fixture(params=["sqlite", "nats"])
def engine_name(request: pytest.FixtureRequest) -> str:
    if request.param == "nats":
        request.getfixturevalue("nats_server")
    return str(request.param)


def make_cluster(tmp_path: Path, engine: str, url: str, count: int) -> Cluster:
    """A cluster of :func:`payload_spec`'s pipeline under a pipeline name of its own (so that its
    NATS bucket, ``egress_<pipeline>``, is this test's) delivering ``count`` payloads to ``url``."""
    spec, dynamic = payload_spec(tmp_path, url, [f"p{i}" for i in range(count)], partition_count=PARTITIONS,
                                 sink_parameters=SLOW_SINK)
    pipeline = f"cluster_{hashlib.blake2b(str(tmp_path).encode(), digest_size=6).hexdigest()}"
    document = yaml.safe_load(spec.read_text())
    document["pipeline"] = pipeline
    spec.write_text(yaml.safe_dump(document))
    factory = shared_sqlite_engine if engine == "sqlite" else nats_engine_factory([os.environ["EGRESS_TEST_NATS_URL"]])
    return Cluster(spec, dynamic, tmp_path / "state", engine, factory, pipeline)


def expected_keys(cluster: Cluster, count: int) -> set[str]:
    scope = source_scope(cluster.pipeline, "events_jsonl", str(cluster.spec.parent / "payloads.jsonl"))
    return {idempotency_key(derived_message_id(source_message_id(scope, 0, i), 0)) for i in range(count)}


def duplicates(receiver: Receiver) -> int:
    return sum(count - 1 for count in receiver.stats.delivered_keys.values())


def ok(result: RunResult) -> bool:
    return result.ok and result.drained


async def test_two_workers_share_the_pipeline_and_deliver_every_message(
        tmp_path: Path, serve_app: ServerFactory, engine_name: str) -> None:
    receiver = Receiver(ReceiverConfig(delay=0.03))  # about 1,000 msg/s: the run lasts while it is observed
    count = 3000
    cluster = make_cluster(tmp_path, engine_name, f"{await serve_app(receiver.app)}/events", count)
    a, b = cluster.worker("worker-a", http_port=0), cluster.worker("worker-b")
    runs = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    await eventually(lambda: a.worker is not None and len(a.worker.members) == 2 and bool(a.jobs), timeout=LOADED,
                     what="worker-a sees both members and runs a partition job")
    assert a.server is not None
    assert a.server.port is not None
    seen: list[tuple[dict[str, Any], str]] = []

    async def source_owned() -> bool:  # not while the source reader is being handed over
        assert a.server is not None
        seen.append(await observed(f"http://127.0.0.1:{a.server.port}"))
        return seen[-1][0]["sources"]["events_jsonl"]["owner"] is not None

    await eventually(source_owned, timeout=LOADED, what="/status names the source reader's owner")
    status, metrics = seen[-1]
    results = await asyncio.wait_for(asyncio.gather(*runs), 4 * LOADED)
    assert all(ok(r) for r in results), results
    assert set(receiver.stats.delivered_keys) == expected_keys(cluster, count)
    assert duplicates(receiver) <= IN_FLIGHT * UNITS
    assert a.worker is not None
    assert b.worker is not None
    assert a.worker.taken
    assert b.worker.taken  # both ran units
    assert [m["worker_id"] for m in status["members"]] == ["worker-a", "worker-b"]
    owners = {p["owner"] for p in status["partitions"]}
    assert owners <= {"worker-a", "worker-b", None}
    assert len(status["partitions"]) == PARTITIONS
    assert all(isinstance(p["input_lag"], int) for p in status["partitions"])
    assert status["sources"]["events_jsonl"]["owner"] in ("worker-a", "worker-b")
    assert "egress_partition_owned{computation=" in metrics
    assert "egress_partition_input_lag{" in metrics


async def observed(base: str) -> tuple[dict[str, Any], str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/status") as response:
            status = await response.json()
        async with session.get(f"{base}/metrics") as response:
            metrics = await response.text()
    return status, metrics


async def test_a_joining_worker_takes_about_half_the_units_by_orderly_hand_over_sending_nothing_twice(
        tmp_path: Path, serve_app: ServerFactory, engine_name: str) -> None:
    """The donor's last commit waits (up to the worker's 5 s hand-over timeout) for its sinks'
    messages to be acknowledged (the slow receiver answers each after 20 ms, 8 in flight and at
    most 64 held per partition), so the new owner sends none of them again; only a lease lost
    meanwhile (a worker starved past its TTL on a loaded machine) may send some twice."""
    receiver = Receiver(ReceiverConfig(delay=0.02))
    count = 3000
    cluster = make_cluster(tmp_path, engine_name, f"{await serve_app(receiver.app)}/events", count)
    options = dataclasses.replace(OPTIONS, max_unacknowledged=64)
    a = cluster.worker("worker-a", options)
    first = asyncio.create_task(a.run())
    await eventually(lambda: len(a.units.running) == UNITS and receiver.stats.requests >= 300, timeout=LOADED,
                     what="worker-a runs alone")
    b = cluster.worker("worker-b", options)
    second = asyncio.create_task(b.run())
    started = time.monotonic()
    await eventually(lambda: len(b.units.running) in (UNITS // 2, UNITS - UNITS // 2)
                     and len(a.units.running) + len(b.units.running) == UNITS, timeout=LOADED,
                     what="worker-b takes its share")
    took = time.monotonic() - started
    print(f"\n{engine_name}: worker-b ran {len(b.units.running)} of {UNITS} units {took:.2f} s after it started")
    results = await asyncio.wait_for(asyncio.gather(first, second), 4 * LOADED)
    assert all(ok(r) for r in results), results
    assert set(receiver.stats.delivered_keys) == expected_keys(cluster, count)
    assert a.worker is not None
    assert b.worker is not None
    moved = len(a.worker.taken) - UNITS + len(b.worker.taken)  # a took every unit first
    lost = len(a.worker.lost) + len(b.worker.lost)
    print(f"moves {moved}: a {a.worker.taken} lost {a.worker.lost}; b {b.worker.taken} lost {b.worker.lost}; "
          f"{duplicates(receiver)} sent twice")
    assert moved >= 2
    assert duplicates(receiver) <= IN_FLIGHT * lost, (duplicates(receiver), moved, lost)


async def test_a_worker_that_stops_renewing_loses_its_units_within_the_ttl_and_then_goes_on(
        tmp_path: Path, serve_app: ServerFactory, engine_name: str,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    receiver = Receiver(ReceiverConfig(delay=0.01))
    count = 4000
    cluster = make_cluster(tmp_path, engine_name, f"{await serve_app(receiver.app)}/events", count)
    b = cluster.worker("worker-b")
    second = asyncio.create_task(b.run())
    log = tmp_path / "worker-a.log"
    with log.open("wb") as output:
        a = subprocess.Popen(cluster.command("worker-a"), cwd=REPO, stdout=output,  # noqa: ASYNC220
                             stderr=subprocess.STDOUT)
    egress_processes.append(a)
    await eventually(lambda: owners_of(b.engine, "worker-a", at_least=UNITS // 2), timeout=LOADED,
                     what="worker-a takes its share")
    if engine_name == "sqlite":  # a pause inside its write transaction would stall worker-b too (one writer)
        await pause_outside_write_transaction(a.pid, cluster.state)
    else:
        a.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    await eventually(lambda: len(b.units.running) == UNITS, timeout=LOADED, what="worker-b runs every unit")
    failover = time.monotonic() - stopped
    print(f"\n{engine_name}: units of a stopped worker running again on the other {failover:.2f} s after SIGSTOP "
          f"(lease TTL {TTL} s, heartbeat {HEARTBEAT} s)")
    assert failover <= TTL + HEARTBEAT + 2.0  # plus one epoch and the NATS TTL's 1 s granularity
    assert time.monotonic() - stopped >= TTL - 1.0  # not before its leases could lapse
    a.send_signal(signal.SIGCONT)
    results = await asyncio.wait_for(second, 120)
    assert ok(results), results
    assert await asyncio.to_thread(a.wait, 60) == 0, log.read_text()
    assert "lease lost" in log.read_text()
    assert set(receiver.stats.delivered_keys) == expected_keys(cluster, count)


async def owners_of(engine: Engine | None, owner: str, *, at_least: int) -> bool:
    if engine is None:
        return False
    return sum(1 for lease in await engine.leases() if lease.owner == owner) >= at_least


async def test_a_worker_with_another_spec_is_refused_before_it_records_anything(
        tmp_path: Path, serve_app: ServerFactory, engine_name: str) -> None:
    """A Spec that adds a computation would pass the layout check (additions are recorded): the
    cluster's refusal comes first, so the running workers' layout stays as it was."""
    receiver = Receiver(ReceiverConfig(delay=0.05))
    cluster = make_cluster(tmp_path, engine_name, f"{await serve_app(receiver.app)}/events", 2000)
    a = cluster.worker("worker-a")
    first = asyncio.create_task(a.run())
    await eventually(lambda: bool(a.jobs) and receiver.stats.requests > 0, timeout=30, what="worker-a runs")
    assert a.engine is not None
    layout = await a.engine.read_meta(LAYOUT_KEY)
    document = yaml.safe_load(cluster.spec.read_text())
    document["computations"]["audit"] = document["computations"]["deliver"]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(document))
    b = Pipeline(load_plan(other, cluster.dynamic), cluster.state, options=OPTIONS, engine_factory=cluster.factory,
                 worker_id="worker-b")
    with pytest.raises(ClusterSpecError, match=r"other\.yaml: worker worker-a of this pipeline's cluster runs another"):
        await b.run()
    assert await a.engine.read_meta(LAYOUT_KEY) == layout
    a.request_stop()
    assert (await asyncio.wait_for(first, 60)).ok


class OutageAtCommit(SqliteEngine):
    """A shared SQLite engine whose first commit of computation partition 0 meets an engine outage
    (what ``NatsUnavailableError`` is), and which counts the commits of that partition."""

    def __init__(self, *arguments: Any, **keywords: Any) -> None:
        super().__init__(*arguments, **keywords)
        self.outages = 0
        self.commits_after = 0

    async def commit(self, commit: EpochCommit) -> None:
        if commit.consumer == "deliver" and commit.partition == 0:
            if not self.outages:
                self.outages += 1
                raise EngineUnavailableError("the engine gave no usable answer for 60 s (injected)")
            self.commits_after += 1
        await super().commit(commit)


class OutageAtRegister(SqliteEngine):
    """A shared SQLite engine whose membership renewals meet an engine outage after the first two."""

    registered = 0

    async def register(self, member: MemberInfo, ttl: float) -> None:
        self.registered += 1
        if self.registered > 2:
            raise EngineUnavailableError("the engine gave no usable answer for 60 s (injected)")
        await super().register(member, ttl)


def engine_of(kind: type[SqliteEngine], made: list[SqliteEngine]) -> EngineFactory:
    def make(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
        made.append(kind(state_dir, pipeline, synchronous=options.synchronous, shared=True))
        return made[-1]
    return make


async def test_an_engine_outage_met_by_one_job_stops_only_that_job_and_its_unit_runs_again(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver(ReceiverConfig())
    count = 400
    cluster = make_cluster(tmp_path, "sqlite", f"{await serve_app(receiver.app)}/events", count)
    made: list[SqliteEngine] = []
    worker = Pipeline(load_plan(cluster.spec, cluster.dynamic), cluster.state, options=OPTIONS,
                      engine_factory=engine_of(OutageAtCommit, made), worker_id="worker-a")
    result = await asyncio.wait_for(worker.run(), 2 * LOADED)
    assert ok(result), result
    engine = made[0]
    assert isinstance(engine, OutageAtCommit)
    assert engine.outages == 1
    assert engine.commits_after > 0  # the unit was taken again and committed
    assert worker.worker is not None
    assert [unit for unit, _ in worker.worker.lost] == [Unit.computation("deliver", 0)]
    assert [unit for unit, _ in worker.worker.taken].count(Unit.computation("deliver", 0)) == 2
    assert set(receiver.stats.delivered_keys) == expected_keys(cluster, count)


async def test_a_worker_whose_membership_renewal_meets_an_engine_outage_ends(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver(ReceiverConfig(delay=0.05))
    cluster = make_cluster(tmp_path, "sqlite", f"{await serve_app(receiver.app)}/events", 2000)
    made: list[SqliteEngine] = []
    worker = Pipeline(load_plan(cluster.spec, cluster.dynamic), cluster.state, options=OPTIONS,
                      engine_factory=engine_of(OutageAtRegister, made), worker_id="worker-a")
    result = await asyncio.wait_for(worker.run(), LOADED)
    assert isinstance(result.error, EngineUnavailableError), result
    assert "worker worker-a: its membership could not be renewed" in str(result.error)
    assert not result.drained
