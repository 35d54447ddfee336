"""What the cluster benchmarks (``cluster.py``, ``cluster_ingest.py``, ``cluster_idle.py``,
``nats_readers.py``) read of the processes of a phase: a process's CPU seconds, the nats-server's
traffic and JetStream API requests, the log-append races a worker lost. A module of its own so
that each of those scripts imports it, and none of them imports another for these."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.nats_server import NatsServer

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RACES_LOST = re.compile(r"(\d+) log-append races lost")


def races_lost(log: Path) -> int:
    """The log-append races a worker's commits lost (a commit sent again after another writer's appends
    to the same log partition), from its log: the NATS engine says so as it closes; 0 without a log."""
    return sum(int(found) for found in RACES_LOST.findall(log.read_text(errors="replace"))) if log.exists() else 0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) ``pid`` has used so far, from ``/proc/<pid>/stat``.

    Raises ``OSError`` once the process is gone (reaped)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat(5)


def server_counters(server: NatsServer) -> dict[str, int]:
    """The server's traffic so far (``/varz``: ``in_msgs``, ``out_msgs``, ``in_bytes``, ``out_bytes``,
    every client) and its JetStream API requests (``/jsz``: ``api``), each a count since it started."""
    def monitor(path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/{path}", timeout=5) as answer:
            found: dict[str, object] = json.load(answer)
            return found

    varz, jsz = monitor("varz"), monitor("jsz")
    api = jsz.get("api")
    counters = {name: int(str(varz.get(name, 0))) for name in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")}
    counters["api"] = int(str(api.get("total", 0))) if isinstance(api, dict) else 0
    return counters


def traffic_note(before: dict[str, int], after: dict[str, int], count: int) -> str:
    """What the server handled per 1,000 messages of the phase (two :func:`server_counters`)."""
    per = {name: (after[name] - before.get(name, 0)) * 1000 / max(count, 1) for name in after}
    return (f"nats-server per 1,000 messages: {per['in_msgs']:,.1f} messages in, {per['out_msgs']:,.1f} out, "
            f"{per['in_bytes'] / 1024:,.0f} KiB in, {per['out_bytes'] / 1024:,.0f} KiB out, "
            f"{per['api']:,.1f} JetStream API requests")
