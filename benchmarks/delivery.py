"""Delivery throughput and memory: egress against nginx (and ``egress receiver``), compared with a raw
pycurl multi loop, bare aiohttp and the naive Python way, same bodies, same concurrency (issue 3).

What is measured, in one run, on loopback only:

1. 100,000 flight payloads are built from the first rows of ``data/flights-2013.csv.gz``: the
   orjson of each typed row, as ``examples/http_delivery/functions.py`` makes them (~300 bytes;
   cancelled flights are kept, so every row gives one body).
2. ``egress``: a temporary Spec reads those payloads from a JSONL file (one ``payload`` string and
   an ``id`` used as the key, so the rows spread over the partitions), passes them through an
   identity process function and POSTs them with the async HTTP sink **with its default parameters**
   (only ``url`` and ``payload_column`` are set). ``python -m egress run SPEC --until-drained --quiet
   --report R`` runs in a subprocess with a fresh state directory and full durability (SQLite
   ``synchronous=FULL``, the default). The figure is messages delivered / wall time of the whole
   process (start-up, reading the source into the log, every commit and every POST). egress's
   modules are compiled to bytecode first (``compile_egress``), as ``pip install`` leaves them: an
   editable install run with ``PYTHONDONTWRITEBYTECODE=1`` would compile every module from source
   at each start (0.3–0.5 s of CPU on this machine), which an installed egress does not pay.
   Concurrency: one libcurl client per partition job, whose pool is also its concurrency
   (``max_idle_connections``, default 8; ``docs/http-sink.md``). The Spec has ``partition_count`` 4
   (``--partitions``, as ``examples/http_delivery/spec.yaml``), so egress runs at most 4 × 8 = 32
   requests at once, and every other client below gets the same 32.
3. ``raw pycurl``: a plain ``CurlMulti`` perform/select loop in this process, 32 handles.
4. ``bare aiohttp``: one ``ClientSession`` with ``TCPConnector(limit=32)`` and 32 worker coroutines.
5. ``naive``: the usual Python way, ``requests.Session`` (its adapter's pool sized to 32, so that it
   does not open and drop connections) + ``ThreadPoolExecutor(32)`` + ``tenacity`` retries
   (3 attempts, exponential backoff) on every connection error and non-2xx.
6. ``backlog``: peak RSS of the egress process while a backlog of 1,000,000 messages (the payloads
   cycled, ids 0..999,999) drains to nginx with ``--until-drained``: ``VmRSS`` and ``VmHWM`` (the
   kernel's high-water mark) of ``/proc/<pid>/status`` sampled every 0.2 s until it exits.
   ``--backlog 0`` skips it (it takes a few minutes).

Every client sends the body and the ``Idempotency-Key`` egress would send for that message. Every
phase must deliver every message: the endpoint's count of distinct keys answered 2xx is checked, and
the script exits 1 if any phase lost one. Targets (issue 3) are checked against nginx and printed as
PASS/MISS; the last line is one comparable summary.

The endpoints: nginx (Debian ``nginx-light``; installed with apt-get when missing and running as
root, else that part is skipped with a message), started on 127.0.0.1 with its own temporary prefix
and config (one worker, ``return 200``, keys counted from its access log) and stopped at the end;
then ``egress receiver`` (aiohttp, one process) as the second target, restarted before each phase so
that its ``GET /stats`` counts belong to that phase alone.

Run it from the repository root (figures and interpretation: ``docs/benchmarks.md``)::

    python benchmarks/delivery.py                       # nginx then receiver, then the 1M backlog
    python benchmarks/delivery.py --target nginx --backlog 0
    python benchmarks/delivery.py --profile             # + one egress run under py-spy, µs/message by module
    python benchmarks/delivery.py --tracing-ratio 0.01  # + "egress traced": OpenTelemetry on, 1 % sampled
    python benchmarks/delivery.py --target nginx --backlog 0 --instructions 20000,60000  # cachegrind only

``--tracing-ratio R`` adds the phase ``egress traced`` after ``egress``: the same run with tracing on
(``OTEL_EXPORTER_OTLP_ENDPOINT`` at an OTLP/HTTP sink in this process that answers every export 200,
``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=R``); its CPU per message
against the ``egress`` phase of the same run is the cost of tracing (``docs/observability.md``).

``--instructions N,M`` runs no phase but one ``egress run`` of each count under ``valgrind
--tool=cachegrind --cache-sim=no`` (nginx the target) and prints the instructions of each and the
slope between the shortest and the longest: the per-message count, which the machine's load does
not move (CPU seconds on a shared machine move ±15 %), the start-up taken out. With ``--callgrind``
the same runs are under ``valgrind --tool=callgrind --dump-instr=no`` instead (slower still), to
attribute the instructions per function: ``--keep DIR`` keeps ``DIR/cachegrind-0.out`` and so on, for
``callgrind_annotate --inclusive=yes``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import compileall
import concurrent.futures
import csv
import gzip
import json
import os
import re
import resource
import select
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pycurl
import requests
import requests.adapters
import tenacity
import yaml

from egress.keys import derived_message_id, idempotency_key, source_message_id

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT / "data" / "flights-2013.csv.gz"
SOURCE_ID = "payloads"
IDEMPOTENCY_HEADER = "Idempotency-Key"  # the sink's default idempotency_header
MAX_ATTEMPTS = 3  # the raw loops retry a failed POST this many times in all (egress: its retry policy)
DEFAULT_POOL = 8  # the sink's default max_idle_connections: its per-client (per-partition) concurrency
RSS_PERIOD = 0.2  # seconds between two VmRSS samples of the backlog run
# Ratios egress ÷ another client, against nginx: (label, result key, what is compared, comparison,
# bound or None). Issue 16's targets replace issue 3's (set against a slower machine): msg/s >= 0.35 ×
# the raw pycurl loop's and CPU per message <= 2.5 × its; the other ratios are printed without a bound.
TARGETS: tuple[tuple[str, str, str, str, float | None], ...] = (
    ("egress / raw pycurl, msg/s", "raw pycurl", "rate", ">=", 0.35),
    ("egress / durable raw, msg/s", "durable raw", "rate", ">=", None),
    ("egress / bare aiohttp, msg/s", "bare aiohttp", "rate", ">=", None),
    ("egress / naive (requests + 32 threads + tenacity), msg/s", "naive", "rate", ">=", None),
    ("egress CPU / raw pycurl CPU, per message", "raw pycurl", "cpu", "<=", 2.5),
    ("egress CPU / durable raw CPU, per message", "durable raw", "cpu", "<=", None),
    ("egress sink alone CPU / raw pycurl CPU, per message", "raw pycurl", "sink cpu", "<=", None),
)
RSS_TARGET_MB = 80.0  # issue 25 point 5
DURABLE_CHUNK = 1_000  # durable raw: messages per log transaction, and completions per progress commit
MEASURE_NAMES = {"rate": "egress", "cpu": "egress CPU", "sink cpu": "sink CPU"}  # in the summary
SHORT_NAMES = {"raw pycurl": "pycurl", "durable raw": "durable", "bare aiohttp": "aiohttp"}  # in the summary
PHASES = ("egress", "sink", "pycurl", "durable", "aiohttp", "naive")
SINK_CHUNK = 2_048  # the sink phase: messages per distribute() call (the partition job's epoch_max_messages)

# The process functions egress imports (``functions:PassPayload``, or ``functions:PassPayloadProcess`` with
# ``--function process``), written next to the Spec so that the egress process imports nothing of this
# script (its RSS is measured). They do the same: the MapFunction is what a user writes for a map.
FUNCTIONS_MODULE = '''\
from typing import Any

from egress import MapFunction, Message, OutputCollector, ProcessFunction, RuntimeContext


class PassPayload(MapFunction):
    """The identity map of the benchmark: each row's payload goes to the sink as is."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        return {"payload": row["payload"]}


class PassPayloadProcess(ProcessFunction):
    """The same as a general process function (``--function process``)."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("requests", {"payload": message.row["payload"]})
'''
FUNCTIONS = {"map": "functions:PassPayload", "process": "functions:PassPayloadProcess"}
function_name = FUNCTIONS["map"]  # the process function of every egress phase (``--function``)

# The typed columns of examples/http_delivery/spec.yaml, in schema order, and the required ones.
FLIGHT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("year", "int64"), ("month", "int64"), ("day", "int64"), ("dep_time", "int64"),
    ("sched_dep_time", "int64"), ("dep_delay", "double"), ("arr_time", "int64"), ("sched_arr_time", "int64"),
    ("arr_delay", "double"), ("carrier", "string"), ("flight", "int64"), ("tailnum", "string"),
    ("origin", "string"), ("dest", "string"), ("air_time", "double"), ("distance", "double"),
    ("hour", "int64"), ("minute", "int64"), ("time_hour", "string"),
)
REQUIRED = frozenset({"year", "month", "day", "carrier", "origin"})
NULLS = frozenset({"NA", ""})


# -- the workload ---------------------------------------------------------------------------------
def build_bodies(count: int) -> list[bytes]:
    """orjson of the first ``count`` typed flight rows (the example's payload shape)."""
    convert = {"int64": int, "double": float, "string": str}
    bodies: list[bytes] = []
    with gzip.open(DATA, "rt", newline="", encoding="utf-8") as text:
        for fields in csv.DictReader(text):
            if len(bodies) == count:
                break
            row: dict[str, Any] = {}
            for name, kind in FLIGHT_COLUMNS:
                raw = fields[name]
                row[name] = None if raw in NULLS and name not in REQUIRED else convert[kind](raw)
            # A copy: orjson's own result keeps its ~8 KB output buffer allocated (100,000 of them: ~800 MB).
            bodies.append(orjson.dumps(row).decode().encode())
    if len(bodies) < count:
        raise SystemExit(f"{DATA} has only {len(bodies):,} rows, {count:,} asked")
    return bodies


def egress_keys(count: int) -> list[str]:
    """The Idempotency-Key egress sends for message ``i``: the id of the one output of source row ``i``."""
    return [idempotency_key(derived_message_id(source_message_id(SOURCE_ID, 0, i), 0)) for i in range(count)]



def write_source(path: Path, bodies: Sequence[bytes], count: int) -> None:
    """The JSONL input of egress: ``count`` rows ``{"id": i, "payload": bodies[i % len(bodies)]}``.

    Each body's JSON string is encoded once, so a 1,000,000-row file takes a second or two."""
    tails = [b',"payload":' + orjson.dumps(body.decode()) + b"}\n" for body in bodies]
    size = len(tails)
    with open(path, "wb", buffering=1 << 20) as out:
        for chunk in range(0, count, 10_000):
            out.write(b"".join(b'{"id":%d%s' % (i, tails[i % size]) for i in range(chunk, min(count, chunk + 10_000))))


# -- endpoints ------------------------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line of ``process``, waiting at most ``timeout`` seconds."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline()


def stop_process(process: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class Target:
    """An HTTP endpoint that counts what it received; ``start()`` before a phase, ``finish()`` after."""

    name = "target"
    url = ""

    def start(self) -> None:
        raise NotImplementedError

    def finish(self) -> dict[str, int]:
        """Stop the endpoint (if not stopped yet) and return ``requests``, ``distinct_keys``, ``bytes``."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class ReceiverTarget(Target):
    """``python -m egress receiver`` on 127.0.0.1 and a free port (it picks and prints one)."""

    name = "egress receiver"

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.stop()
        process = subprocess.Popen([sys.executable, "-m", "egress", "receiver", "--host", "127.0.0.1",
                                    "--port", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self._process = process
        line = read_line(process, timeout=30)
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)/", line)
        if found is None:
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.url = f"{found.group(1)}/events"

    def finish(self) -> dict[str, int]:
        stats_url = self.url.rsplit("/", 1)[0] + "/stats"
        with urllib.request.urlopen(stats_url, timeout=30) as answer:
            stats = json.load(answer)
        self.stop()
        return {"requests": stats["requests"], "distinct_keys": stats["distinct_keys"],
                "bytes": stats["bytes_received"]}

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process)
            self._process = None


def find_or_install_nginx() -> str | None:
    """The nginx binary; when there is none, ``apt-get install -y nginx-light`` (as root). None if that fails."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if found is not None:
        return found
    if os.geteuid() != 0:
        print("nginx: not installed and not running as root, so not installing it (apt-get install -y nginx-light)."
              " The nginx part is SKIPPED.", flush=True)
        return None
    print("nginx: not installed; running apt-get update && apt-get install -y nginx-light ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "nginx-light"]):
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            print(f"nginx: {' '.join(command)} failed ({error}). The nginx part is SKIPPED.", flush=True)
            return None
        if done.returncode != 0:
            print(f"nginx: {' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}\n"
                  "The nginx part is SKIPPED.", flush=True)
            return None
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        print("nginx: installed nginx-light but found no nginx binary. The nginx part is SKIPPED.", flush=True)
    return found


class NginxTarget(Target):
    """A local nginx (one worker) answering 200 to every POST; keys with a 2xx are counted from its
    access log. Optional: it shows the clients against a server that is far from being the bottleneck.
    """

    name = "nginx"
    log_format = "$http_idempotency_key $status $request_length"  # what finish() reads
    http_settings = ""  # more directives of the http block (benchmarks/batching.py: a larger body limit)

    def __init__(self, binary: str, work: Path) -> None:
        self._binary = binary
        self._work = work / "nginx"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self._work / "access.log"

    def start(self) -> None:
        self.stop()
        self._work.mkdir(parents=True, exist_ok=True)
        self._log.unlink(missing_ok=True)
        port = free_port()
        work = self._work
        temp = "\n".join(f"  {kind}_temp_path {work / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                          "uwsgi", "scgi"))
        config = work / "nginx.conf"
        config.write_text(f"""daemon off;
worker_processes 1;
pid {work / "nginx.pid"};
error_log {work / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
{temp}
  log_format keys '{self.log_format}';
  access_log {self._log} keys buffer=256k;{self.http_settings}
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  server {{
    listen 127.0.0.1:{port} backlog=1024;
    location / {{ return 200 "ok\\n"; }}
  }}
}}
""")
        self._process = subprocess.Popen([self._binary, "-p", str(work), "-c", str(config)])
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start; see {work / 'error.log'}") from None
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}/events"

    def finish(self) -> dict[str, int]:
        self.stop()  # SIGQUIT: a graceful stop that flushes the access log
        received, keys = 0, set()
        with open(self._log, encoding="utf-8") as log:
            for line in log:
                key, status, _ = line.split(" ", 2)
                received += 1
                if status.startswith("2") and key != "-":
                    keys.add(key)
        return {"requests": received, "distinct_keys": len(keys), "bytes": 0}

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, signal.SIGQUIT)
            self._process = None

# -- the phases -----------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    name: str
    messages: int
    seconds: float
    cpu_seconds: float = 0.0  # the client's CPU time (user + system): egress's process, or this one's
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    peak_rss_mb: float = 0.0  # egress only: the largest VmRSS sample
    max_rss_mb: float = 0.0  # egress only: its last VmHWM sample (the kernel's high-water mark of VmRSS)
    threads: dict[str, float] = field(default_factory=dict)  # egress only: CPU seconds by thread name

    @property
    def cpu_per_message_us(self) -> float:
        """Client CPU (user + system, every thread) per message sent, in µs."""
        return 1e6 * self.cpu_seconds / self.messages if self.messages else 0.0

    @property
    def delivered(self) -> int:
        return self.stats.get("distinct_keys", 0)

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.delivered == self.messages


def _vm_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB, from ``/proc/<pid>/status``; zeros once it is gone."""
    found = {"VmRSS:": 0.0, "VmHWM:": 0.0}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                name = line[:6]
                if name in found:
                    found[name] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found["VmRSS:"], found["VmHWM:"]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tree_threads(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds (user + system) of every thread of ``pid`` and of its descendants, from
    ``/proc/<pid>/task/*/stat``: ``(pid, tid) -> (thread name, seconds)``; empty once it is gone."""
    found: dict[tuple[int, int], tuple[str, float]] = {}
    todo = [pid]
    while todo:
        process = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{process}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{process}/task/{tid}/stat", encoding="ascii", errors="replace") as stat:
                    text = stat.read()
                with open(f"/proc/{process}/task/{tid}/children", encoding="ascii") as children:
                    todo.extend(int(child) for child in children.read().split())
            except OSError:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            # Fields 14 and 15 of stat (utime, stime), counted from the state field (3) here.
            found[(process, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


def _by_thread(samples: dict[tuple[int, int], tuple[str, float]], root: int) -> dict[str, float]:
    """CPU seconds by thread, largest first: ``main`` (the process's first thread), else the thread's
    name and id (Python 3.11 does not name its threads for the kernel: they show as ``python``); a
    child process's threads are prefixed with its pid."""
    named: dict[str, float] = {}
    for (process, tid), (name, seconds) in samples.items():
        label = "main" if tid == process else f"{name}:{tid}"
        label = label if process == root else f"pid {process} {label}"
        named[label] = named.get(label, 0.0) + seconds
    return dict(sorted(named.items(), key=lambda item: -item[1]))


def _wait_sampling(process: subprocess.Popen[bytes], timeout: float
                   ) -> tuple[float, float, float, dict[str, float]]:
    """Wait for ``process`` (reaping it with ``os.wait4``), sampling its VmRSS and VmHWM and the CPU of
    every thread of its process tree every ``RSS_PERIOD`` s. (Not ``ru_maxrss`` of the reaped child: it
    counts the pages the child shared with this process between fork and exec.)

    Returns (largest VmRSS sample, last VmHWM sample, in MB; CPU seconds of the process and of every
    descendant it waited for, from ``wait4``; CPU seconds by thread name at the last sample, which
    misses at most the last ``RSS_PERIOD``). Raises ``subprocess.TimeoutExpired`` after ``timeout``
    seconds (the process is still running then)."""
    deadline = time.monotonic() + timeout
    peak = high = 0.0
    threads: dict[tuple[int, int], tuple[str, float]] = {}
    exited = os.pidfd_open(process.pid)  # readable once the process exits: its end is timed exactly
    try:
        while True:
            rss, hwm = _vm_mb(process.pid)
            peak, high = max(peak, rss), max(high, hwm)
            threads.update(_tree_threads(process.pid))
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                return peak, high, usage.ru_utime + usage.ru_stime, _by_thread(threads, process.pid)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, timeout)
            select.select([exited], [], [], RSS_PERIOD)
    finally:
        os.close(exited)


def benchmark_spec(pipeline: str, partitions: int, source: Path, sinks: dict[str, dict[str, Any]],
                   source_id: str = SOURCE_ID) -> dict[str, Any]:
    """The Spec of the benchmarks' pipeline (this one's, ``pipeline_cost.py``'s and ``batching.py``'s):
    the JSONL file ``source`` (source ``source_id``; an ``id`` key, a ``payload`` string) →
    ``function_name`` (``functions:PassPayload``) → ``sinks`` (sink id → its Spec without
    ``input_stream_ids``, which is the ``requests`` stream), ``partitions`` partitions."""
    return {
        "pipeline": pipeline,
        "partition_count": partitions,
        "streams": {
            "rows": {"schema": [{"name": "id", "type": "int64", "required": True},
                                {"name": "payload", "type": "string", "required": True}],
                     "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string", "required": False}]},
        },
        "sources": {source_id: {"source_class_name": "jsonl", "output_stream_id": "rows",
                                "parameters": {"path": str(source)}}},
        "computations": {"deliver": {
            "computation_class_name": "NYT::NFlow::TProcessFunctionComputation",
            "processing_function": function_name,
            "input_stream_ids": ["rows"],
            "output_stream_ids": ["requests"],
            "sinks": {sink_id: {**sink, "input_stream_ids": ["requests"]} for sink_id, sink in sinks.items()},
        }},
    }


def compile_egress() -> None:
    """Writes the bytecode of every module of the ``egress`` package this interpreter imports into its
    ``__pycache__`` (only the stale ones), so that the ``egress run`` subprocess starts from bytecode
    as an installed package does, whatever ``PYTHONDONTWRITEBYTECODE`` says."""
    import egress

    compileall.compile_dir(str(Path(egress.__file__).parent), quiet=1)


def run_egress(target: Target, bodies: Sequence[bytes], count: int, partitions: int, pool: int | None,
               work: Path, timeout: float, name: str = "egress", profile: Path | None = None,
               processes: int | None = None, gil: bool = True,
               environment: dict[str, str] | None = None, instructions: Path | None = None,
               callgrind: bool = False) -> PhaseResult:
    """One ``egress run`` subprocess from a fresh state directory on ``count`` messages (``bodies`` cycled);
    timed from spawn to exit, its RSS and per-thread CPU sampled. ``pool`` None keeps the sink's default
    ``max_idle_connections``. With ``profile``, egress runs under ``py-spy record -f raw --threads``
    (with ``gil``, ``--gil``: only the thread holding the GIL is sampled); with
    ``processes``, ``egress run --processes N``; ``environment``: variables added to the process's; with
    ``instructions``, egress runs under ``valgrind --tool=cachegrind --cache-sim=no`` writing that file
    (its instruction count in the notes, read by :func:`cachegrind_total`), or with ``callgrind`` under
    ``valgrind --tool=callgrind --dump-instr=no`` (per function, with the calls between them: read it with
    ``callgrind_annotate --inclusive=yes``)."""
    compile_egress()
    phase = work / name.replace(" ", "-")
    shutil.rmtree(phase, ignore_errors=True)  # a fresh state directory: no resumed run
    phase.mkdir(parents=True)
    (phase / "functions.py").write_text(FUNCTIONS_MODULE)
    source = phase / "payloads.jsonl"
    write_source(source, bodies, count)
    parameters: dict[str, Any] = {"url": target.url, "payload_column": "payload"}  # the rest: defaults
    if pool is not None:
        parameters["max_idle_connections"] = pool
    spec = benchmark_spec("delivery_benchmark", partitions, source,
                          {"http": {"sink_class_name": "NYT::NFlow::TAsyncHttpSink", "parameters": parameters}})
    spec_path = phase / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    report_path = phase / "report.json"
    command = [sys.executable, "-m", "egress", "run", str(spec_path), "--state-dir", str(phase / "state"),
               "--until-drained", "--quiet", "--report", str(report_path)]
    if processes is not None:
        command += ["--processes", str(processes)]
    if profile is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [py_spy, "record", *(["--gil"] if gil else []), "--threads", "--full-filenames", "-f", "raw",
                   "-r", str(PROFILE_RATE), "-o", str(profile), "--", *command]
    elif instructions is not None and callgrind:
        command = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={instructions}",
                   *command]
    elif instructions is not None:
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={instructions}",
                   *command]
    output = open(phase / "egress.log", "wb")  # noqa: SIM115 - closed below, after the process ends
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=phase, stdout=output, stderr=subprocess.STDOUT,
                               env=None if environment is None else {**os.environ, **environment})
    try:
        peak, max_rss, cpu_seconds, threads = _wait_sampling(process, timeout)
    except subprocess.TimeoutExpired:
        stats = target.finish()
        raise RuntimeError(f"{name} did not finish within {timeout:.0f} s; the endpoint had received "
                           f"{stats['distinct_keys']:,} of {count:,} keys (--keep DIR keeps its state)") from None
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        output.close()
    seconds = time.perf_counter() - started
    result = PhaseResult(name, count, seconds, cpu_seconds=cpu_seconds, peak_rss_mb=peak, max_rss_mb=max_rss,
                         threads=threads)
    if process.returncode != 0:
        tail = (phase / "egress.log").read_text(errors="replace").strip()[-2000:]
        result.notes.append(f"egress exited {process.returncode}: {tail}")
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    in_run = float(report.get("messages_per_second", 0.0))
    result.notes.append(
        f"in-run {in_run:,.0f} msg/s over {report.get('elapsed_seconds', 0.0):.2f} s (report), "
        f"{report.get('posts', 0):,} POSTs, {report.get('retries', 0):,} retries, "
        f"{report.get('epochs', 0):,} epochs committed; RSS peak {peak:,.0f} MB sampled, "
        f"{max_rss:,.0f} MB VmHWM")
    result.notes.append("CPU by thread (/proc/PID/task/*/stat, last sample): " + ", ".join(
        f"{thread} {seconds:.2f} s" for thread, seconds in threads.items() if seconds >= 0.01))
    if instructions is not None and instructions.exists():
        total = cachegrind_total(instructions)
        tool = "callgrind" if callgrind else "cachegrind"
        result.notes.append(f"instructions ({tool}): {total / 1e6:,.0f} M, {total / count / 1e3:,.1f} K per "
                            "message (start-up included)")
    result.stats = target.finish()
    result.stats["in_run_rate"] = round(in_run)
    return result


def cachegrind_total(out: Path) -> int:
    """The instructions counted in a cachegrind or callgrind output file (its ``summary:`` line)."""
    return next(int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("summary:"))


def instruction_lines(counts: Sequence[int], totals: Sequence[int]) -> list[str]:
    """The per-message slope of ``totals`` (instructions of one ``egress run`` of each of ``counts``
    messages) between the smallest and the largest count, and the start-up it leaves: a figure of the
    per-message path that the machine's load cannot move."""
    first, last = min(range(len(counts)), key=counts.__getitem__), max(range(len(counts)), key=counts.__getitem__)
    lines = [f"  egress run of {count:,} messages: {total / 1e6:,.0f} M instructions"
             for count, total in zip(counts, totals, strict=True)]
    if counts[last] > counts[first]:
        slope = (totals[last] - totals[first]) / (counts[last] - counts[first])
        lines.append(f"  per message (slope {counts[first]:,} → {counts[last]:,}): {slope / 1e3:,.1f} K "
                     f"instructions; start-up {(totals[first] - slope * counts[first]) / 1e6:,.0f} M")
    return lines


class DurableLog:
    """The least durability egress promises, for the ``durable raw`` phase (issue 16 point 4): each
    chunk of ``DURABLE_CHUNK`` messages is inserted into a SQLite log (WAL, ``synchronous=FULL``) in
    one transaction before any of it is sent, and the contiguous acknowledged prefix is committed
    after each ``DURABLE_CHUNK`` completions (and at the end)."""

    def __init__(self, path: Path, count: int) -> None:
        path.unlink(missing_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, idempotency_key TEXT NOT NULL, body BLOB NOT NULL)")
        self.db.execute("CREATE TABLE progress (id INTEGER PRIMARY KEY, acknowledged INTEGER NOT NULL)")
        self.db.execute("INSERT INTO progress VALUES (0, 0)")
        self.appended = 0  # messages 0..appended-1 are in the log
        self.prefix = 0  # messages 0..prefix-1 are acknowledged, and committed as such
        self.acknowledged = bytearray(count)
        self.unsaved = 0  # completions since the last progress commit
        self.commits = 0

    def append_chunk(self, bodies: Sequence[bytes], keys: Sequence[str]) -> range:
        """Make the next chunk durable; returns its message indexes, now allowed to be sent."""
        chunk = range(self.appended, min(self.appended + DURABLE_CHUNK, len(bodies)))
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO log VALUES (?, ?, ?)", ((i, keys[i], bodies[i]) for i in chunk))
        self.db.execute("COMMIT")
        self.commits += 1
        self.appended = chunk.stop
        return chunk

    def acknowledge(self, index: int) -> None:
        self.acknowledged[index] = 1
        self.unsaved += 1
        if self.unsaved >= DURABLE_CHUNK:
            self.save_progress()

    def save_progress(self) -> None:
        """Commit the contiguous acknowledged prefix."""
        prefix, acknowledged = self.prefix, self.acknowledged
        while prefix < len(acknowledged) and acknowledged[prefix]:
            prefix += 1
        self.prefix, self.unsaved = prefix, 0
        self.db.execute("BEGIN")
        self.db.execute("UPDATE progress SET acknowledged = ? WHERE id = 0", (prefix,))
        self.db.execute("COMMIT")
        self.commits += 1

    def close(self) -> None:
        self.db.close()


STARTUP_MESSAGES = 1_000
"""``egress traced``: the messages of the two short runs (tracing off, on) whose CPU difference is
tracing's start-up cost (importing the SDK, its exporter and protobuf), taken out of the per-message
figure."""


def run_traced(target: Target, bodies: Sequence[bytes], args: argparse.Namespace, pool: int | None, work: Path,
               results: dict[str, PhaseResult]) -> PhaseResult:
    """The phase ``egress traced``: ``args.messages`` with tracing on (``args.tracing_ratio`` sampled),
    then :data:`STARTUP_MESSAGES` with tracing off and on, for its start-up cost."""
    otlp = OtlpSink()
    try:
        environment = otlp.environment(args.tracing_ratio)
        result = run_egress(target, bodies, args.messages, args.partitions, pool, work, args.timeout,
                            name="egress traced", environment=environment)
        stats = result.stats
        short = {}
        for name, extra in (("egress short", None), ("egress traced short", environment)):
            target.start()
            short[name] = run_egress(target, bodies, STARTUP_MESSAGES, args.partitions, pool, work, args.timeout,
                                     name=name, environment=extra)
        result.stats = stats
    finally:
        otlp.stop()
    startup = short["egress traced short"].cpu_seconds - short["egress short"].cpu_seconds
    result.notes.append(f"tracing: {args.tracing_ratio:g} sampled, {otlp.exports} OTLP exports, {otlp.bytes:,} bytes; "
                        f"start-up cost {startup:.2f} s CPU ({STARTUP_MESSAGES:,}-message runs, off and on)")
    off = results.get("egress")
    if off is not None and args.messages > STARTUP_MESSAGES:
        marginal = (result.cpu_seconds - off.cpu_seconds - startup) / (args.messages - STARTUP_MESSAGES) * 1e6
        share = marginal / off.cpu_per_message_us * 100
        result.notes.append(f"tracing per message beyond start-up: {marginal:+.1f} µs CPU ({share:+.1f} % of "
                            f"egress's {off.cpu_per_message_us:.1f})")
    return result


class OtlpSink:
    """An OTLP/HTTP endpoint in a thread of this process for ``egress traced``: answers every export
    200 (an empty ``ExportTraceServiceResponse``) and counts the exports and their bytes."""

    def __init__(self) -> None:
        import http.server

        sink = self
        self.exports = 0
        self.bytes = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                sink.exports += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def environment(self, ratio: float) -> dict[str, str]:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.url, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": repr(ratio)}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def raw_post_handles(url: str, concurrency: int, *, timeout_ms: int) -> tuple[pycurl.CurlMulti, list[pycurl.Curl]]:
    """The floors' libcurl: a multi handle keeping at most ``concurrency`` connections, and that many
    easy handles POSTing to ``url`` over HTTP/1.1 (answers discarded, ``timeout_ms`` per request)."""
    multi = pycurl.CurlMulti()
    multi.setopt(pycurl.M_MAXCONNECTS, concurrency)
    handles = [pycurl.Curl() for _ in range(concurrency)]
    for handle in handles:
        handle.setopt(pycurl.URL, url.encode())
        handle.setopt(pycurl.POST, 1)
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.TIMEOUT_MS, timeout_ms)
        handle.setopt(pycurl.WRITEFUNCTION, len)
    return multi, handles


def run_pycurl(target: Target, bodies: Sequence[bytes], keys: Sequence[str], concurrency: int,
               timeout: float, durable: Path | None = None) -> PhaseResult:
    """A plain CurlMulti perform/select loop keeping ``concurrency`` POSTs in flight; with ``durable`` (a
    database file), the ``durable raw`` phase: the same loop sending only what a :class:`DurableLog`
    there has made durable, and recording the acknowledged prefix in it."""
    multi, spare = raw_post_handles(target.url, concurrency, timeout_ms=10_000)
    handles = list(spare)
    log = DurableLog(durable, len(bodies)) if durable is not None else None
    todo: collections.deque[tuple[int, int]] = collections.deque(
        (i, 1) for i in range(len(bodies) if log is None else 0))
    running: dict[int, tuple[int, int]] = {}  # id(handle) → (message index, attempt)
    succeeded = failed_for_good = 0
    errors: collections.Counter[str] = collections.Counter()

    def finished(handle: pycurl.Curl, error: str | None) -> None:
        nonlocal succeeded, failed_for_good
        index, attempt = running.pop(id(handle))
        status = int(handle.getinfo(pycurl.RESPONSE_CODE))
        multi.remove_handle(handle)
        spare.append(handle)
        if error is None and 200 <= status <= 299:
            succeeded += 1
            if log is not None:
                log.acknowledge(index)
            return
        errors[error or f"HTTP {status}"] += 1
        if attempt < MAX_ATTEMPTS:
            todo.append((index, attempt + 1))
        else:
            failed_for_good += 1

    deadline = time.monotonic() + timeout
    cpu_before = time.process_time()
    started = time.perf_counter()
    try:
        while todo or running or (log is not None and log.appended < len(bodies)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw pycurl did not finish within {timeout:.0f} s")
            if log is not None and len(todo) < concurrency and log.appended < len(bodies):
                todo.extend((i, 1) for i in log.append_chunk(bodies, keys))
            while todo and spare:
                index, attempt = todo.popleft()
                handle = spare.pop()
                body = bodies[index]
                handle.setopt(pycurl.POSTFIELDSIZE, len(body))
                handle.setopt(pycurl.POSTFIELDS, body)
                handle.setopt(pycurl.HTTPHEADER, [f"{IDEMPOTENCY_HEADER}: {keys[index]}", "Content-Type:",
                                                  "Expect:"])  # what egress's curl client sends
                running[id(handle)] = (index, attempt)
                multi.add_handle(handle)
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            completed = 0
            while True:
                queued, ok, failed = multi.info_read()
                for handle in ok:
                    finished(handle, None)
                for handle, errno, message in failed:
                    finished(handle, f"curl error {errno}: {message}")
                completed += len(ok) + len(failed)
                if not queued:
                    break
            if not completed:
                multi.select(1.0)
        if log is not None:
            log.save_progress()
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_before
    finally:
        for handle in handles:
            if id(handle) in running:
                multi.remove_handle(handle)
            handle.close()
        multi.close()
        if log is not None:
            log.close()
    result = PhaseResult("raw pycurl" if log is None else "durable raw", len(bodies), seconds,
                         cpu_seconds=cpu_seconds)
    result.notes.append(attempts_note(succeeded, errors, failed_for_good))
    if log is not None:
        result.notes.append(f"SQLite log (WAL, synchronous=FULL): {log.commits:,} commits, acknowledged prefix "
                            f"{log.prefix:,} of {len(bodies):,}")
    result.stats = target.finish()
    return result


def outbox_messages(bodies: Sequence[bytes], partitions: int) -> list[list[Any]]:
    """Each partition's outbox messages of ``bodies`` (``seq`` from 1; ids and keys as egress makes them)."""
    from egress.engines import OutboxMessage

    by_partition: list[list[Any]] = [[] for _ in range(partitions)]
    for index, body in enumerate(bodies):  # payloads as the outbox holds them: str
        message_id = derived_message_id(source_message_id(SOURCE_ID, 0, index), 0)
        batch = by_partition[index % partitions]
        batch.append(OutboxMessage(len(batch) + 1, "requests", message_id, b"[]", None, {"payload": body.decode()}))
    return by_partition


async def _sink_phase(url: str, by_partition: list[list[Any]], partitions: int, pool: int | None) -> tuple[float, int]:
    """The async HTTP sink alone, one instance per partition as the jobs have it, fed from memory in
    chunks of ``SINK_CHUNK`` committed messages while fewer than that are unacknowledged (as a
    partition job's epochs feed it), the acknowledged prefix taken at each progress callback."""
    from egress.clock import RealClock
    from egress.connectors.base import SinkContext
    from egress.connectors.sinks.async_http import AsyncHttpSink
    from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
    from egress.engines import SinkProgress
    from egress.observe import Metrics, StatusTree

    parameters: dict[str, Any] = {"url": url, "payload_column": "payload"}
    if pool is not None:
        parameters["max_idle_connections"] = pool
    metrics, status, clock = Metrics(), StatusTree(), RealClock()
    done = asyncio.Event()
    total = sum(map(len, by_partition))
    sinks: list[AsyncHttpSink] = []
    acknowledged = [0] * partitions
    fed = [0] * partitions

    def progress(partition: int) -> None:
        sink = sinks[partition]
        acknowledged[partition] = sink.progress().max_persisted_seq_no
        if sink.unacknowledged < SINK_CHUNK and fed[partition] < len(by_partition[partition]):
            feed(partition)
        if sum(acknowledged) == total:
            done.set()

    def feed(partition: int) -> None:
        start = fed[partition]
        fed[partition] = min(start + SINK_CHUNK, len(by_partition[partition]))
        sinks[partition].distribute(by_partition[partition][start:fed[partition]])

    for partition in range(partitions):
        context = SinkContext("deliver", "http", partition, clock, metrics, status,
                              lambda _progress, partition=partition: progress(partition))  # type: ignore[misc]
        sinks.append(AsyncHttpSink(context, AsyncHttpSinkParameters.model_validate(parameters),
                                   AsyncHttpSinkDynamicParameters(), SinkProgress()))
    started = time.perf_counter()
    for partition in range(partitions):
        feed(partition)
        feed(partition)  # two chunks ahead, as consecutive epochs
    await done.wait()
    seconds = time.perf_counter() - started
    for sink in sinks:
        await sink.close()
    return seconds, sum(acknowledged)


def run_sink(target: Target, bodies: Sequence[bytes], partitions: int, pool: int | None,
             timeout: float) -> PhaseResult:
    """egress's half after the outbox commit, alone in this process: ``partitions`` async HTTP sinks
    (default parameters) on egress's curl client, same payloads, keys and concurrency as egress."""

    by_partition = outbox_messages(bodies, partitions)  # built before the CPU count starts

    async def bounded() -> tuple[float, int]:
        try:
            return await asyncio.wait_for(_sink_phase(target.url, by_partition, partitions, pool), timeout)
        except TimeoutError:
            raise RuntimeError(f"egress sink did not finish within {timeout:.0f} s") from None

    cpu_before = time.process_time()
    seconds, acknowledged = asyncio.run(bounded())
    result = PhaseResult("egress sink", len(bodies), seconds, cpu_seconds=time.process_time() - cpu_before)
    result.notes.append(f"{acknowledged:,} acknowledged in seq order; no log, no outbox, no process function")
    result.stats = target.finish()
    return result


async def _aiohttp_phase(url: str, bodies: Sequence[bytes], keys: Sequence[str], concurrency: int,
                         errors: collections.Counter[str]) -> tuple[float, int, int]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    succeeded = failed_for_good = 0
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
        indexes = iter(range(len(bodies)))

        async def worker() -> None:
            nonlocal succeeded, failed_for_good
            for index in indexes:  # one shared iterator: each worker takes the next message
                headers = {IDEMPOTENCY_HEADER: keys[index]}
                for _ in range(MAX_ATTEMPTS):
                    try:
                        async with session.post(url, data=bodies[index], headers=headers) as response:
                            await response.read()
                            if 200 <= response.status <= 299:
                                succeeded += 1
                                break
                            errors[f"HTTP {response.status}"] += 1
                    except (aiohttp.ClientError, TimeoutError) as error:
                        errors[type(error).__name__] += 1
                else:
                    failed_for_good += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, succeeded, failed_for_good


def run_aiohttp(target: Target, bodies: Sequence[bytes], keys: Sequence[str], concurrency: int,
                timeout: float) -> PhaseResult:
    """``concurrency`` coroutines sharing one ClientSession whose connector allows ``concurrency``."""
    errors: collections.Counter[str] = collections.Counter()

    async def bounded() -> tuple[float, int, int]:
        try:
            phase = _aiohttp_phase(target.url, bodies, keys, concurrency, errors)
            return await asyncio.wait_for(phase, timeout)
        except TimeoutError:
            raise RuntimeError(f"bare aiohttp did not finish within {timeout:.0f} s") from None

    cpu_before = time.process_time()
    seconds, succeeded, failed_for_good = asyncio.run(bounded())
    result = PhaseResult("bare aiohttp", len(bodies), seconds, cpu_seconds=time.process_time() - cpu_before)
    result.notes.append(attempts_note(succeeded, errors, failed_for_good))
    result.stats = target.finish()
    return result


def attempts_note(succeeded: int, errors: collections.Counter[str], failed_for_good: int) -> str:
    failed = f"{sum(errors.values()):,} failed attempts"
    if errors:
        failed += f" {dict(errors.most_common(3))}"
    return f"{succeeded:,} 2xx, {failed}, {failed_for_good:,} given up"


def run_naive(target: Target, bodies: Sequence[bytes], keys: Sequence[str], concurrency: int,
              timeout: float) -> PhaseResult:
    """The naive Python way: one ``requests.Session`` shared by ``ThreadPoolExecutor(concurrency)``, each POST
    wrapped in ``tenacity`` retries (``MAX_ATTEMPTS`` attempts, exponential backoff from 0.1 s) on any
    connection error or non-2xx. The session's pool holds ``concurrency`` connections (the default 10
    would drop and reopen connections: that would measure connection set-up, not the client)."""
    url = target.url
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=concurrency))
    lock = threading.Lock()
    errors: collections.Counter[str] = collections.Counter()
    succeeded = failed_for_good = 0

    def count_failure(state: tenacity.RetryCallState) -> None:
        if state.outcome is not None and state.outcome.failed:
            with lock:
                errors[type(state.outcome.exception()).__name__] += 1

    @tenacity.retry(stop=tenacity.stop_after_attempt(MAX_ATTEMPTS),
                    wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
                    retry=tenacity.retry_if_exception_type(requests.RequestException),
                    before_sleep=count_failure, reraise=True)
    def post(index: int) -> None:
        response = session.post(url, data=bodies[index], headers={IDEMPOTENCY_HEADER: keys[index]}, timeout=10)
        response.raise_for_status()
        if not 200 <= response.status_code <= 299:  # a 1xx/3xx would not raise
            raise requests.HTTPError(f"HTTP {response.status_code}", response=response)

    def deliver(index: int) -> None:
        nonlocal succeeded, failed_for_good
        try:
            post(index)
        except requests.RequestException as error:
            with lock:
                errors[type(error).__name__] += 1
                failed_for_good += 1
            return
        with lock:
            succeeded += 1

    cpu_before = time.process_time()
    started = time.perf_counter()
    executor = concurrent.futures.ThreadPoolExecutor(concurrency)
    try:
        futures = [executor.submit(deliver, index) for index in range(len(bodies))]
        _, pending = concurrent.futures.wait(futures, timeout=timeout)
        if pending:
            raise RuntimeError(f"naive (requests) did not finish within {timeout:.0f} s")
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_before
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        session.close()
    result = PhaseResult("naive", len(bodies), seconds, cpu_seconds=cpu_seconds)
    result.notes.append(attempts_note(succeeded, errors, failed_for_good))
    result.stats = target.finish()
    return result


# -- the profile ----------------------------------------------------------------------------------

PROFILE_RATE = 200  # py-spy samples per second (``-r``)
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _group_of(path: str) -> str | None:
    """``engines/sqlite`` for ``.../src/egress/engines/sqlite.py``; None outside the egress package."""
    marker = "/egress/"
    at = path.rfind(marker)
    if at < 0 or "site-packages" in path[:at]:
        return None
    return path[at + len(marker):].removesuffix(".py").removesuffix("/__init__")


def _outside_group(path: str) -> str:
    if "site-packages/" in path:
        return "(lib) " + path.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/asyncio/" in path:
        return "(stdlib) asyncio"
    return "(stdlib) " + Path(path).stem if path.startswith("/") else f"(other) {path}"


_THREAD = re.compile(r"^thread \((?P<tid>\d+)\): (?P<name>.*)$")


@dataclass
class Profile:
    modules: list[tuple[str, int]]  # samples by module (innermost egress frame)
    functions: list[tuple[str, int]]  # samples by innermost egress function, top 15
    threads: list[tuple[str, int]]  # samples by Python thread name
    names: dict[int, str]  # native thread id -> Python thread name
    total: int


def profile_summary(raw: Path) -> Profile:
    """Samples of a ``py-spy record --threads -f raw`` file by module (the innermost egress frame of
    each stack, so a module's figure includes the libraries and C code it calls), by innermost egress
    function and by thread; and the total."""
    modules: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    names: dict[int, str] = {}
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        parts = stack.split(";")
        thread = _THREAD.match(parts[0]) if parts else None
        if thread is not None:
            parts = parts[1:]
            names[int(thread["tid"])] = thread["name"]
            threads[thread["name"]] += count
        frames = [m for m in (_FRAME.match(f) for f in parts) if m is not None]
        owner = None
        if not frames:
            owner = ("(no Python frame: native code holding the GIL)",) * 2
        elif any(frame["file"].startswith("<frozen importlib") for frame in frames):
            owner = ("(start-up: imports)",) * 2
        for frame in reversed(frames if owner is None else []):
            group = _group_of(frame["file"])
            if group is not None:
                owner = (group, f"{group}:{frame['function']}")
                break
        if owner is None:
            leaf = _outside_group(frames[-1]["file"]) if frames else "(unknown)"
            owner = (leaf, leaf)
        modules[owner[0]] += count
        functions[owner[1]] += count
    return Profile(modules.most_common(), functions.most_common(15), threads.most_common(), names, total)


def print_profile(raw: Path, result: PhaseResult, gil: bool) -> list[str]:
    found = profile_summary(raw)
    total = found.total
    per_message = 1e6 / PROFILE_RATE / max(result.messages, 1)  # µs per sample, per message
    what = "GIL time (--gil)" if gil else "on-CPU Python time, every thread (no --gil)"
    lines = [f"py-spy, {what}, {PROFILE_RATE} Hz, {total:,} samples over {result.messages:,} messages "
             f"({result.rate:,.0f} msg/s under the profiler): {total * per_message:.1f} µs per message",
             f"  without start-up (imports): "
             f"{(total - dict(found.modules).get('(start-up: imports)', 0)) * per_message:.1f} µs per message",
             "  by module (innermost egress frame; includes what it calls):"]
    lines += [f"    {name:<42} {count * per_message:7.1f} µs/msg  {100 * count / max(total, 1):5.1f} %"
              for name, count in found.modules[:20]]
    lines.append("  by innermost egress function (top 15):")
    lines += [f"    {name:<60} {count * per_message:7.1f} µs/msg" for name, count in found.functions]
    lines.append("  by thread (py-spy samples):")
    lines += [f"    {name:<42} {count * per_message:7.1f} µs/msg" for name, count in found.threads]
    if result.threads:
        lines.append("  CPU by thread (/proc/PID/task/*/stat, user + system, µs per message):")
        for label, seconds in result.threads.items():
            tid = label.rpartition(":")[2]
            name = found.names.get(int(tid), label) if tid.isdigit() else label
            lines.append(f"    {name:<42} {1e6 * seconds / max(result.messages, 1):7.1f} µs/msg  ({label})")
    return lines


# -- the report -----------------------------------------------------------------------------------


def describe(result: PhaseResult) -> str:
    stats = result.stats
    check = "OK" if result.complete else f"LOST {result.messages - result.delivered:,}"
    return (f"{result.name:<13} {result.rate:>8,.0f} msg/s  {result.seconds:7.2f} s  "
            f"client CPU {result.cpu_seconds:5.1f} s = {result.cpu_per_message_us:6.1f} µs/msg  "
            f"delivered {result.delivered:,}/{result.messages:,} distinct keys ({check}), "
            f"{stats.get('requests', 0):,} requests received")


def verdict(value: float, comparison: str, bound: float) -> str:
    ok = value >= bound if comparison == ">=" else value <= bound
    return "PASS" if ok else "MISS"


def ratio_lines(results: dict[str, PhaseResult], checked: bool) -> list[tuple[str, str]]:
    """(long line, short summary part) per ratio egress ÷ other client: msg/s, and CPU per message."""
    egress = results.get("egress")
    lines: list[tuple[str, str]] = []
    for label, name, measure, comparison, bound in TARGETS:
        other = results.get(name)
        if other is None:
            continue
        mine_result = results.get("egress sink") if measure == "sink cpu" else egress
        if mine_result is None:
            continue
        mine, theirs = ((mine_result.rate, other.rate) if measure == "rate"
                        else (mine_result.cpu_per_message_us, other.cpu_per_message_us))
        if theirs == 0:
            continue
        value = mine / theirs
        short = f"{MEASURE_NAMES[measure]}/{SHORT_NAMES.get(name, name)}"
        if bound is None:
            lines.append((f"  {label:<58} {value:6.2f}", f"{short} {value:.2f}"))
        elif checked:
            mark = verdict(value, comparison, bound)
            lines.append((f"  {label:<58} {value:6.2f}   target {comparison} {bound:g}   {mark}",
                          f"{short} {value:.2f} ({comparison} {bound:g} {mark})"))
        else:
            lines.append((f"  {label:<58} {value:6.2f}   (the targets apply to nginx)", f"{short} {value:.2f}"))
    traced = results.get("egress traced")
    if traced is not None and egress is not None and egress.cpu_per_message_us:
        value = traced.cpu_per_message_us / egress.cpu_per_message_us
        lines.append((f"  {'egress traced ÷ egress, CPU per message (tracing on)':<58} {value:6.2f}   "
                      f"target <= 1.05   {verdict(value, '<=', 1.05)}", f"cpu traced/egress {value:.2f}"))
    return lines


def cli_has_processes() -> bool:
    """Whether ``egress run`` of this tree takes ``--processes N``."""
    done = subprocess.run([sys.executable, "-m", "egress", "run", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    return "--processes" in done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per phase (default 100,000)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partition_count of the egress Spec (default 4, as the example spec)")
    parser.add_argument("--connections-per-partition", type=int, default=None, metavar="N",
                        help="set the sink's max_idle_connections (egress's pool and concurrency per partition); "
                             f"default: not set, the sink's default {DEFAULT_POOL}")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="requests in flight in the other clients (default: connections per partition × "
                             "partitions, what egress may use)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all, in that order; "
                             "durable is the raw pycurl loop behind a SQLite log)")
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="also run the egress phase with `egress run --processes N` (skipped with a message "
                             "when this tree's CLI has no such option)")
    parser.add_argument("--target", choices=("both", "nginx", "receiver"), default="both",
                        help="the endpoints: nginx then egress receiver (default), or one of them")
    parser.add_argument("--backlog", type=int, default=1_000_000, metavar="N",
                        help="messages of the backlog whose drain is measured for peak RSS (default 1,000,000; "
                             "0 skips it; a few minutes)")
    parser.add_argument("--function", choices=sorted(FUNCTIONS), default="map",
                        help="egress's process function: the benchmark's identity as a MapFunction (default) or "
                             "as a general ProcessFunction (process_message per message)")
    parser.add_argument("--profile", action="store_true",
                        help="also run the egress phase twice more under py-spy (--gil, then every thread) and "
                             "print µs/message by module, function and thread")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed per phase (default 900)")
    parser.add_argument("--instructions", default=None, metavar="N,M",
                        help="instead of the phases: one egress run of each count of messages under valgrind's "
                             "cachegrind (far slower), printing its instructions and the per-message slope "
                             "between the smallest and largest count (e.g. 20000,60000)")
    parser.add_argument("--callgrind", action="store_true",
                        help="with --instructions: valgrind's callgrind (--dump-instr=no) rather than cachegrind, "
                             "to attribute the instructions per function, callees included (with --keep DIR, "
                             "DIR/cachegrind-I.out; read it with callgrind_annotate --inclusive=yes)")
    parser.add_argument("--keep", type=Path, help="keep the Specs, states, reports and profile here")
    parser.add_argument("--tracing-ratio", type=float, default=None, metavar="R",
                        help="add the phase 'egress traced': OpenTelemetry tracing on, a ratio R of traces "
                             "sampled (0.01: 1 %%), spans to an OTLP/HTTP sink in this process")
    args = parser.parse_args(argv)
    global function_name
    function_name = FUNCTIONS[args.function]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown or not phases:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown)) or 'empty list'}")
    counts = [int(n) for n in args.instructions.split(",") if n.strip()] if args.instructions else []
    if args.instructions is not None and (not counts or min(counts) < 1):
        parser.error("--instructions: a comma-separated list of message counts >= 1")
    if counts:
        phases = []
    if args.callgrind and not counts:
        parser.error("--callgrind needs --instructions N,M")
    tool = "callgrind --dump-instr=no" if args.callgrind else "cachegrind --cache-sim=no"
    pool = args.connections_per_partition
    if min(args.messages, args.partitions, pool or 1, args.concurrency or 1) < 1 or args.backlog < 0:
        parser.error("--messages, --partitions, --connections-per-partition and --concurrency must be >= 1")
    if args.processes is not None and args.processes < 1:
        parser.error("--processes must be >= 1")
    processes = args.processes
    if processes is not None and "egress" in phases and not cli_has_processes():
        print(f"egress --processes {processes}: SKIPPED: `egress run` of this tree has no --processes option "
              "(the worker branch adds it); the other phases run as usual", flush=True)
        processes = None
    per_partition = pool or DEFAULT_POOL
    concurrency = args.concurrency or per_partition * args.partitions
    began = time.time()

    nginx = find_or_install_nginx() if args.target in ("both", "nginx") else None
    if args.target == "nginx" and nginx is None:
        print("delivery: nginx unavailable, nothing to measure (try --target receiver)")
        return 1

    bodies = build_bodies(args.messages)
    keys = egress_keys(args.messages)
    size = sum(map(len, bodies))
    print(f"{args.messages:,} flight payloads, {size / len(bodies):.0f} bytes on average; egress: default sink "
          f"parameters{'' if pool is None else f' but max_idle_connections {pool}'}, partition_count "
          f"{args.partitions} × {per_partition} connections = {per_partition * args.partitions} in flight; "
          f"the other clients: {concurrency}; load average {os.getloadavg()[0]:.2f}", flush=True)

    results: dict[str, dict[str, PhaseResult]] = {}
    backlog: PhaseResult | None = None
    profile_lines: list[str] = []
    totals: list[int] = []
    failed: str | None = None
    with tempfile.TemporaryDirectory(prefix="egress-bench-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        targets: list[Target] = []
        if nginx is not None:
            targets.append(NginxTarget(nginx, work))
        if args.target in ("both", "receiver"):
            targets.append(ReceiverTarget())
        try:
            for target in targets:
                here = results.setdefault(target.name, {})
                runs = [*phases]
                if processes is not None and "egress" in runs:
                    runs.insert(runs.index("egress") + 1, "egress processes")
                if args.tracing_ratio is not None and "egress" in runs:
                    runs.insert(runs.index("egress") + 1, "egress traced")
                for phase in runs:
                    target.start()
                    print(f"{phase}: POSTing to {target.url} ({target.name}) ...", flush=True)
                    if phase == "egress":
                        result = run_egress(target, bodies, args.messages, args.partitions, pool, work,
                                            args.timeout)
                    elif phase == "egress traced":
                        result = run_traced(target, bodies, args, pool, work, here)
                    elif phase == "egress processes":
                        result = run_egress(target, bodies, args.messages, args.partitions, pool, work,
                                            args.timeout, name=f"egress x{processes}", processes=processes)
                    elif phase == "sink":
                        result = run_sink(target, bodies, args.partitions, pool, args.timeout)
                    elif phase == "pycurl":
                        result = run_pycurl(target, bodies, keys, concurrency, args.timeout)
                    elif phase == "durable":
                        result = run_pycurl(target, bodies, keys, concurrency, args.timeout,
                                            durable=work / "durable-raw.sqlite")
                    elif phase == "aiohttp":
                        result = run_aiohttp(target, bodies, keys, concurrency, args.timeout)
                    else:
                        result = run_naive(target, bodies, keys, concurrency, args.timeout)
                    here[result.name] = result
                    print("  " + describe(result), flush=True)
                    for note in result.notes:
                        print(f"    {note}", flush=True)
            if args.backlog and targets:
                target = targets[0]
                target.start()
                print(f"backlog: egress draining {args.backlog:,} messages to {target.url} ({target.name}), "
                      f"VmRSS sampled every {RSS_PERIOD} s ...", flush=True)
                backlog = run_egress(target, bodies, args.backlog, args.partitions, pool, work, args.timeout,
                                     name="egress backlog")
                print("  " + describe(backlog), flush=True)
                for note in backlog.notes:
                    print(f"    {note}", flush=True)
            for index, count in enumerate(counts if targets else []):
                target = targets[0]
                target.start()
                out = work / f"cachegrind-{index}.out"
                print(f"instructions: egress of {count:,} messages under {tool}, POSTing to {target.url} "
                      f"({target.name}), load average {os.getloadavg()[0]:.2f} ...", flush=True)
                counted = run_egress(target, bodies, count, args.partitions, pool, work, args.timeout,
                                     name=f"egress instructions {index}", instructions=out,
                                     callgrind=args.callgrind)
                print("  " + describe(counted), flush=True)
                for note in counted.notes:
                    print(f"    {note}", flush=True)
                if not counted.complete or not out.exists():
                    raise RuntimeError(f"the cachegrind run of {count:,} messages did not deliver them all")
                totals.append(cachegrind_total(out))
            if args.profile and targets:
                target = targets[0]
                for gil in (True, False):
                    target.start()
                    mode = "gil" if gil else "cpu"
                    raw = work / f"egress-profile-{mode}.txt"
                    print(f"profile: egress under py-spy ({'--gil' if gil else 'every thread'}), POSTing to "
                          f"{target.url} ({target.name}) ...", flush=True)
                    profiled = run_egress(target, bodies, args.messages, args.partitions, pool, work, args.timeout,
                                          name=f"egress profiled {mode}", profile=raw, gil=gil)
                    print("  " + describe(profiled), flush=True)
                    profile_lines += print_profile(raw, profiled, gil) if raw.exists() else ["py-spy wrote no profile"]
                    if args.keep is None and raw.exists():
                        kept = Path(tempfile.gettempdir()) / f"egress-delivery-profile-{mode}.txt"
                        shutil.copy(raw, kept)
                        profile_lines.append(f"  raw profile kept: {kept}")
        except RuntimeError as error:  # a phase that could not finish: no figure to compare
            failed = str(error)
        finally:
            for target in targets:
                target.stop()

    print()
    print(f"delivery benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, "
          f"{time.time() - began:,.0f} s, load average now {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    summary: list[str] = [] if nginx is not None or args.target == "receiver" else ["nginx: SKIPPED (unavailable)"]
    for target_name, here in results.items():
        print(f"against {target_name}:")
        for result in here.values():
            print("  " + describe(result))
        ratios = ratio_lines(here, checked=target_name == "nginx")
        for line, _ in ratios:
            print(line)
        if "egress" in here:
            egress = here["egress"]
            parts = [f"{target_name}: egress {egress.rate:,.0f} msg/s, {egress.cpu_per_message_us:.0f} µs CPU/msg"]
            several = here.get(f"egress x{processes}")
            if several is not None and egress.rate > 0:
                line = (f"egress --processes {processes}: {several.rate:,.0f} msg/s "
                        f"({several.rate / egress.rate:.2f} × one process), "
                        f"{several.cpu_per_message_us:.0f} µs CPU/msg")
                print(f"  {line}")
                parts.append(line)
            summary.append(" | ".join([*parts, *(short for _, short in ratios)]))
        elif ratios:
            summary.append(" | ".join([f"{target_name}:", *(short for _, short in ratios)]))
    if backlog is not None:
        peak = max(backlog.peak_rss_mb, backlog.max_rss_mb)
        mark = verdict(peak, "<=", RSS_TARGET_MB)
        print(f"peak RSS of egress draining a {backlog.messages:,}-message backlog: {peak:,.0f} MB "
              f"(largest VmRSS sample {backlog.peak_rss_mb:,.0f} MB, VmHWM {backlog.max_rss_mb:,.0f} MB; "
              f"{backlog.rate:,.0f} msg/s, {backlog.seconds:,.0f} s)   target <= {RSS_TARGET_MB:g} MB   {mark}")
        summary.append(f"backlog {backlog.messages:,} to {targets[0].name}: peak RSS {peak:,.0f} MB "
                       f"(<= {RSS_TARGET_MB:g} {mark})")
    for line in profile_lines:
        print(line)
    if totals:
        print(f"instructions ({tool}, the whole egress process):")
        for line in instruction_lines(counts, totals):
            print(line)
    everything = [r for here in results.values() for r in here.values()] + ([backlog] if backlog else [])
    lost = [r.name for r in everything if not r.complete]
    if failed is not None:
        print(f"FAILED: {failed}")
    if lost:
        print(f"FAILED: messages lost in {', '.join(lost)}")
    print(f"delivery ({args.partitions} partitions × {per_partition} = {per_partition * args.partitions} in flight, "
          f"{args.messages:,} msgs): " + " || ".join(summary))
    return 1 if lost or failed is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
