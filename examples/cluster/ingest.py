"""The second part of ``make demo-cluster``: every worker ingests webhook events behind nginx.

A webhook relay (``examples/live_inputs/webhook_spec.yaml``'s pipeline, its ``http`` source with
``readers`` = the number of workers: reader ``k`` listens on ``port + k``) runs on the demo's
workers (``egress run --engine nats://…``, one reader each by the assignment). nginx
(``/usr/sbin/nginx``, the config ``tests/nginx.py`` writes: an ``upstream`` over the readers'
ports with ``proxy_next_upstream``) is the one address the clients know. Clients POST events
through it, each with an ``Idempotency-Key``, sending an event again under its key until answered
200. Once a third is answered, the worker holding reader 1 is SIGKILLed; nginx sends its share of
the requests to the others at once, and a survivor takes the reader over when its lease lapses.
Printed: how many events each worker accepted and delivered, the failover (the first 200 after the
kill; the killed reader taken over), and the events answered 200 that never arrived: 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from tests.nginx import Nginx, balancer_config, free_port, nginx_binary

from egress.connectors.sources.http import KEYED_PARTITION, keyed_position
from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope

ROOT = Path(__file__).resolve().parents[2]

PIPELINE, SOURCE, COMPUTATION = "webhook_cluster", "hooks", "deliver"
CLIENTS = 48  # concurrent clients: each waits for its 200 (a commit), so many keep the readers busy


def write_spec(work: Path, port: int, readers: int, receiver_port: int) -> Path:
    spec = yaml.safe_load((ROOT / "examples" / "live_inputs" / "webhook_spec.yaml").read_text())
    spec["pipeline"] = PIPELINE
    spec["partition_count"] = readers
    spec["sources"][SOURCE]["parameters"].update({"port": port, "readers": readers, "format": "json"})
    spec["computations"][COMPUTATION]["sinks"]["http"]["parameters"]["url"] = f"http://127.0.0.1:{receiver_port}/events"
    path = work / "webhook_spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    import socket

    for _ in range(100):
        first = free_port()
        try:
            for k in range(1, count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", first + k))
            return first
        except OSError:
            continue
    raise SystemExit(f"no {count} consecutive free ports on 127.0.0.1")


class Clients:
    """``CLIENTS`` clients POSTing ``{"order_id": n, "amount": n}`` with ``Idempotency-Key: order-n``
    through ``url`` until ``total`` are answered 200; an event is sent again under its key until it is."""

    def __init__(self, url: str, total: int) -> None:
        self.url, self.total = url, total
        self.answered: dict[int, float] = {}  # event → wall time of its 200
        self.sent_again = 0
        self._next = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    async def _run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            await asyncio.gather(*(self._client(session) for _ in range(CLIENTS)))

    async def _client(self, session: object) -> None:
        import aiohttp

        assert isinstance(session, aiohttp.ClientSession)
        while self._next < self.total:
            event, self._next = self._next, self._next + 1
            body = f'{{"order_id": {event}, "amount": {event}.5}}'.encode()
            while True:
                try:
                    async with session.post(self.url, data=body, headers={"Idempotency-Key": f"order-{event}"}) as r:
                        await r.read()
                        if r.status == 200:
                            self.answered[event] = time.time()
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                self.sent_again += 1
                await asyncio.sleep(0.05)


def metric(port: int, name: str) -> float:
    """The sum of ``name``'s samples in a worker's ``/metrics`` (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def run_ingest(work: Path, url: str, workers: int, lease_ttl: float, events: int,
               start_receiver: Callable[[int, Path], subprocess.Popen[str]],
               stop: Callable[[subprocess.Popen[bytes] | subprocess.Popen[str]], None],
               owners: Callable[[str], dict[int, str]], delivered_keys: Callable[[Path], set[str]]) -> bool:
    """The ingest part (see the module); ``True`` when nothing answered 200 is missing."""
    if nginx_binary() is None:
        print("\ningest through nginx: skipped, nginx is not installed (apt-get install nginx)")
        return True
    work = work / "ingest"
    work.mkdir(exist_ok=True)
    receiver_port, base = free_port(), consecutive_free_ports(workers)
    record = work / "received.jsonl"
    spec = write_spec(work, base, workers, receiver_port)
    balancer = free_port()
    nginx = Nginx(work / "nginx", balancer, balancer_config(balancer, [base + k for k in range(workers)]))
    receiver = start_receiver(receiver_port, record)
    metrics_ports = {f"w{n}": free_port() for n in range(1, workers + 1)}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    clients = Clients(f"http://127.0.0.1:{balancer}/events", events)
    print(f"\negress cluster ingest: {events:,} webhook events POSTed through nginx (127.0.0.1:{balancer}) to "
          f"{workers} workers, each an http reader (ports {base}..{base + workers - 1})", flush=True)
    try:
        nginx.start()
        for worker, metrics_port in metrics_ports.items():
            with (work / f"{worker}.log").open("wb") as log:
                processes[worker] = subprocess.Popen(
                    [sys.executable, "-m", "egress", "run", str(spec), "--engine", url, "--worker-id", worker,
                     "--lease-ttl", f"{lease_ttl:g}", "--state-dir", str(work / worker), "--http-port",
                     str(metrics_port), "--quiet"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        consumer = f"source:{SOURCE}"
        wait_for(lambda: set(owners(consumer).values()) == set(processes) and len(owners(consumer)) == workers,
                 "each worker holding one http reader")
        victim = owners(consumer)[1]
        started = time.monotonic()
        clients.start()
        wait_for(lambda: len(clients.answered) >= events // 3, "a third of the events answered 200")
        accepted = {w: metric(p, "egress_source_rows_total") for w, p in metrics_ports.items()}
        delivering = {w: metric(p, "egress_sink_records_delivered_total") for w, p in metrics_ports.items()}
        os.kill(processes[victim].pid, signal.SIGKILL)
        processes[victim].wait()
        killed, killed_wall = time.monotonic(), time.time()
        print(f"killed {victim} (pid {processes[victim].pid}), which held http reader 1, after "
              f"{killed - started:.1f} s and {len(clients.answered):,} events answered 200", flush=True)
        taken = wait_for(lambda: owners(consumer).get(1, victim) != victim, f"a survivor taking {victim}'s reader")
        clients.join(timeout=300)
        answered = dict(clients.answered)
        scope = source_scope(PIPELINE, SOURCE, "/events")
        want = {idempotency_key(derived_message_id(source_message_id(scope, KEYED_PARTITION, keyed_position(
            f"order-{event}", 0)), 0)) for event in answered}
        wait_for(lambda: not want - delivered_keys(record), "every event answered 200 to arrive", timeout=120)
        after = [at for at in answered.values() if at > killed_wall]
        first_after = min(after) - killed_wall if after else float("nan")
        totals = {w: metric(p, "egress_sink_records_delivered_total") for w, p in metrics_ports.items()}
    finally:
        for process in processes.values():
            stop(process)
        stop(receiver)
        nginx.stop()
    missing = len(want - delivered_keys(record))
    print("\ningest report")
    print("  events accepted / delivered by each worker before the kill: "
          + ", ".join(f"{w} {accepted[w]:,.0f} / {delivering[w]:,.0f}" for w in sorted(accepted)))
    print("  delivered by each survivor in all: "
          + ", ".join(f"{w} {totals[w]:,.0f}" for w in sorted(totals) if w != victim))
    for name, value in (("events answered 200", f"{len(answered):,}"),
                        ("sends answered otherwise, sent again", f"{clients.sent_again:,}"),
                        ("missing (answered 200, not delivered)", f"{missing:,}"),
                        ("failover: first 200 after the kill", f"{first_after * 1000:.0f} ms"),
                        ("failover: its reader taken over after", f"{taken - killed:.2f} s")):
        print(f"  {name:<42} {value:>10}")
    return missing == 0
