"""Two ``egress run --engine nats://…`` processes under one ``--worker-id``, and a SIGKILLed worker
started again under its id, with the egress of ``--src`` (a tree's ``src``: compare a branch
with ``main`` in alternated runs).

* ``duplicate``: worker A delivers the payload pipeline (``--messages`` messages, 4 partitions) to
  ``egress receiver --delay 0.002``; once the receiver recorded 200 requests (a positive signal
  that A runs) B starts under the same id. Reported: B's exit code and seconds from its start to
  its exit (or ``running`` after ``--seconds``), then the requests the receiver got and the
  distinct keys among them once A drained or ``--seconds`` passed (both killed then).
* ``restart``: worker A runs alone; a seeded random 0–2.5 s after the receiver recorded 200
  requests (another point of A's heartbeat period each round) A is SIGKILLed and started again
  under its id at once. Reported: seconds from the kill until every lease A held was taken again
  (a greater generation: the restarted process took it).

Every figure is wall time on a shared machine: print the load average with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import payload_spec  # noqa: E402
from tests.e2e.conftest import launch_receiver, stop_receiver  # noqa: E402
from tests.nats_server import NatsServer  # noqa: E402
from tests.receiver_record import recorded, recorded_count  # noqa: E402
from tests.waiting import eventually_sync  # noqa: E402

from egress.engines import NatsEngine  # noqa: E402


def spec(directory: Path, port: int, messages: int, pipeline: str) -> Path:
    written, _ = payload_spec(directory, f"http://127.0.0.1:{port}/events", [f"p{i}" for i in range(messages)],
                              partition_count=4)
    document = yaml.safe_load(written.read_text())
    document["pipeline"] = pipeline
    written.write_text(yaml.safe_dump(document))
    return written


def worker(src: Path, spec_file: Path, url: str, directory: Path, name: str) -> subprocess.Popen[bytes]:
    log = (directory / f"{name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "egress", "run", str(spec_file), "--engine", url, "--worker-id", "w1",
         "--state-dir", str(directory / name), "--until-drained", "--quiet"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(src)})


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def duplicate(src: Path, spec_file: Path, url: str, directory: Path, record: Path, messages: int,
              seconds: float) -> str:
    first = worker(src, spec_file, url, directory, "a")
    eventually_sync(lambda: recorded_count(record) >= 200, what="200 requests", timeout=120)
    started = time.monotonic()
    second = worker(src, spec_file, url, directory, "b")
    try:
        code = second.wait(timeout=seconds)
        refused = f"B exit {code} after {time.monotonic() - started:.2f} s"
    except subprocess.TimeoutExpired:
        refused = f"B running after {seconds:g} s"
    with contextlib.suppress(subprocess.TimeoutExpired):
        first.wait(timeout=max(1.0, started + seconds - time.monotonic()))
    stop(first)
    stop(second)
    requests = recorded(record)
    keys = {r["idempotency_key"] for r in requests}
    return f"{refused}; A exit {first.returncode}; {len(requests):,} requests for {len(keys):,} keys of {messages:,}"


def generations(url: str, pipeline: str) -> dict[tuple[str, int], int]:
    async def read() -> dict[tuple[str, int], int]:
        engine = NatsEngine(url, pipeline)
        await engine.open()
        try:
            return {(lease.consumer, lease.partition): lease.generation for lease in await engine.leases()}
        finally:
            await engine.close()

    return asyncio.run(read())


def restart(src: Path, spec_file: Path, url: str, directory: Path, record: Path, pipeline: str, phase: float) -> str:
    first = worker(src, spec_file, url, directory, "a")
    eventually_sync(lambda: recorded_count(record) >= 200, what="200 requests", timeout=120)
    time.sleep(phase)  # the kill at another point of the heartbeat period each round
    before = generations(url, pipeline)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed = time.monotonic()
    restarted = worker(src, spec_file, url, directory, "a")
    try:
        def retaken() -> bool:
            now = generations(url, pipeline)
            return set(now) == set(before) and all(now[unit] > before[unit] for unit in before)

        eventually_sync(retaken, what="every lease taken again", timeout=60, interval=0.02)
        return (f"{len(before)} leases taken again {time.monotonic() - killed:.2f} s after the kill "
                f"(kill {phase:.2f} s after the 200th request)")
    finally:
        stop(restarted)


def run(scenario: str, src: Path, messages: int, seconds: float, round_: int) -> str:
    with tempfile.TemporaryDirectory(prefix="egress-worker-id-") as temporary:
        directory = Path(temporary)
        server = NatsServer(directory / "nats").start()
        receiver = launch_receiver(directory / "received.jsonl", "--delay", "0.002")
        try:
            spec_file = spec(directory, receiver.port, messages, f"worker_id_{scenario}_{round_}")
            if scenario == "duplicate":
                return duplicate(src, spec_file, server.url, directory, receiver.record, messages, seconds)
            return restart(src, spec_file, server.url, directory, receiver.record, f"worker_id_{scenario}_{round_}",
                           random.Random(round_).uniform(0.0, 2.5))
        finally:
            stop_receiver(receiver)
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["duplicate", "restart"])
    parser.add_argument("--src", type=Path, action="append", required=True,
                        help="an egress src directory; give two to alternate them (A B A B)")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    arguments = parser.parse_args()
    for round_ in range(arguments.rounds):
        for src in arguments.src:
            result = run(arguments.scenario, src, arguments.messages, arguments.seconds, round_)
            print(f"{arguments.scenario} {src}: {result}; load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
