"""``make demo``: deliver the January 2013 flights to a local receiver and report what arrived.

Starts ``egress receiver`` on a free port, runs the example pipeline until drained (a fresh state
directory each time), stops the receiver and prints a delivery report. Exits 1 if any message
that should have arrived (one per non-cancelled flight) is missing.

    python examples/http_delivery/demo.py [--fail-rate 0.2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = HERE / "data" / "flights-2013-01.csv.gz"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def expected_keys() -> int:
    """Non-cancelled flights in the data: each must arrive under exactly one idempotency key."""
    with gzip.open(DATA, "rt", newline="") as text:
        return sum(1 for row in csv.DictReader(text) if row["dep_time"] not in ("", "NA"))


def write_spec(work: Path, port: int) -> Path:
    spec = yaml.safe_load((HERE / "spec.yaml").read_text())
    spec["sources"]["flights_csv"]["parameters"]["path"] = str(DATA)
    spec["computations"]["to_json"]["sinks"]["http"]["parameters"]["url"] = f"http://127.0.0.1:{port}/events"
    path = work / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def start_receiver(port: int, record: Path, fail_rate: float, *options: str) -> subprocess.Popen[str]:
    """``egress receiver`` on ``port`` recording to ``record``, failing ``fail_rate`` of the requests,
    with further ``options``; returns once it listens."""
    command = [sys.executable, "-m", "egress", "receiver", "--port", str(port), "--record", str(record), *options]
    if fail_rate > 0:
        command += ["--fail-rate", str(fail_rate), "--seed", "1"]
    receiver = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    line = receiver.stdout.readline()
    if "listening" not in line:
        receiver.kill()
        raise SystemExit(f"the receiver did not start: {line!r}")
    return receiver


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fail-rate", type=float, default=0.0, help="share of requests the receiver fails (503)")
    parser.add_argument("--keep", type=Path, help="keep the spec, state and request record in this folder")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="egress-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    spec = write_spec(work, port)
    record, report_file, state = work / "received.jsonl", work / "report.json", work / "state"
    print(f"egress demo: January 2013 flights → http://127.0.0.1:{port}/events"
          f"{f' (receiver fails {args.fail_rate:.0%} of requests)' if args.fail_rate else ''}", flush=True)
    receiver = start_receiver(port, record, args.fail_rate)
    started = time.monotonic()
    try:
        run = subprocess.run(
            [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(HERE / "dynamic_spec.yaml"),
             "--state-dir", str(state), "--until-drained", "--report", str(report_file)],
            cwd=ROOT, check=False,
        )
        elapsed = time.monotonic() - started
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
            stats = json.load(answer)
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.wait(timeout=10)
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    expected = expected_keys()
    missing = expected - stats["distinct_keys"]
    lines = [
        ("rows read", report.get("rows_read", 0)),
        ("POSTs sent", report.get("posts", 0)),
        ("2xx responses", report.get("responses_2xx", 0)),
        ("retries", report.get("retries", 0)),
        ("requests received", stats["requests"]),
        ("distinct idempotency keys received", stats["distinct_keys"]),
        ("expected (non-cancelled flights)", expected),
        ("duplicates", stats["duplicates"]),
        ("missing", missing),
        ("elapsed seconds", f"{elapsed:.2f}"),
        ("messages/s", f"{stats['distinct_keys'] / elapsed:,.0f}" if elapsed > 0 else "-"),
    ]
    print("\ndelivery report")
    for name, value in lines:
        print(f"  {name:<36} {value:>10,}" if isinstance(value, int) else f"  {name:<36} {value:>10}")
    if args.keep:
        print(f"\nspec, state, report and request record kept in {work}")
    ok = run.returncode == 0 and missing == 0
    print("\nOK: every message arrived" if ok else f"\nFAILED: egress exited {run.returncode}, {missing} missing")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
