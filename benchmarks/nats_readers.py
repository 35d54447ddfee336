"""A ``nats`` source read by one reader or by two (issue 24): where the CPU goes on two workers.

A JetStream stream ``ORDERS`` partitioned in two by a subject transform (``orders.*`` →
``orders.{{partition(2,1)}}.{{wildcard(1)}}``) is filled with ``--messages`` JSON events (keys
``k0`` … ``k999`` in the hashed token) before each phase; then ``egress run --engine nats://…
--until-drained`` workers read it into a pass-through computation (``partition_count`` 4, the
async HTTP sink) POSTing to ``egress receiver``. Phases:

* ``w1-r1``: one worker, ``readers: 1`` (the floor of this run);
* ``w2-r1``: two workers, ``readers: 1``: the reader's worker reads every event and delivers half;
* ``w2-r2``: two workers, ``readers: 2``: each reads half and delivers half;
* ``read-w1-r1``, ``read-w2-r2``: the same without the computation (the Spec has none): the readers
  alone, moving the stream into the engine's log, so a worker's CPU is its readers' (and the
  runtime's fixed part).

For each phase: every event delivered (distinct idempotency keys at the receiver, or exit 1), CPU µs
per message of each process (``os.wait4``'s rusage for the workers, ``/proc`` for the nats-server),
the rows each worker's readers read (``--report``), and the rate with one core per process
(messages ÷ the busiest process's CPU seconds): what more cores give. The machine may be shared:
compare CPU, not wall rates.

    python benchmarks/nats_readers.py                      # 30,000 messages, every phase
    python benchmarks/nats_readers.py --messages 100000 --phases w2-r1,w2-r2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from tests.nats_server import NatsServer  # noqa: E402

from cluster import ClusterResult, describe, wait_all  # noqa: E402
from cluster_counters import process_cpu  # noqa: E402
from delivery import ReceiverTarget, stop_process  # noqa: E402

PHASES = {"w1-r1": (1, 1, True), "w2-r1": (2, 1, True), "w2-r2": (2, 2, True),
          "read-w1-r1": (1, 1, False), "read-w2-r2": (2, 2, False)}
"""Phase → (workers, readers, whether a computation delivers the events)."""
PARTITIONS = 2  # the stream's partitions: partition(2, 1)
KEYS = 1000


async def fill(url: str, messages: int) -> None:
    """Make ``ORDERS`` (partitioned in :data:`PARTITIONS`) and publish ``messages`` events into it."""
    import nats
    from nats.js.api import StreamConfig, SubjectTransform

    client = await nats.connect(url)
    js = client.jetstream()
    await js.add_stream(StreamConfig(
        name="ORDERS", subjects=["orders.*"],
        subject_transform=SubjectTransform(src="orders.*",
                                           dest=f"orders.{{{{partition({PARTITIONS},1)}}}}.{{{{wildcard(1)}}}}")))
    for start in range(0, messages, 500):  # 500 publishes in flight at a time
        await asyncio.gather(*(
            js.publish(f"orders.k{i % KEYS}", json.dumps({"id": i, "payload": f"order {i:08} " + "x" * 280}).encode())
            for i in range(start, min(messages, start + 500))))
    await client.close()


def write_spec(phase: Path, source_url: str, receiver_url: str, readers: int, deliver: bool) -> Path:
    subject = "orders.{partition}.*" if readers > 1 else "orders.>"
    spec = {
        "pipeline": "nats_readers",
        "partition_count": 4,
        "streams": {"events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                               "group_by": ["id"]},
                    "requests": {"schema": [{"name": "payload", "type": "string"}]}},
        "sources": {"orders": {"source_class_name": "nats", "output_stream_id": "events",
                               "parameters": {"url": source_url, "stream": "ORDERS", "subject": subject,
                                              "readers": readers}}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough", "input_stream_ids": ["events"],
            "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": receiver_url, "payload_column": "payload"}}}}},
    }
    if not deliver:
        spec["computations"] = {}
        del spec["streams"]["requests"]
    path = phase / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_phase(name: str, messages: int, target: ReceiverTarget, work: Path, timeout: float) -> ClusterResult:
    workers, readers, deliver = PHASES[name]
    phase = work / name
    shutil.rmtree(phase, ignore_errors=True)
    phase.mkdir(parents=True)
    server = NatsServer(phase / "nats").start()
    assert server.pid is not None
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        asyncio.run(fill(server.url, messages))
        spec = write_spec(phase, server.url, target.url, readers, deliver)
        load = os.getloadavg()[0]
        server_cpu = process_cpu(server.pid)
        started = time.perf_counter()
        for index in range(1, workers + 1):
            worker = f"w{index}"
            log = open(phase / f"{worker}.log", "wb")  # noqa: SIM115 - closed below, after the process ends
            logs.append(log)
            processes[worker] = subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(spec), "--engine", server.url, "--worker-id", worker,
                 "--state-dir", str(phase / f"state-{worker}"), "--until-drained", "--quiet",
                 "--report", str(phase / f"report-{worker}.json")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        cpu = wait_all(processes, timeout)
        seconds = time.perf_counter() - started
        cpu["nats-server"] = process_cpu(server.pid) - server_cpu
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_process(process)
        for log in logs:
            log.close()
        server.stop()
    stats = target.finish()
    delivered = stats["distinct_keys"] if deliver else sum(reports_rows(phase, processes))
    result = ClusterResult(name, messages, seconds, delivered, stats["requests"], cpu, [], load)
    for worker, process in processes.items():
        report_path = phase / f"report-{worker}.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        result.notes.append(f"{worker}: exit {process.returncode}, {report.get('posts', 0):,} POSTs, "
                            f"{report.get('rows_read', 0):,} rows read by its readers")
    return result


def reports_rows(phase: Path, processes: dict[str, subprocess.Popen[bytes]]) -> list[int]:
    """The rows each worker's readers read, from its ``--report``."""
    reports = [phase / f"report-{worker}.json" for worker in processes]
    return [json.loads(path.read_text()).get("rows_read", 0) if path.exists() else 0 for path in reports]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {', '.join(PHASES)}")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--keep", type=Path, help="keep the Specs, stores, logs and reports here")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if set(phases) - set(PHASES):
        parser.error(f"--phases: one of {', '.join(PHASES)}")
    began = time.time()
    target = ReceiverTarget()
    results: list[ClusterResult] = []
    with tempfile.TemporaryDirectory(prefix="egress-nats-readers-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        try:
            for name in phases:
                workers, readers, deliver = PHASES[name]
                target.start()
                print(f"{name}: {workers} worker(s), readers: {readers}{'' if deliver else ', no computation'} ...",
                      flush=True)
                result = run_phase(name, args.messages, target, work, args.timeout)
                results.append(result)
                for line in [*describe(result), *result.notes]:
                    print("  " + line, flush=True)
        finally:
            target.stop()
    print(f"\nnats readers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, {args.messages:,} messages, "
          f"{os.cpu_count()} cores, load average now {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for result in results:
        for line in describe(result):
            print("  " + line)
    return 0 if all(result.complete for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
