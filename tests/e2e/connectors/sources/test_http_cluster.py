"""End to end: the http source in cluster mode. Two ``egress run --engine nats://…`` workers run one
pipeline; the worker holding the source reader's lease is the one that listens on the source's port.
Clients POST all the time; that worker is SIGKILLed; the other takes the reader over when the lease
expires and listens on the same port; every event answered 200, before or after the kill, arrives."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Receiver
from tests.e2e.connectors.sources.test_http_kill_restart import Clients
from tests.e2e.live_inputs import pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.nats_server import NatsServer
from tests.ports import free_port
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

LEASE_TTL = 2.0
WORKERS = ("a", "b")


def reader_owner(status_port: int) -> str | None:
    """The worker holding the http source reader's lease, from a worker's ``/status``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=2) as response:
            owner = json.load(response)["sources"]["input"]["owner"]
    except OSError:
        return None
    return str(owner) if owner is not None else None


@pytest.mark.timeout(120)
def test_events_answered_200_arrive_when_the_worker_listening_is_killed_and_the_other_takes_over(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer,
        workers: dict[str, subprocess.Popen[bytes]]) -> None:
    port = free_port()
    spec = pass_through_spec(tmp_path, "http_cluster", {"source_class_name": "http", "parameters": {"port": port}},
                             receiver.port, 0)
    status_ports = {worker: free_port() for worker in WORKERS}
    for worker in WORKERS:
        with (tmp_path / f"{worker}.log").open("wb") as log:
            workers[worker] = subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(spec), "--engine", own_nats_server.url,
                 "--worker-id", worker, "--lease-ttl", f"{LEASE_TTL:g}", "--state-dir", str(tmp_path / worker),
                 "--http-port", str(status_ports[worker]), "--quiet"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    clients = Clients(f"http://127.0.0.1:{port}/events")
    clients.start()
    try:
        eventually_sync(lambda: len(clients.acknowledged) >= 50, timeout=60, what="50 events answered 200")
        # /status is refreshed on its own period: wait until a worker names the reader's owner.
        # The owner named is the one read (a second read may fall between two refreshes and name none).
        owner = eventually_sync(lambda: next((named for named in (reader_owner(status_ports[w]) for w in WORKERS)
                                              if named in WORKERS), None),
                                timeout=30, interval=0.05, what="a worker's /status names the http reader's owner")
        survivor = next(w for w in WORKERS if w != owner)
        workers[owner].send_signal(signal.SIGKILL)
        workers[owner].wait(timeout=10)
        before = len(clients.acknowledged)
        # The survivor takes the reader over once the lease expires, and listens on the same port.
        eventually_sync(lambda: len(clients.acknowledged) >= before + 50, timeout=60,
                        what="50 more answered 200 after the kill")
        eventually_sync(lambda: reader_owner(status_ports[survivor]) == survivor, timeout=30, interval=0.05,
                        what=f"the survivor {survivor}'s /status names it the http reader's owner")
        acknowledged = set(clients.stop())
        want = {hashlib.sha256(f"event {i}".encode()).hexdigest(): i for i in acknowledged}

        def missing() -> list[int]:
            delivered = {r.body for r in load_record(receiver.record) if 200 <= r.status <= 299}
            return sorted(i for digest, i in want.items() if digest not in delivered)

        eventually_sync(lambda: not missing(), timeout=60, interval=0.1,  # the survivor delivers the rest
                        what=f"every one of the {len(acknowledged)} events answered 200 to arrive",
                        details=lambda: f"never arrived, e.g. {missing()[:5]}\n"
                        + (tmp_path / f"{survivor}.log").read_text(errors="replace")[-3000:])
    finally:
        clients.stop()
