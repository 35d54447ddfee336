"""``egress run`` with the webhook sink of ``examples/webhooks`` against ``egress receiver
--verify-secret``, SIGKILLed mid-run while one airline's endpoint is down (the endpoints stand at
different positions; its backlog beyond 8 messages left in the SQLite outbox), then run to the
end: every event delivered, signed, in order per key within its endpoint, and duplicates only of
messages the committed state still owed at the kill."""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from examples.webhooks.functions import FlightToWebhook

from egress.connectors.sinks.webhook_endpoints import decode_state
from egress.engines.sqlite import read_outbox
from egress.keys import idempotency_key
from egress.observe.dashboard import endpoint_summary
from tests.e2e.conftest import (
    REPO,
    Receiver,
    hold_after,
    launch_receiver,
    receiver_stats,
    release,
    stop_receiver,
    wait_until_held,
)
from tests.nats_server import free_port

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "webhooks"
DATA = REPO / "examples" / "http_delivery" / "data" / "flights-2013-01.csv.gz"
MAX_DAY = 2
DOWN = "UA"
COMPUTATION, SINK = "to_events", "airlines"


class _Context:
    parameters: ClassVar[dict[str, int]] = {"max_day": MAX_DAY}


def expected_events() -> list[tuple[str, str, str, str]]:
    """(airline, origin, tailnum, sha256 of the body) of every event, in the source's order."""
    schema = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())["streams"]["flights"]["schema"]
    parse = {"int64": int, "double": float, "string": str}
    events = []
    with gzip.open(DATA, "rt", newline="") as text:
        for raw in csv.DictReader(text):
            row: dict[str, Any] = {}
            for column in schema:
                name, kind = column["name"], column["type"]
                nullable = kind != "string" or not column.get("required", False)
                row[name] = None if raw[name] in ("", "NA") and nullable else parse[kind](raw[name])
            event = FlightToWebhook().map(row, _Context())  # type: ignore[arg-type]
            if event is not None:
                events.append((event["airline"], row["origin"], str(event["tailnum"]),
                               hashlib.sha256(event["payload"].encode()).hexdigest()))
    return events


def write_specs(directory: Path, port: int) -> tuple[Path, Path]:
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"]["flights_csv"]["parameters"]["path"] = str(DATA)
    spec["computations"][COMPUTATION]["processing_function_parameters"]["max_day"] = MAX_DAY
    # A small memory bound: the down airline's backlog is left in SQLite's outbox and read back.
    spec["computations"][COMPUTATION]["sinks"][SINK]["parameters"]["max_buffered_per_endpoint"] = 8
    dynamic = yaml.safe_load((EXAMPLE / "dynamic_spec.yaml").read_text())
    parameters = dynamic["computations"][COMPUTATION]["sinks"][SINK]["parameters"]
    parameters["breaker"] = {"window": "10s", "minimum_requests": 3, "failure_ratio": 0.5, "open_for": "300ms"}
    for entry in parameters["endpoints"].values():
        entry["url"] = entry["url"].replace("8080", str(port))
    (directory / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (directory / "dynamic.yaml").write_text(yaml.safe_dump(dynamic, sort_keys=False))
    return directory / "spec.yaml", directory / "dynamic.yaml"


def owed_at_kill(state: Path) -> tuple[set[str], dict[int, dict[str, int]]]:
    """The keys the committed state still owes (above the partition's prefix and its endpoint's),
    and each partition's endpoint prefixes beyond the partition-wide one."""
    database = sqlite3.connect(f"{(state / 'egress.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        rows = database.execute("SELECT partition, max_persisted_seq_no, sink_state FROM sink_progress "
                                "WHERE consumer = ? AND sink = ?", (COMPUTATION, SINK)).fetchall()
    finally:
        database.close()
    low = {int(p): int(seq) for p, seq, _ in rows}
    prefixes = {int(p): decode_state(bytes(state_bytes)) for p, _, state_bytes in rows}
    owed = {idempotency_key(m.message_id) for consumer, p, m in read_outbox(state) if consumer == COMPUTATION
            and m.seq > low.get(p, 0) and m.seq > prefixes.get(p, {}).get(m.row["airline"], 0)}
    return owed, prefixes


def run(command: list[str], log: Path, processes: list[subprocess.Popen[bytes]],
        env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env=env)
    processes.append(process)
    return process


def test_sigkill_with_endpoints_at_different_positions_then_every_event_arrives_signed_in_order_per_key(
        tmp_path: Path, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    (tmp_path / "secret").write_text(secret + "\n")
    env = {**os.environ, "WEBHOOK_SECRET": secret}
    receiver: Receiver = launch_receiver(tmp_path / "received.jsonl", "--verify-secret", str(tmp_path / "secret"),
                                         "--fail-path", f"/hooks/{DOWN}")  # the key: webhook-id, by default then
    try:
        spec, dynamic = write_specs(tmp_path, receiver.port)
        state = tmp_path / "state"
        command = [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                   "--state-dir", str(state), "--quiet"]
        hold_after(receiver, 300)
        status_port = free_port()
        first = run([*command, "--http-port", str(status_port)], tmp_path / "run0.log", egress_processes, env)
        wait_until_held(receiver, first, tmp_path / "run0.log")
        with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=10) as answer:
            partitions = json.load(answer)["partitions"]
        endpoints = endpoint_summary(partitions)
        assert any(row["in_outbox"] for p in partitions for rows in (p.get("endpoints") or {}).values()
                   for row in rows if row["endpoint"] == DOWN), "the down airline's backlog is left in the outbox"
        down = next(row for row in endpoints if row["endpoint"] == DOWN)
        assert down["backlog"] > 0, endpoints  # /status shows each endpoint
        assert down["delivered"] == 0, endpoints
        resumed = subprocess.run([sys.executable, "-m", "egress", "endpoint", "resume", DOWN,
                                  f"127.0.0.1:{status_port}"], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed in" in resumed.stdout
        unknown = subprocess.run([sys.executable, "-m", "egress", "endpoint", "resume", "nobody",
                                  f"127.0.0.1:{status_port}"], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert unknown.returncode == 1
        assert "knows endpoint 'nobody'" in unknown.stderr
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        owed, prefixes = owed_at_kill(state)
        assert any(prefixes.values()), "no endpoint had acknowledged beyond its partition's prefix"
        release(receiver)
        receiver_stats(receiver, f"fail-path?path=/hooks/{DOWN}&up=1")
        last = run([*command, "--until-drained"], tmp_path / "run1.log", egress_processes, env)
        assert last.wait(timeout=180) == 0, (tmp_path / "run1.log").read_text()
        stats = receiver_stats(receiver)
    finally:
        stop_receiver(receiver)

    assert stats["signature_failures"] == 0
    assert stats["verified"] == stats["requests"]
    records = [json.loads(line) for line in (tmp_path / "received.jsonl").read_text().splitlines()]
    delivered = [r for r in records if r["status"] == 200]
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in delivered:
        by_key[record["idempotency_key"]].append(record)
    expected = expected_events()
    assert len(by_key) == len(expected)  # every event, each under one key
    assert sorted(r[0]["body_sha256"] for r in by_key.values()) == sorted(e[3] for e in expected)
    twice = {key for key, got in by_key.items() if len(got) > 1}
    assert twice <= owed, f"{len(twice - owed)} duplicates of messages acknowledged in the committed state"
    assert any(r["status"] == 503 for r in records), "the down endpoint was called while down"
    assert any(r["path"] == f"/hooks/{DOWN}" for r in delivered), "and got its messages afterwards"
    # Per (endpoint, partition: origin, key: tailnum) the first deliveries follow the source's order.
    first_seen = {r[0]["body_sha256"]: (r[0]["time"], r[0]["path"]) for r in by_key.values()}
    position = defaultdict(list)
    for airline, origin, tailnum, sha in expected:
        position[(airline, origin, tailnum)].append(sha)
    for (airline, _, tailnum), shas in position.items():
        if tailnum == "None" or len(set(shas)) < len(shas):
            continue  # no key, or two identical events
        times = [first_seen[sha][0] for sha in shas]
        assert times == sorted(times), f"{airline} plane {tailnum}: delivered out of order"
        assert {first_seen[sha][1] for sha in shas} == {f"/hooks/{airline}"}
