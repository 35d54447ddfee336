"""End to end: ``egress run`` killed with SIGKILL mid-delivery, then run again to the end.

Real processes, real receiver, no mocks. One ``egress receiver --record`` serves the whole test.
The January 2013 example pipeline is started ``KILLS`` times on one state directory; the receiver
answers a seeded random count of each run's requests, then holds the rest unanswered, and the run
is killed with SIGKILL a seeded moment after the first request was held (so every kill lands
mid-delivery whatever the machine's speed: at most ``KILLS`` × the largest count is answered before
the last kill, fewer than the flights); a final ``--until-drained`` run must exit 0. The receiver's
record then has to show that:

* every non-null message arrived: the idempotency keys answered 2xx are exactly one per
  non-cancelled flight, computed here from the CSV and the documented message id layout;
* the key is a function of the message: each key always carries the same body, that body is the
  flight's JSON, and no body is sent under two keys;
* duplicates come only from kills: no key is delivered twice within one run, and every key
  delivered again after a kill was delivered before it and was still in flight at it, i.e. in
  the committed but unacknowledged part of the sink's outbox, which is read from the (dead)
  process's SQLite state after each kill and is bounded by the unacknowledged window.

Each run sends an extra header naming its run number (a static sink parameter: it changes no
message id and no body), which attributes every recorded request to the run that sent it exactly,
even a request the receiver read after its sender was killed.

Kill points are printed (``pytest -s``); ``EGRESS_KILL_SEED`` picks other ones.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from egress.engines.sqlite import read_outbox
from egress.runtime import RunOptions
from tests.e2e.conftest import (
    COMPUTATION_ID,
    DATA,
    RUN_HEADER,
    SINK_ID,
    SOURCE_ID,
    SPEC,
    Receiver,
    hold_after,
    receiver_stats,
    release,
    start_run,
    wait_for_first_request,
    wait_until_held,
    write_spec,
)
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e


EXPECTED_DELIVERIES = 26_483  # non-cancelled January flights (dep_time not NA)

KILLS = 6
MIN_KILLS = 5
SEED = int(os.environ.get("EGRESS_KILL_SEED", "20130101"))
ANSWERED_PER_RUN = (100, 3000)  # requests the receiver answers in each killed run before it holds the rest:
# 6 × 3,000 (and what the killed runs held, a few hundred each) is fewer than the 26,483 messages
KILL_DELAY = (0.0, 0.3)  # seconds after the receiver held the run's first request: mid-wait or mid-commit
FINAL_RUN_TIMEOUT = 120.0


# -- the committed state after a kill ------------------------------------------------------------


@dataclass
class InFlight:
    """The sink's committed but unacknowledged outbox at a kill: what a restart must resend."""

    keys: set[str] = field(default_factory=set)  # non-null payloads: each is a request to resend
    per_partition: Counter[int] = field(default_factory=Counter)  # all messages, null ones included


def read_in_flight(state: Path) -> InFlight:
    """Read the dead process's SQLite state (read-only: recovery is left to the next run)."""
    database = sqlite3.connect(f"{(state / 'egress.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        acknowledged = dict(database.execute(
            "SELECT partition, max_persisted_seq_no FROM sink_progress WHERE consumer = ? AND sink = ?",
            (COMPUTATION_ID, SINK_ID)).fetchall())
    finally:
        database.close()
    in_flight = InFlight()
    for consumer, partition, message in read_outbox(state):
        if consumer == COMPUTATION_ID and message.seq > acknowledged.get(partition, 0):
            in_flight.per_partition[partition] += 1
            if message.row["payload"] is not None:
                in_flight.keys.add(message.message_id.hex().upper())
    return in_flight


# -- the expectation, computed independently from the data ---------------------------------------


def message_key(position: int) -> str:
    """The idempotency key of the only output of the flight at 0-based record ``position``:
    ``blake2b(pipeline 0x1F source id 0x1F path)[:8] || source partition u32 || position u64 ||
    output index u16``, hex (the path as the test's spec names it)."""
    message_id = _source_prefix() + (0).to_bytes(4, "big") + position.to_bytes(8, "big") + (0).to_bytes(2, "big")
    return message_id.hex().upper()


@functools.cache
def _source_prefix() -> bytes:
    """The 8-byte scope of the test's source (computed once: the Spec is parsed for it)."""
    pipeline = yaml.safe_load(SPEC.read_text())["pipeline"]
    return hashlib.blake2b("\x1f".join((pipeline, SOURCE_ID, str(DATA))).encode(), digest_size=8).digest()


def expected_bodies() -> dict[str, str]:
    """One request per non-cancelled flight: its key and the sha256 of its JSON body (the row in
    schema order, typed, NA as null in nullable columns, as ``FlightToJson`` serialises it)."""
    spec = yaml.safe_load(SPEC.read_text())
    schema = spec["streams"]["flights"]["schema"]
    parse = {"int64": int, "double": float, "string": str}
    bodies: dict[str, str] = {}
    with gzip.open(DATA, "rt", newline="") as text:
        for position, raw in enumerate(csv.DictReader(text)):
            if raw["dep_time"] in ("", "NA"):
                continue
            row: dict[str, Any] = {}
            for column in schema:
                name, kind = column["name"], column["type"]
                nullable = kind != "string" or not column.get("required", False)
                row[name] = None if raw[name] in ("", "NA") and nullable else parse[kind](raw[name])
            bodies[message_key(position)] = hashlib.sha256(orjson.dumps(row)).hexdigest()
    return bodies


# -- the test ------------------------------------------------------------------------------------


@dataclass
class Request:
    time: float
    run: int
    key: str
    body: str
    status: int


@dataclass
class Kill:
    run: int
    started: float  # wall times
    first_request: float
    killed: float  # reaped: the process is gone
    in_flight: InFlight


def load_record(record: Path) -> list[Request]:
    requests = []
    for entry in recorded(record):
        assert (entry["method"], entry["path"]) == ("POST", "/events"), entry
        key = entry["idempotency_key"]
        assert key, f"a request without an idempotency key: {entry}"
        run = int(entry["headers"][RUN_HEADER])
        requests.append(Request(entry["time"], run, key, entry["body_sha256"], entry["status"]))
    return requests


def some(items: Any, count: int = 5) -> list[Any]:
    return sorted(items)[:count]


@pytest.mark.timeout(300)
def test_sigkill_mid_delivery_then_restart_delivers_all_and_duplicates_only_in_flight_messages(
    tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]],
) -> None:
    """SIGKILL ``KILLS`` runs mid-delivery and finish with ``--until-drained``: every non-null
    message arrives under its stable key with its own body, and duplicates are only messages that
    were delivered before a kill and still unacknowledged in the committed state at it."""
    state = tmp_path / "state"
    rng = random.Random(SEED)
    print(f"\nseed {SEED}, receiver on port {receiver.port}")

    kills: list[Kill] = []
    for run in range(KILLS):
        spec = write_spec(tmp_path, receiver.port, run)
        answered = rng.randint(*ANSWERED_PER_RUN)
        hold_after(receiver, receiver_stats(receiver)["held"] + answered)  # what the killed run left held first
        started = time.time()
        process, log = start_run(egress_processes, tmp_path, spec, state, run, until_drained=False)
        first_request = wait_for_first_request(receiver.record, run, process, log)
        held = wait_until_held(receiver, process, log)["held"]
        delay = rng.uniform(*KILL_DELAY)
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        killed = time.time()
        assert process.returncode == -signal.SIGKILL, (
            f"run {run} ended by itself ({process.returncode}) before the kill:\n{log.read_text()}")
        in_flight = read_in_flight(state)
        kills.append(Kill(run, started, first_request, killed, in_flight))
        per_partition = dict(sorted(in_flight.per_partition.items()))
        print(f"kill {run}: {killed - started:.2f} s after start ({first_request - started:.2f} s to the "
              f"first request; {answered} answered, then {held} held and {delay:.3f} s); {len(in_flight.keys)} "
              f"requests in flight, unacknowledged per partition {per_partition}")

    release(receiver)
    final_run = KILLS
    spec = write_spec(tmp_path, receiver.port, final_run)
    final_started = time.time()
    process, log = start_run(egress_processes, tmp_path, spec, state, final_run, until_drained=True)
    returncode = process.wait(timeout=FINAL_RUN_TIMEOUT)
    assert returncode == 0, f"the final --until-drained run exited {returncode}:\n{log.read_text()}"
    print(f"final run: drained in {time.time() - final_started:.2f} s")
    left = read_in_flight(state)
    assert not left.per_partition, f"unacknowledged outbox after the drained run: {left.per_partition}"

    # Every request the receiver read was answered, so the record is complete: the final run saw
    # every response it waited for, and what killed runs left held was answered before it started.
    requests = load_record(receiver.record)
    expected = expected_bodies()
    assert len(expected) == EXPECTED_DELIVERIES
    assert message_key(0)[16:] == "0" * 28  # partition 0, position 0, output 0 after the 8-byte scope prefix

    assert {r.status for r in requests} == {200}, "the receiver injects no failures"
    delivered = [r for r in requests if 200 <= r.status <= 299]
    by_key: dict[str, list[Request]] = defaultdict(list)
    for request in sorted(delivered, key=lambda r: (r.time, r.run)):
        by_key[request.key].append(request)

    # (a) Every non-null message delivered, and nothing else.
    missing = expected.keys() - by_key.keys()
    unexpected = by_key.keys() - expected.keys()
    assert not missing, f"{len(missing)} messages never delivered, e.g. {some(missing)}"
    assert not unexpected, f"{len(unexpected)} keys that are no January flight, e.g. {some(unexpected)}"

    # (b) The key is a function of the message: one body per key (the flight's JSON), one key per body.
    bodies_of: dict[str, set[str]] = defaultdict(set)
    keys_of: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        bodies_of[request.key].add(request.body)
        keys_of[request.body].add(request.key)
    changed = {k for k, bodies in bodies_of.items() if len(bodies) > 1}
    shared = {b for b, keys in keys_of.items() if len(keys) > 1}
    wrong = {k for k, bodies in bodies_of.items() if bodies != {expected.get(k)}}
    assert not changed, f"{len(changed)} keys were sent with different bodies, e.g. {some(changed)}"
    assert not shared, f"{len(shared)} bodies were sent under several keys, e.g. {some(shared)}"
    assert not wrong, f"{len(wrong)} keys carried another body than their flight's JSON, e.g. {some(wrong)}"

    # (c) Duplicates only for messages in flight at a kill. The run header says which process sent
    # a request, so a request of a killed run was sent before its kill even if the receiver read it
    # a moment later; a later run only starts once the killed one is gone.
    for request in requests:
        if request.run > 0:
            assert request.time > kills[request.run - 1].killed, (
                f"a request of run {request.run} was recorded before the previous run was killed: {request}")
    runs_of = {key: [r.run for r in deliveries] for key, deliveries in by_key.items()}
    same_run = {key: runs for key, runs in runs_of.items() if len(set(runs)) != len(runs)}
    assert not same_run, f"{len(same_run)} keys delivered twice within one run, e.g. {some(same_run.items())}"
    window = RunOptions().max_unacknowledged + RunOptions().epoch_max_messages - 1
    partition_count = yaml.safe_load(SPEC.read_text())["partition_count"]
    attributed: Counter[int] = Counter()  # kill -> keys delivered before it and again after it
    out_of_order: list[tuple[str, int, int]] = []
    not_in_flight: list[tuple[str, int, int, int]] = []
    for key, deliveries in by_key.items():
        for before, after in pairwise(deliveries):
            if before.run >= after.run:
                out_of_order.append((key, before.run, after.run))
            # Sent by a killed run, delivered again by a later one: the key must have stayed
            # unacknowledged in the committed outbox at every kill in between.
            for kill in kills[before.run:after.run]:
                attributed[kill.run] += 1
                if key not in kill.in_flight.keys:
                    not_in_flight.append((key, before.run, after.run, kill.run))
    assert not out_of_order, f"deliveries out of run order (key, run, later run): {some(out_of_order)}"
    assert not not_in_flight, (
        f"{len(not_in_flight)} redeliveries of keys that were not in flight (committed and unacknowledged) "
        f"at a kill in between, as (key, run, later run, kill): {some(not_in_flight)}")
    for kill in kills:
        for partition, count in kill.in_flight.per_partition.items():
            assert count <= window, (
                f"kill {kill.run}: {count} unacknowledged messages in partition {partition}, more than the "
                f"window max_unacknowledged + epoch_max_messages - 1 = {window}")
        assert attributed[kill.run] <= len(kill.in_flight.keys) <= partition_count * window

    # Each kill hit mid-delivery: its run had delivered something, and some messages arrived only later.
    first_run = {key: deliveries[0].run for key, deliveries in by_key.items()}
    for kill in kills:
        delivered_by_run = sum(1 for r in delivered if r.run == kill.run)
        new_later = sum(1 for run in first_run.values() if run > kill.run)
        print(f"kill {kill.run}: its run delivered {delivered_by_run}; {attributed[kill.run]} keys delivered "
              f"before it were delivered again after it; {new_later} keys arrived only after it")
        assert delivered_by_run > 0, f"kill {kill.run} hit before its run delivered anything"
        assert new_later > 0, f"kill {kill.run} hit after every message had arrived"
    assert len(kills) >= MIN_KILLS
    duplicates = len(delivered) - len(by_key)
    late = [lag for r in requests if r.run < final_run and (lag := r.time - kills[r.run].killed) > 0]
    print(f"{len(delivered)} deliveries of {len(by_key)} keys: {duplicates} duplicates, all from kills; "
          f"{len(late)} requests of killed runs were read after their kill (by {max(late, default=0):.3f} s)")
