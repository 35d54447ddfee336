"""End to end: a ``nats`` source read by two readers (``readers: 2``, the stream's subjects in two
JetStream partitions by a subject transform) on two ``egress run --engine nats://…`` workers, one
reader each. Events are published all the while; the worker holding a reader is SIGKILLed mid-run;
the survivor takes its reader and partitions over when their leases expire. Every published event
arrives under the key of its stream sequence, none under two keys, and an event arrives twice only
if it was first delivered before the kill (the killed worker's work in flight)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from nats.js.api import StreamConfig, SubjectTransform

from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from tests.e2e.conftest import REPO, Receiver
from tests.e2e.connectors.sources.conftest import wait_until_delivered
from tests.e2e.live_inputs import pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.nats_publisher import Publisher
from tests.nats_server import NatsServer
from tests.ports import free_port
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

PIPELINE, SOURCE = "nats_partitioned", "input"
READERS = 2
WORKERS = ("a", "b")
LEASE_TTL = 2.0
KEYS = 40  # the publisher's keys: the subject token the stream's partitions hash
BEFORE_KILL = 400  # events delivered before the kill
AFTER_KILL = 400  # ... and published after it
IN_FLIGHT_SLACK = 0.5  # seconds: a request sent before the kill may be recorded by the receiver just after it


def partitioned_stream(stream: str) -> StreamConfig:
    """``stream`` with subjects ``<stream>.*`` mapped to ``<stream>.<partition>.<key>`` (``READERS`` partitions)."""
    transform = SubjectTransform(src=f"{stream}.*",
                                 dest=f"{stream}.{{{{partition({READERS},1)}}}}.{{{{wildcard(1)}}}}")
    return StreamConfig(name=stream, subjects=[f"{stream}.*"], subject_transform=transform)


def status(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
            document: dict[str, object] = json.load(response)
            return document
    except OSError:
        return None


def reader_owners(port: int) -> list[str | None] | None:
    """Each reader partition's owner, from a worker's ``/status`` (``None``: not answered yet)."""
    document = status(port)
    if document is None:
        return None
    source = document["sources"]["input"]  # type: ignore[index]
    owners: list[str | None] = source["owners"]  # type: ignore[index]
    return owners


@pytest.mark.timeout(180)
def test_a_partitioned_nats_source_loses_nothing_when_a_worker_holding_a_reader_is_killed(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer,
        workers: dict[str, subprocess.Popen[bytes]]) -> None:
    stream = f"orders_{uuid.uuid4().hex[:10]}"
    publisher = Publisher(own_nats_server.url, partitioned_stream(stream), lambda i: f"{stream}.k{i % KEYS}")
    publisher.start()
    spec = pass_through_spec(tmp_path, PIPELINE, {"source_class_name": "nats", "parameters": {
        "url": own_nats_server.url, "stream": stream, "subject": f"{stream}.{{partition}}.*", "readers": READERS}},
        receiver.port, 0)
    ports = {worker: free_port() for worker in WORKERS}
    try:
        for worker in WORKERS:
            with (tmp_path / f"{worker}.log").open("wb") as log:
                workers[worker] = subprocess.Popen(
                    [sys.executable, "-m", "egress", "run", str(spec), "--engine", own_nats_server.url,
                     "--worker-id", worker, "--lease-ttl", f"{LEASE_TTL:g}", "--state-dir", str(tmp_path / worker),
                     "--http-port", str(ports[worker]), "--quiet"],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

        def delivered() -> int:
            return sum(1 for r in load_record(receiver.record) if 200 <= r.status <= 299)

        def spread() -> list[str | None] | None:
            owners = reader_owners(ports["a"])
            return owners if owners is not None and set(owners) == set(WORKERS) else None

        # Both workers have joined and the assignment gave each one reader; work is under way.
        owners = eventually_sync(spread, timeout=60, interval=0.1, what="each worker holding one reader")
        eventually_sync(lambda: delivered() >= BEFORE_KILL, timeout=60, what=f"{BEFORE_KILL} events delivered")
        victim = owners[1]
        assert victim is not None
        survivor = next(w for w in WORKERS if w != victim)
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=10)
        killed_at = time.time()
        published_at_kill = publisher.count
        eventually_sync(lambda: publisher.count >= published_at_kill + AFTER_KILL, timeout=60,
                        what=f"{AFTER_KILL} more events published")
        eventually_sync(lambda: reader_owners(ports[survivor]) == [survivor] * READERS, timeout=30, interval=0.1,
                        what=f"the survivor {survivor} holding both readers")
        published = publisher.stop()

        scope = source_scope(PIPELINE, SOURCE, stream)
        want = {idempotency_key(derived_message_id(source_message_id(scope, 0, i + 1), 0)):
                hashlib.sha256(f"order {i}".encode()).hexdigest() for i in range(published)}
        wait_until_delivered(receiver, want, f"every one of the {published} published events to arrive",
                             tmp_path / f"{survivor}.log")
    finally:
        publisher.stop()

    requests = [r for r in load_record(receiver.record) if 200 <= r.status <= 299]
    keys_of_body: dict[str, set[str]] = {}
    first_at: dict[str, float] = {}
    counts: dict[str, int] = {}
    for request in requests:
        keys_of_body.setdefault(request.body, set()).add(request.key)
        first_at.setdefault(request.key, request.time)
        counts[request.key] = counts.get(request.key, 0) + 1
    assert {r.key: r.body for r in requests} == want  # every event, under the key of its sequence
    assert all(len(keys) == 1 for keys in keys_of_body.values())  # none under two keys
    duplicates = [key for key, count in counts.items() if count > 1]
    late = [key for key in duplicates if first_at[key] > killed_at + IN_FLIGHT_SLACK]
    assert not late, f"{len(late)} events first delivered after the kill arrived twice"
    print(f"\n{published} events published, {len(requests)} requests, {len(duplicates)} sent twice "
          "(in flight at the kill)")
