"""End to end: every worker of a cluster accepts http events, behind a real nginx.

Three ``egress run --engine nats://…`` workers run one pipeline whose ``http`` source has three
readers (``readers: 3``: reader ``k`` listens on ``port + k``, each reader a unit the assignment
gives a worker of its own); nginx balances the clients' POSTs over the three ports
(``tests/nginx.py``: ``upstream`` with ``proxy_next_upstream``, round robin, so most keyed requests
reach a reader that is not their key's and are sent on to it: ``egress.connectors.sources.http_peers``).
Clients post events with an ``Idempotency-Key`` each, sending an event again under its key until it
is answered 200. The worker
holding a reader is SIGKILLed mid-ingest: nginx sends its clients' requests to the others at once
(a refused or broken connection is tried on the next worker), and a survivor takes its reader
over when the lease expires. Every event answered 200 arrives, each under the one delivery key its
``Idempotency-Key`` gives (none under two keys), and a key answered once is a duplicate on every
reader."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
import pytest

from egress.connectors.sources.http import KEYED_PARTITION, keyed_position
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from tests.e2e.conftest import REPO, Receiver
from tests.e2e.connectors.sources.conftest import wait_until_delivered
from tests.e2e.connectors.sources.test_nats_partitioned_cluster import reader_owners
from tests.e2e.live_inputs import pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.nats_server import NatsServer
from tests.nginx import Nginx, balancer_config, free_port, require_nginx
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

PIPELINE, SOURCE = "http_balanced", "input"
WORKERS = ("a", "b", "c")
READERS = len(WORKERS)
LEASE_TTL = 2.0
CLIENTS = 16
BEFORE_KILL = 300  # events answered 200 before the kill
AFTER_KILL = 300  # ... and after it


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports (reader ``k`` listens on ``first + k``)."""
    for _ in range(100):
        first = free_port()
        if first + count <= 65535 and all(_free(first + k) for k in range(1, count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class KeyedClients:
    """``CLIENTS`` concurrent clients POSTing ``{"id": n, "payload": "event n"}`` with
    ``Idempotency-Key: event-n`` to ``url``, each event sent again under its key until answered 200
    (``answered``: n → when), on their own thread and loop until :meth:`stop`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered: dict[int, float] = {}
        self.failures = 0
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.answered

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            await asyncio.gather(*(self._client(session) for _ in range(CLIENTS)))

    async def _client(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            event_id, self._next = self._next, self._next + 1
            body = orjson.dumps({"id": event_id, "payload": f"event {event_id}"})
            while True:  # this event until answered 200 (a stop leaves it unanswered: not counted)
                try:
                    async with session.post(self.url, data=body,
                                            headers={"Idempotency-Key": f"event-{event_id}"}) as response:
                        await response.read()
                        if response.status == 200:
                            self.answered[event_id] = time.time()
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                self.failures += 1
                if self._stop.is_set():
                    return
                await asyncio.sleep(0.05)


def post_again(port: int, event: int) -> tuple[int, object]:
    """POST event ``event`` again, under its key, straight to the reader on ``port``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/events", method="POST",
                                     data=orjson.dumps({"id": event, "payload": f"event {event}"}),
                                     headers={"Idempotency-Key": f"event-{event}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, orjson.loads(answer.read())


@pytest.mark.timeout(240)
def test_every_worker_accepts_behind_nginx_and_a_killed_workers_clients_lose_no_200(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer,
        workers: dict[str, subprocess.Popen[bytes]]) -> None:
    require_nginx()
    port = free_ports(READERS)
    spec = pass_through_spec(tmp_path, PIPELINE, {"source_class_name": "http", "parameters": {
        "port": port, "readers": READERS}}, receiver.port, 0)
    status_ports = {worker: free_port() for worker in WORKERS}
    balancer_port = free_port()
    nginx = Nginx(tmp_path / "nginx", balancer_port,
                  balancer_config(balancer_port, [port + k for k in range(READERS)])).start()
    clients = KeyedClients(f"{nginx.url}/events")
    try:
        for worker in WORKERS:
            with (tmp_path / f"{worker}.log").open("wb") as log:
                workers[worker] = subprocess.Popen(
                    [sys.executable, "-m", "egress", "run", str(spec), "--engine", own_nats_server.url,
                     "--worker-id", worker, "--lease-ttl", f"{LEASE_TTL:g}", "--state-dir", str(tmp_path / worker),
                     "--http-port", str(status_ports[worker]), "--quiet"],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

        def spread() -> list[str | None] | None:
            owners = reader_owners(status_ports["a"])
            return owners if owners is not None and set(owners) == set(WORKERS) else None

        owners = eventually_sync(spread, timeout=90, interval=0.1, what="each worker holding one http reader")
        clients.start()
        eventually_sync(lambda: len(clients.answered) >= BEFORE_KILL, timeout=90,
                        what=f"{BEFORE_KILL} events answered 200 through nginx")
        victim = owners[1]
        assert victim is not None
        survivors = [w for w in WORKERS if w != victim]
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=10)
        killed_at = time.time()
        answered_at_kill = len(clients.answered)
        eventually_sync(lambda: len(clients.answered) >= answered_at_kill + AFTER_KILL, timeout=90,
                        what=f"{AFTER_KILL} more answered 200 after the kill (by the survivors)")
        first_after = min(at for at in clients.answered.values() if at > killed_at)
        eventually_sync(lambda: set(reader_owners(status_ports[survivors[0]]) or [victim]) <= set(survivors),
                        timeout=60, interval=0.1, what="the survivors holding all three readers")
        answered = clients.stop()
        # A key answered once is a duplicate on every reader, whichever worker holds it now.
        sample = sorted(answered)[:: max(1, len(answered) // 10)]
        repeats = {(event, k): post_again(port + k, event) for event in sample for k in range(READERS)}
        assert all(answer == (200, {"accepted": 0, "duplicate": True}) for answer in repeats.values()), repeats

        scope = source_scope(PIPELINE, SOURCE, "/events")
        want = {idempotency_key(derived_message_id(source_message_id(
            scope, KEYED_PARTITION, keyed_position(f"event-{i}", 0)), 0)): hashlib.sha256(f"event {i}".encode()
                                                                                       ).hexdigest()
                for i in answered}
        wait_until_delivered(receiver, want, f"every one of the {len(answered)} events answered 200 to arrive",
                             tmp_path / f"{survivors[0]}.log")
    finally:
        clients.stop()
        nginx.stop()

    requests = [r for r in load_record(receiver.record) if 200 <= r.status <= 299]
    keys_of_body: dict[str, set[str]] = {}
    for request in requests:
        keys_of_body.setdefault(request.body, set()).add(request.key)
    assert all(len(keys) == 1 for keys in keys_of_body.values())  # none under two keys
    delivered = {r.key: r.body for r in requests}
    assert {key: delivered.get(key) for key in want} == want  # every event answered 200, under its key's id
    print(f"\n{len(answered)} events answered 200 through nginx ({clients.failures} sends failed and were sent "
          f"again); the first 200 after the kill {max(0.0, first_after - killed_at) * 1000:.0f} ms after it")
