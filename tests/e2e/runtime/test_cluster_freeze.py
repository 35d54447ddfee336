"""NATS that stops answering without closing anything, end to end: real ``egress run`` workers,
a real nats-server, a receiver that answers in 10 ms.

* The nats-server SIGSTOPped for three lease TTLs mid-run, then SIGCONTed: every connection
  stays open and nothing answers, so no commit or renewal completes. The workers' sinks finish
  the deliveries in flight and start no new one (commit backpressure, then the lease lapsing by
  the worker's clock): every flight arrives, duplicates stay under a tenth of the flights, and
  ``--until-drained`` ends both workers with 0.
* One worker behind a TCP proxy that stops forwarding without closing (a blackhole) for as long,
  and at least until the other worker holds every partition: the same assertions.

Without the holds the workers POST for the whole freeze what they can never commit, and the
next owner of each partition sends it all again (about 85 % duplicates here).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from examples.cluster.demo import Leases

from tests.blackhole import Blackhole
from tests.e2e.conftest import Receiver
from tests.e2e.runtime.test_cluster_faults import (
    LEASE_TTL,
    Delivery,
    Workers,
    flights_of,
    receiver_count,
    wait_for_deliveries,
    workers_to_stop,
)
from tests.nats_server import NatsServer
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

__all__ = ["workers_to_stop"]  # the fixture, imported to be used here

ROWS = 6_000  # flights: at the receiver's 10 ms per request, seconds of work left when the fault comes
BEFORE_FAULT = 1_000  # flights delivered before the fault: both workers are running their share
FREEZE = 3 * LEASE_TTL  # seconds: every lease lapses meanwhile, by the workers' clocks and the server's
DUPLICATES_SHARE = 0.10  # at most this share of the flights arrives twice
PARTITIONS = 4


@pytest.fixture
def flights(tmp_path: Path) -> Iterator[tuple[Receiver, Path, dict[str, int]]]:
    yield from flights_of(tmp_path, ROWS)


def check(receiver: Receiver, expected: dict[str, int], before: int, fault: str) -> None:
    """0 flights missing, duplicates at most :data:`DUPLICATES_SHARE` of them, and the fault came mid-run."""
    delivery = Delivery.read(receiver.record)
    share = len(delivery.again) / len(expected)
    print(f"\n{fault}: {len(expected):,} flights, {before:,} delivered before it; 0 missing, "
          f"{len(delivery.again):,} duplicates ({share:.1%})")
    assert sorted(set(expected) - set(delivery.first)) == [], "flights missing at the receiver"
    assert share <= DUPLICATES_SHARE, f"{len(delivery.again):,} duplicates of {len(expected):,} flights"
    assert before < len(expected), "the fault must come while flights are left to deliver"


@pytest.mark.timeout(180)
def test_a_frozen_nats_server_costs_few_duplicates_and_loses_nothing(
        tmp_path: Path, own_nats_server: NatsServer, flights: tuple[Receiver, Path, dict[str, int]],
        workers_to_stop: list[Workers]) -> None:
    receiver, spec, expected = flights
    workers = Workers(spec, own_nats_server.url, tmp_path, count=2)
    workers_to_stop.append(workers)
    workers.start_all()
    wait_for_deliveries(receiver, BEFORE_FAULT, workers)
    own_nats_server.freeze()
    before = receiver_count(receiver)
    try:
        time.sleep(FREEZE)  # the fault's length, not a wait for something to happen
    finally:
        own_nats_server.thaw()
    workers.wait_all()
    check(receiver, expected, before, f"nats-server SIGSTOPped for {FREEZE:g} s (lease TTL {LEASE_TTL:g} s)")


@pytest.mark.timeout(180)
def test_a_worker_behind_a_blackhole_costs_few_duplicates_and_loses_nothing(
        tmp_path: Path, own_nats_server: NatsServer, flights: tuple[Receiver, Path, dict[str, int]],
        workers_to_stop: list[Workers]) -> None:
    receiver, spec, expected = flights
    blackhole = Blackhole(own_nats_server.port)
    behind = Workers(spec, f"nats://127.0.0.1:{blackhole.start()}", tmp_path, count=1)
    direct = Workers(spec, own_nats_server.url, tmp_path, count=1)
    workers_to_stop.extend([behind, direct])
    leases = Leases(own_nats_server.url, yaml.safe_load(spec.read_text())["pipeline"])
    try:
        behind.start("w1")
        direct.start("w2")
        wait_for_deliveries(receiver, BEFORE_FAULT, behind)
        assert "w1" in leases.owners("to_json").values(), "w1 must run partitions when it is cut off"
        blackhole.stall()
        cut = time.monotonic()
        before = receiver_count(receiver)
        eventually_sync(lambda: set(leases.owners("to_json").values()) == {"w2"}
                        and len(leases.owners("to_json")) >= PARTITIONS,
                        what="w2 taking w1's partitions", timeout=60, interval=0.05, details=lambda: direct.log("w2"))
        taken = time.monotonic() - cut
        time.sleep(max(0.0, cut + FREEZE - time.monotonic()))  # the fault's length, as the freeze's
        blackhole.flow()
        behind.wait_all()
        direct.wait_all()
    finally:
        blackhole.stop()
        leases.close()
    check(receiver, expected, before,
          f"w1 behind a blackhole for {FREEZE:g} s, w2 holding every partition after {taken:.1f} s")
