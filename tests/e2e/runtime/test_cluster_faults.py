"""The cluster under faults, end to end: real ``egress run --engine nats://…`` worker processes,
real nats-servers, real SIGKILL.

* The demo's flights pipeline on 3 workers: a random worker SIGKILLed and restarted (same worker
  id) every second or so, 20 times, and the nats-server itself SIGKILLed and restarted on its
  store once: every flight arrives; a flight arrives twice only when its partition changed hands
  between the two deliveries (a lease taken over after a kill, or handed over when the restarted
  worker joined again: the request was in flight then); the duplicates are counted and printed.
* The retryable async request example under the same treatment: every key's ``total_length`` is
  exactly the sum of its requests (internal state exactly once), no request left in retry state.
* The flights on a 3-node NATS cluster with R3 streams: the stream leader's node SIGKILLed
  mid-run and restarted later: every flight arrives.

The kill schedule is seeded (``EGRESS_CLUSTER_SEED``) and printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
import yaml
from examples.cluster.demo import key_partitions, write_data, write_spec

from egress.engines.nats import NatsEngine
from egress.rows import decode_row
from tests.e2e.conftest import (
    REPO,
    Receiver,
    hold_after,
    launch_receiver,
    receiver_stats,
    release,
    stop_receiver,
)
from tests.e2e.runtime.test_exactly_once import write_pipeline
from tests.nats_server import NatsCluster, NatsServer
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("EGRESS_CLUSTER_SEED", "20261201"))
WORKERS = 3
KILLS = 20
NATS_RESTART_AT = 10  # the nats-server is killed and restarted with this kill
RETRYABLE_NATS_RESTART_AT = 0  # ... in the retryable test, whose work can end within three kills
RETRY_DELAY = "3s"  # of the retryable test: a request still in retry state before the restart waits this long
KILL_GAP = (0.6, 1.4)  # seconds between two kills
LEASE_TTL = 2.0
ROWS = 12_000  # flights: more than the 20 kills let the receiver answer (below), so each kill lands mid-delivery
ANSWERED_PER_KILL = 400  # requests the receiver answers between two kills, then it holds the rest: 20 × (400 +
# the few dozen held at a kill) is fewer than the flights, whatever the machine's speed
RECEIVER_DELAY = "0.01"  # seconds per request
IN_FLIGHT_SLACK = 0.5  # seconds: a request sent before a kill may be recorded by the receiver just after it
DRAIN_TIMEOUT = 180.0
DYNAMIC_SPEC = REPO / "examples" / "http_delivery" / "dynamic_spec.yaml"
R3_ROWS = 6_000  # flights of the 3-node test: one kill of a node, a fifth delivered before and after it
EVENTS = 8_000  # requests: the restart and the first kills land while they are counted
KEYS = 40


@dataclass
class Workers:
    """``count`` ``egress run`` workers ``w1`` … on one Spec and NATS URL, each with its own state
    directory and log (appended over restarts); ``events`` are the wall times of kills and restarts."""

    spec: Path
    engine: str
    directory: Path
    count: int = WORKERS
    options: list[str] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)

    def start(self, worker: str) -> None:
        with (self.directory / f"{worker}.log").open("ab") as log:
            self.processes[worker] = subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(self.spec), "--engine", self.engine, "--worker-id", worker,
                 "--lease-ttl", f"{LEASE_TTL:g}", "--state-dir", str(self.directory / worker), "--until-drained",
                 "--quiet", *self.options], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def start_all(self) -> None:
        for number in range(1, self.count + 1):
            self.start(f"w{number}")

    def kill_and_restart(self, worker: str) -> None:
        process = self.processes[worker]
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.events.append((time.time(), f"{worker} killed"))
        self.start(worker)

    def wait_all(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Every worker ends (the pipeline drained) with exit code 0, or the test fails with its log."""
        deadline = time.monotonic() + timeout
        for worker, process in self.processes.items():
            try:
                code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{worker} did not end within {timeout:g} s:\n{self.log(worker)}")
            assert code == 0, f"{worker} exited {code}:\n{self.log(worker)}"

    def log(self, worker: str) -> str:
        return (self.directory / f"{worker}.log").read_text(errors="replace")[-3000:]

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


class LeaseWatch:
    """Polls the pipeline's leases (``NatsEngine.leases()``, every 50 ms, in a thread of its own)
    and records each change of a ``consumer`` partition's generation as ``(after, before, partition)``:
    it changed hands between those two wall times."""

    def __init__(self, urls: list[str], pipeline: str, consumer: str, replicas: int = 1) -> None:
        self.changes: list[tuple[float, float, int]] = []
        self._urls, self._pipeline, self._consumer, self._replicas = urls, pipeline, consumer, replicas
        self._stop = threading.Event()
        self._polled = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)
        self._thread.start()
        assert self._polled.wait(30), "the lease watch did not open the engine within 30 s"

    async def _watch(self) -> None:
        engine = NatsEngine(self._urls, self._pipeline, replicas=self._replicas)  # as the workers: unchanged
        await engine.open()
        try:
            seen: dict[int, int] = {}
            polled = time.time()
            while not self._stop.is_set():
                leases = await engine.leases()
                now = time.time()
                for lease in leases:
                    if lease.consumer == self._consumer:
                        if seen.get(lease.partition, lease.generation) != lease.generation:
                            self.changes.append((polled, now, lease.partition))
                        seen[lease.partition] = lease.generation
                polled = now
                self._polled.set()
                await asyncio.sleep(0.05)
        finally:
            await engine.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture
def workers_to_stop() -> Iterator[list[Workers]]:
    made: list[Workers] = []
    yield made
    for workers in made:
        workers.stop_all()


def torture(workers: Workers, server: NatsServer, rng: random.Random,
            after_kill: Callable[[int], None] | None = None, *, nats_restart_at: int = NATS_RESTART_AT,
            before_kill: Callable[[], None] = lambda: None,
            before_nats_restart: Callable[[], None] = lambda: None) -> None:
    """:data:`KILLS` kills of a random worker, each restarted at once, each once ``before_kill()``
    returned (a positive signal that work is left); the nats-server killed and restarted on its
    store with kill ``nats_restart_at`` (0-based), once ``before_nats_restart()`` returned;
    ``after_kill(n)`` after kill ``n``."""
    for number in range(KILLS):
        time.sleep(rng.uniform(*KILL_GAP))
        before_kill()
        victim = rng.choice(sorted(workers.processes))
        workers.kill_and_restart(victim)
        if number == nats_restart_at:
            before_nats_restart()
            server.kill()
            workers.events.append((time.time(), "nats-server killed"))
            server.start()
            workers.events.append((time.time(), "nats-server restarted"))
        if after_kill is not None:
            after_kill(number)


# -- the flights -----------------------------------------------------------------------------------


@dataclass
class Delivery:
    """What the receiver's record shows: the first 2xx time of each key and every later 2xx."""

    first: dict[str, float] = field(default_factory=dict)
    again: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def read(cls, record: Path) -> Delivery:
        delivery = cls()
        with record.open(encoding="utf-8") as lines:
            # A held request is written when answered, with the time it was read: order by that time.
            for entry in sorted(map(json.loads, lines), key=lambda entry: float(entry["time"])):
                if 200 <= entry["status"] <= 299:
                    key = entry["idempotency_key"]
                    if key in delivery.first:
                        delivery.again.append((key, entry["time"]))
                    else:
                        delivery.first[key] = entry["time"]
        return delivery


def receiver_count(receiver: Receiver) -> int:
    return int(receiver_stats(receiver)["distinct_keys"])


def receiver_held(receiver: Receiver) -> int:
    return int(receiver_stats(receiver)["held"])


def wait_for_deliveries(receiver: Receiver, count: int, workers: Workers, timeout: float = 60.0) -> None:
    eventually_sync(lambda: receiver_count(receiver) >= count, what=f"{count} deliveries", timeout=timeout,
                    interval=0.02, details=lambda: workers.log("w1"))


def check_flights(record: Path, expected: dict[str, int], changes: list[tuple[float, float, int]]) -> Delivery:
    """0 missing, nothing unexpected, and each duplicate sent across a change of hands of its
    partition (``changes``, from :class:`LeaseWatch`)."""
    delivery = Delivery.read(record)
    assert sorted(set(expected) - set(delivery.first)) == [], "flights missing at the receiver"
    assert sorted(set(delivery.first) - set(expected)) == [], "requests that are no flight"
    outside = [(key, delivery.first[key], moment) for key, moment in delivery.again
               if not any(partition == expected[key] and delivery.first[key] - IN_FLIGHT_SLACK <= before
                          and after <= moment for after, before, partition in changes)]
    assert outside == [], f"duplicates whose partition did not change hands in between: {outside[:5]}"
    return delivery


def flights_of(tmp_path: Path, rows: int) -> Iterator[tuple[Receiver, Path, dict[str, int]]]:
    """A receiver (slowed a little), the Spec of the first ``rows`` flights pointing at it, and each
    flight's key → partition."""
    receiver = launch_receiver(tmp_path / "received.jsonl", "--delay", RECEIVER_DELAY)
    try:
        data = write_data(tmp_path, rows)
        spec, loaded = write_spec(tmp_path, data, receiver.port)
        yield receiver, spec, key_partitions(loaded, data)
    finally:
        stop_receiver(receiver)


@pytest.fixture
def flights(tmp_path: Path) -> Iterator[tuple[Receiver, Path, dict[str, int]]]:
    yield from flights_of(tmp_path, ROWS)


@pytest.fixture
def fewer_flights(tmp_path: Path) -> Iterator[tuple[Receiver, Path, dict[str, int]]]:
    """:data:`R3_ROWS` flights: the node is killed after a fifth and a fifth more must arrive after it."""
    yield from flights_of(tmp_path, R3_ROWS)


@pytest.mark.timeout(300)
def test_flights_on_three_workers_lose_nothing_through_20_worker_kills_and_a_nats_restart(
        tmp_path: Path, own_nats_server: NatsServer, flights: tuple[Receiver, Path, dict[str, int]],
        workers_to_stop: list[Workers]) -> None:
    receiver, spec, expected = flights
    rng = random.Random(SEED)
    workers = Workers(spec, own_nats_server.url, tmp_path, options=["--dynamic-spec", str(DYNAMIC_SPEC)])
    workers_to_stop.append(workers)
    watch = LeaseWatch([own_nats_server.url], yaml.safe_load(spec.read_text())["pipeline"], "to_json")
    hold_after(receiver, ANSWERED_PER_KILL)
    workers.start_all()
    wait_for_deliveries(receiver, 1, workers)

    def held() -> None:  # the receiver holds the rest: the kill lands mid-delivery
        eventually_sync(lambda: receiver_held(receiver), what="the receiver holding a request")

    def answer_more(number: int) -> None:
        hold_after(receiver, receiver_held(receiver) + ANSWERED_PER_KILL)

    try:
        torture(workers, own_nats_server, rng, answer_more, before_kill=held)
        tortured = time.time()
        release(receiver)
        workers.wait_all()
    finally:
        watch.stop()
    delivery = check_flights(receiver.record, expected, watch.changes)
    done = max(delivery.first.values())
    during = sum(1 for moment, what in workers.events if what.startswith("w") and moment < done)
    print(f"\nseed {SEED}: {len(expected):,} flights, {KILLS} worker kills and a nats-server restart in "
          f"{tortured - workers.events[0][0]:.1f} s, {during} of them before the last flight arrived; "
          f"{len(watch.changes)} changes of hands of a to_json partition; 0 missing, {len(delivery.again):,} "
          "duplicates, each in flight when its partition changed hands")
    assert during >= KILLS // 2, "most kills must land while the flights are being delivered"


# -- the retryable example ---------------------------------------------------------------------------


async def committed_totals(url: str, loaded: dict[str, Any]) -> tuple[dict[str, int], int]:
    """``total_length`` per key in the external state ``/state``, and how many requests are still
    in ``request_processor``'s retry state, as the NATS bucket of the Spec ``loaded`` holds them."""
    partitions = int(loaded["partition_count"])
    engine = NatsEngine(url, loaded["pipeline"])
    await engine.open()
    try:
        totals: dict[str, int] = {}
        retrying = 0
        for partition in range(partitions):
            keeper = await engine.load_keyed_state("state_keeper", partition, partitions, ["/state"])
            for key, row in keeper.external["/state"].items():
                totals[orjson.loads(key)[0]] = decode_row(row)["total_length"]
            processor = await engine.load_keyed_state("request_processor", partition, partitions, [])
            retrying += sum(len(values) for values in processor.internal.values())
    finally:
        await engine.close()
    return totals, retrying


async def committed_positions(url: str, loaded: dict[str, Any]) -> dict[str, object]:
    """What a failure report needs: each stream partition's end offset and each computation
    partition's committed input positions."""
    partitions = int(loaded["partition_count"])
    engine = NatsEngine(url, loaded["pipeline"])
    await engine.open()
    try:
        found: dict[str, object] = {}
        for stream in loaded["streams"]:
            found[f"end {stream}"] = [await engine.end_offset(stream, p) for p in range(partitions)]
        for computation in loaded["computations"]:
            for partition in range(partitions):
                checkpoint = await engine.load_checkpoint(computation, partition, [])
                found[f"{computation} {partition}"] = checkpoint.input_positions
        return found
    finally:
        await engine.close()


@pytest.mark.timeout(300)
def test_retryable_totals_are_exact_through_20_worker_kills_and_a_nats_restart(
        tmp_path: Path, own_nats_server: NatsServer, workers_to_stop: list[Workers]) -> None:
    rng = random.Random(SEED)
    spec, expected = write_pipeline(tmp_path, rng, EVENTS, KEYS, RETRY_DELAY)
    loaded = yaml.safe_load(spec.read_text())
    workers = Workers(spec, own_nats_server.url, tmp_path)
    workers_to_stop.append(workers)
    workers.start_all()
    eventually_sync(lambda: sum(asyncio.run(committed_totals(own_nats_server.url, loaded))[0].values()),
                    what="the first response counted", timeout=60, interval=0.1, details=lambda: workers.log("w1"))
    counted: dict[int, int] = {}
    pending: list[int] = []

    def sample(number: int) -> None:  # how much was counted at a few kills
        if number % 5 == 4 or number == RETRYABLE_NATS_RESTART_AT:
            counted[number + 1] = sum(asyncio.run(committed_totals(own_nats_server.url, loaded))[0].values())

    def work_left() -> int:
        pending.append(asyncio.run(committed_totals(own_nats_server.url, loaded))[1])
        return pending[-1]

    # The server restarts early (with the 1st kill), once requests are committed in retry state:
    # they wait RETRY_DELAY before their next attempt, so the restart lands while that work is left
    # (a restart after the last response would prove nothing about state).
    torture(workers, own_nats_server, rng, sample, nats_restart_at=RETRYABLE_NATS_RESTART_AT,
            before_nats_restart=lambda: eventually_sync(work_left, what="requests committed in retry state"))
    workers.wait_all()
    totals, retrying = asyncio.run(committed_totals(own_nats_server.url, loaded))
    print(f"\nseed {SEED}: {EVENTS:,} events over {KEYS} keys, {sum(expected.values()):,} bytes of requests; "
          f"{KILLS} worker kills and a nats-server restart; bytes counted after kills "
          f"{', '.join(f'{n}: {c:,}' for n, c in counted.items())}; in the end {sum(totals.values()):,}")
    over = {key: (total, expected[key]) for key, total in totals.items() if total > expected[key]}
    assert over == {}, (f"keys counted beyond their requests (total, expected): {over}; committed: "
                        f"{asyncio.run(committed_positions(own_nats_server.url, loaded))}")
    assert totals == dict(expected)
    assert retrying == 0, "requests still in retry state"
    print(f"{pending[-1]} requests committed in retry state at the nats-server restart")


# -- a 3-node cluster, R3 ----------------------------------------------------------------------------


async def stream_leader(url: str, stream: str) -> str:
    connection = await nats.connect(url)
    try:
        info = await connection.jetstream().stream_info(stream)
    finally:
        await connection.close()
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert info.cluster.leader is not None
    return info.cluster.leader


@pytest.mark.timeout(300)
def test_flights_on_a_three_node_cluster_with_r3_streams_lose_nothing_when_the_leaders_node_is_killed(
        tmp_path: Path, nats_cluster: NatsCluster, fewer_flights: tuple[Receiver, Path, dict[str, int]],
        workers_to_stop: list[Workers]) -> None:
    receiver, spec, expected = fewer_flights
    engine = "nats://" + ",".join(url.removeprefix("nats://") for url in nats_cluster.urls)
    workers = Workers(spec, engine, tmp_path, options=["--dynamic-spec", str(DYNAMIC_SPEC), "--replicas", "3"])
    workers_to_stop.append(workers)
    pipeline = yaml.safe_load(spec.read_text())["pipeline"]
    watch = LeaseWatch(nats_cluster.urls, pipeline, "to_json", replicas=3)  # from the start: the first hand-overs too
    hold_after(receiver, len(expected) // 5)  # then the rest is held: the node is killed mid-delivery
    workers.start_all()
    eventually_sync(lambda: receiver_held(receiver),
                    what="the receiver holding a request after a fifth of the flights", timeout=120)
    leader = asyncio.run(stream_leader(nats_cluster.urls[0], f"KV_egress_{pipeline}"))
    node = int(leader.removeprefix("n"))
    before = receiver_count(receiver)
    nats_cluster.kill(node)
    killed = time.time()
    workers.events.append((killed, f"node {leader} killed"))
    release(receiver)
    wait_for_deliveries(receiver, before + len(expected) // 5, workers)
    resumed = time.time()
    nats_cluster.restart(node)
    workers.events.append((time.time(), f"node {leader} restarted"))
    try:
        workers.wait_all()
    finally:
        watch.stop()
    delivery = check_flights(receiver.record, expected, watch.changes)
    print(f"\n{len(expected):,} flights on 3 workers and a 3-node cluster (R3); stream leader {leader} SIGKILLed "
          f"after {before:,} deliveries, {len(expected) // 5:,} more arrived {resumed - killed:.2f} s later; "
          f"0 missing, {len(delivery.again):,} duplicates")
