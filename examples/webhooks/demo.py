"""The webhooks example, end to end: one airline's endpoint down, the others delivered, then it returns.

Makes a fresh ``whsec_`` secret (a temporary file for the receiver, the environment variable
``WEBHOOK_SECRET`` for egress), starts ``egress receiver --verify-secret`` with ``/hooks/UA``
failing, runs the pipeline with ``--http-port``, waits until every other airline has its events,
prints ``egress status`` (UA open or paused, with its backlog), brings UA back and resumes it with
``egress endpoint resume UA``, waits until UA has its events too, and prints a report: events per
airline, signature failures (none), order per plane. Exits 1 if anything is missing.

    python examples/webhooks/demo.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DOWN = "UA"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def egress(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "egress", *arguments]


def get(url: str, method: str = "GET") -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as answer:
        return json.loads(answer.read())


def delivered_by_airline(record: Path) -> collections.Counter[str]:
    """Distinct events answered 200, by airline (the path's last part)."""
    seen: dict[str, str] = {}
    if record.exists():
        for line in record.read_text().splitlines():
            entry = json.loads(line)
            if entry["status"] == 200:
                seen[entry["idempotency_key"]] = entry["path"].rsplit("/", 1)[-1]
    return collections.Counter(seen.values())


def expected_by_airline(spec: dict[str, Any]) -> collections.Counter[str]:
    import csv
    import gzip

    max_day = spec["computations"]["to_events"]["processing_function_parameters"]["max_day"]
    data = HERE / spec["sources"]["flights_csv"]["parameters"]["path"]
    with gzip.open(data, "rt", newline="") as text:
        return collections.Counter(row["carrier"] for row in csv.DictReader(text) if int(row["day"]) <= max_day)


def wait(what: str, condition: Any, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="keep the state, the record and the specs in this folder")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="egress-webhooks-"))
    work.mkdir(parents=True, exist_ok=True)
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    (work / "secret").write_text(secret + "\n")
    env = {**os.environ, "WEBHOOK_SECRET": secret}
    receiver_port, status_port = free_port(), free_port()
    dynamic = yaml.safe_load((HERE / "dynamic_spec.yaml").read_text())
    for entry in dynamic["computations"]["to_events"]["sinks"]["airlines"]["parameters"]["endpoints"].values():
        entry["url"] = entry["url"].replace("8080", str(receiver_port))
    (work / "dynamic_spec.yaml").write_text(yaml.safe_dump(dynamic, sort_keys=False))
    spec = yaml.safe_load((HERE / "spec.yaml").read_text())
    expected = expected_by_airline(spec)
    record = work / "received.jsonl"
    processes: list[subprocess.Popen[Any]] = []
    try:
        receiver = subprocess.Popen(egress("receiver", "--port", str(receiver_port), "--verify-secret",
                                           str(work / "secret"), "--record", str(record), "--idempotency-header",
                                           "webhook-id", "--fail-path", f"/hooks/{DOWN}"),
                                    cwd=ROOT, stdout=subprocess.DEVNULL)
        processes.append(receiver)
        wait("the receiver", lambda: _answers(f"http://127.0.0.1:{receiver_port}/stats"), 30)
        print(f"receiver on {receiver_port}, verifying signatures; /hooks/{DOWN} answers 503")
        run = subprocess.Popen(egress("run", str(HERE / "spec.yaml"), "--dynamic-spec", str(work / "dynamic_spec.yaml"),
                                      "--state-dir", str(work / "state"), "--http-port", str(status_port), "--quiet"),
                               cwd=ROOT, env=env)
        processes.append(run)
        others = {airline: n for airline, n in expected.items() if airline != DOWN}
        wait("the other airlines", lambda: all(delivered_by_airline(record)[a] >= n for a, n in others.items()))
        print(f"every airline but {DOWN} has its events; {DOWN} still has none:")
        subprocess.run(egress("status", f"127.0.0.1:{status_port}"), cwd=ROOT, check=False)
        get(f"http://127.0.0.1:{receiver_port}/fail-path?path=/hooks/{DOWN}&up=1", "POST")
        print(f"{DOWN} is back; resuming it (it may be open or paused by now):")
        subprocess.run(egress("endpoint", "resume", DOWN, f"127.0.0.1:{status_port}"), cwd=ROOT, check=False)
        wait(DOWN, lambda: delivered_by_airline(record)[DOWN] >= expected[DOWN])
        stats = get(f"http://127.0.0.1:{receiver_port}/stats")
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
    got = delivered_by_airline(record)
    print("events per airline (expected / delivered): "
          + ", ".join(f"{a} {n}/{got[a]}" for a, n in sorted(expected.items())))
    print(f"requests {stats['requests']}, verified {stats['verified']}, signature failures "
          f"{stats['signature_failures']}, duplicates {stats['duplicates']}; files in {work}")
    ok = got == expected and stats["signature_failures"] == 0
    print("demo: OK" if ok else "demo: MISSING EVENTS or BAD SIGNATURES")
    return 0 if ok else 1


def _answers(url: str) -> bool:
    try:
        get(url)
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
