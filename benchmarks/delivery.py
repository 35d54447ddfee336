"""Delivery throughput: egress against a raw pycurl loop and bare aiohttp, same bodies, same endpoint.

What is measured, in one run, on loopback only:

1. 100,000 flight payloads are built from the first rows of ``data/flights-2013.csv.gz``: the
   orjson of each typed row, as ``examples/http_delivery/functions.py`` makes them (~300 bytes;
   cancelled flights are kept, so every row gives one body).
2. ``egress``: a temporary Spec reads those payloads from a JSONL file (one ``payload`` string and
   an ``id`` used as the key, so the rows spread over the partitions), passes them through the
   identity process function :class:`PassPayload` below and POSTs them with the async HTTP sink.
   ``python -m egress run SPEC --until-drained --quiet --report R`` runs in a subprocess with a fresh
   state directory and full durability (SQLite ``synchronous=FULL``, the default). The figure is
   messages delivered / wall time of the whole process (start-up, reading the source into the
   log, every commit and every POST); the report's in-run ``messages_per_second`` is shown too.
3. ``raw pycurl``: a plain ``CurlMulti`` perform/select loop in this process POSTs the same bodies
   with the same headers (the egress ``Idempotency-Key`` of each message, ``Content-Type:
   application/json``) over as many concurrent connections as egress may use. egress runs one
   libcurl client per partition whose pool size is also its concurrency (the sink's
   ``max_idle_connections``, see ``docs/http-sink.md``); the Spec sets it to 64
   (``--connections-per-partition``), so with ``partition_count`` 4 (``--partitions``) that is 256.
4. ``bare aiohttp``: an ``aiohttp.ClientSession`` with ``TCPConnector(limit=concurrency)`` and as
   many worker coroutines POSTing the same bodies.

The endpoint is ``egress receiver`` (aiohttp, one process), restarted before each phase so that its
``GET /stats`` counts belong to that phase alone. Every phase must deliver every message: the
receiver's ``distinct_keys`` is checked, and the script exits 1 if any phase lost one. The last line
is one comparable summary::

    delivery: egress 4,100 msg/s | raw pycurl 5,000 msg/s | bare aiohttp 3,000 msg/s | ...

Run it from the repository root (figures and interpretation: ``docs/benchmarks.md``)::

    python benchmarks/delivery.py                  # 100,000 messages, 4 partitions × 64 connections
    python benchmarks/delivery.py --messages 20000 --partitions 1

``--target nginx`` POSTs to a local nginx instead (``return 200``; keys counted from its access
log). It is optional and skipped when no ``nginx`` binary is on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import gzip
import json
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pycurl
import yaml

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.keys import derived_message_id, idempotency_key, source_message_id

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT / "data" / "flights-2013.csv.gz"
SOURCE_ID = "payloads"
PROCESSING_FUNCTION = f"{Path(__file__).stem}:PassPayload"  # imported by egress with cwd = HERE
CONTENT_TYPE = "application/json"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_ATTEMPTS = 3  # the raw loops retry a failed POST this many times in all (egress: its retry policy)

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


class PassPayload(ProcessFunction):
    """The identity process function of the egress phase: each row's payload goes to the sink as is."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        output.add_message("requests", {"payload": message.row["payload"]})


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
            bodies.append(orjson.dumps(row))
    if len(bodies) < count:
        raise SystemExit(f"{DATA} has only {len(bodies):,} rows, {count:,} asked")
    return bodies


def egress_keys(count: int) -> list[str]:
    """The Idempotency-Key egress sends for message ``i``: the id of the one output of source row ``i``."""
    return [idempotency_key(derived_message_id(source_message_id(SOURCE_ID, 0, i), 0)) for i in range(count)]


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


class NginxTarget(Target):
    """A local nginx (one worker) answering 200 to every POST; keys with a 2xx are counted from its
    access log. Optional: it shows the clients against a server that is far from being the bottleneck.
    """

    name = "nginx"

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
  log_format keys '$http_idempotency_key $status $request_length';
  access_log {self._log} keys buffer=256k;
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
        requests, keys = 0, set()
        with open(self._log, encoding="utf-8") as log:
            for line in log:
                key, status, _ = line.split(" ", 2)
                requests += 1
                if status.startswith("2") and key != "-":
                    keys.add(key)
        return {"requests": requests, "distinct_keys": len(keys), "bytes": 0}

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

    @property
    def delivered(self) -> int:
        return self.stats.get("distinct_keys", 0)

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.delivered == self.messages


def run_egress(target: Target, bodies: Sequence[bytes], partitions: int, pool: int, work: Path,
               timeout: float) -> PhaseResult:
    """One ``egress run`` subprocess from a fresh state directory; timed from spawn to exit."""
    phase = work / "egress"
    phase.mkdir(exist_ok=True)
    shutil.rmtree(phase / "state", ignore_errors=True)  # a fresh state directory: no resumed run
    source = phase / "payloads.jsonl"
    with open(source, "wb") as out:
        for i, body in enumerate(bodies):
            out.write(orjson.dumps({"id": i, "payload": body.decode()}) + b"\n")
    spec = {
        "pipeline": "delivery_benchmark",
        "partition_count": partitions,
        "streams": {
            "rows": {"schema": [{"name": "id", "type": "int64", "required": True},
                                {"name": "payload", "type": "string", "required": True}],
                     "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string", "required": False}]},
        },
        "sources": {SOURCE_ID: {"source_class_name": "jsonl", "output_stream_id": "rows",
                                "parameters": {"path": str(source)}}},
        "computations": {"deliver": {
            "computation_class_name": "NYT::NFlow::TProcessFunctionComputation",
            "processing_function": PROCESSING_FUNCTION,
            "input_stream_ids": ["rows"],
            "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "NYT::NFlow::TAsyncHttpSink",
                               "input_stream_ids": ["requests"],
                               "parameters": {"url": target.url, "payload_column": "payload",
                                              "headers": {"Content-Type": CONTENT_TYPE},
                                              "idempotency_header": IDEMPOTENCY_HEADER,
                                              "max_idle_connections": pool}}},
        }},
    }
    spec_path = phase / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    report_path = phase / "report.json"
    command = [sys.executable, "-m", "egress", "run", str(spec_path), "--state-dir", str(phase / "state"),
               "--until-drained", "--quiet", "--report", str(report_path)]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stats = target.finish()
        process.kill()
        process.communicate()
        raise RuntimeError(f"egress run did not finish within {timeout:.0f} s; the endpoint had received "
                           f"{stats['distinct_keys']:,} of {len(bodies):,} keys (--keep DIR keeps its state)"
                           ) from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    seconds = time.perf_counter() - started
    result = PhaseResult("egress", len(bodies), seconds, cpu_seconds=_children_cpu() - cpu_before)
    if process.returncode != 0:
        result.notes.append(f"egress exited {process.returncode}: {(stderr or stdout).strip()[-2000:]}")
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    in_run = float(report.get("messages_per_second", 0.0))
    result.notes.append(
        f"in-run {in_run:,.0f} msg/s over {report.get('elapsed_seconds', 0.0):.2f} s (report), "
        f"{report.get('posts', 0):,} POSTs, {report.get('retries', 0):,} retries, "
        f"{report.get('epochs', 0):,} epochs committed")
    result.stats = target.finish()
    result.stats["in_run_rate"] = round(in_run)
    return result


def run_pycurl(target: Target, bodies: Sequence[bytes], keys: Sequence[str], concurrency: int,
               timeout: float) -> PhaseResult:
    """A plain CurlMulti perform/select loop keeping ``concurrency`` POSTs in flight."""
    url = target.url.encode()
    multi = pycurl.CurlMulti()
    multi.setopt(pycurl.M_MAXCONNECTS, concurrency)
    spare = [pycurl.Curl() for _ in range(concurrency)]
    for handle in spare:
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.POST, 1)
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.TIMEOUT_MS, 10_000)
        handle.setopt(pycurl.WRITEFUNCTION, lambda data: None)
    handles = list(spare)
    todo: collections.deque[tuple[int, int]] = collections.deque((i, 1) for i in range(len(bodies)))
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
        while todo or running:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw pycurl did not finish within {timeout:.0f} s")
            while todo and spare:
                index, attempt = todo.popleft()
                handle = spare.pop()
                body = bodies[index]
                handle.setopt(pycurl.POSTFIELDSIZE, len(body))
                handle.setopt(pycurl.POSTFIELDS, body)
                handle.setopt(pycurl.HTTPHEADER, [f"Content-Type: {CONTENT_TYPE}",
                                                  f"{IDEMPOTENCY_HEADER}: {keys[index]}", "Expect:"])
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
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_before
    finally:
        for handle in handles:
            if id(handle) in running:
                multi.remove_handle(handle)
            handle.close()
        multi.close()
    result = PhaseResult("raw pycurl", len(bodies), seconds, cpu_seconds=cpu_seconds)
    result.notes.append(attempts_note(succeeded, errors, failed_for_good))
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
                headers = {"Content-Type": CONTENT_TYPE, IDEMPOTENCY_HEADER: keys[index]}
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


# -- the report -----------------------------------------------------------------------------------


def describe(result: PhaseResult) -> str:
    stats = result.stats
    check = "OK" if result.complete else f"LOST {result.messages - result.delivered:,}"
    return (f"{result.name:<13} {result.rate:>8,.0f} msg/s  {result.seconds:7.2f} s  "
            f"client CPU {result.cpu_seconds:5.1f} s  "
            f"delivered {result.delivered:,}/{result.messages:,} distinct keys ({check}), "
            f"{stats.get('requests', 0):,} requests received")


def ratio(a: PhaseResult | None, b: PhaseResult | None) -> str:
    if a is None or b is None or b.rate == 0:
        return "-"
    return f"{a.rate / b.rate:.2f}"


def summary(results: dict[str, PhaseResult]) -> str:
    parts = [f"{name} {results[name].rate:,.0f} msg/s" for name in ("egress", "raw pycurl", "bare aiohttp")
             if name in results]
    egress = results.get("egress")
    if egress is not None:
        for name, short in (("raw pycurl", "pycurl"), ("bare aiohttp", "aiohttp")):
            if name in results:
                parts.append(f"egress/{short} {ratio(egress, results[name])}")
    return "delivery: " + " | ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per phase (default 100,000)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partition_count of the egress Spec (default 4)")
    parser.add_argument("--connections-per-partition", type=int, default=64, metavar="N",
                        help="the sink's max_idle_connections: egress's pool and concurrency per partition "
                             "(default 64)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="connections of the raw phases (default: connections per partition × "
                             "partitions, what egress may use)")
    parser.add_argument("--phases", default="egress,pycurl,aiohttp",
                        help="comma-separated subset of egress,pycurl,aiohttp (default: all, in that order)")
    parser.add_argument("--target", choices=("receiver", "nginx"), default="receiver",
                        help="the endpoint (default: egress receiver; nginx is optional, skipped if absent)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds allowed per phase (default 600)")
    parser.add_argument("--keep", type=Path, help="keep the Spec, state and report of the egress phase here")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"egress", "pycurl", "aiohttp"}
    if unknown or not phases:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown)) or 'empty list'}")
    if min(args.messages, args.partitions, args.connections_per_partition, args.concurrency or 1) < 1:
        parser.error("--messages, --partitions, --connections-per-partition and --concurrency must be >= 1")
    pool = args.connections_per_partition
    concurrency = args.concurrency or pool * args.partitions
    nginx = shutil.which("nginx") if args.target == "nginx" else None
    if args.target == "nginx" and nginx is None:
        print("delivery: --target nginx skipped: no nginx on the PATH")
        return 0

    bodies = build_bodies(args.messages)
    keys = egress_keys(args.messages)
    size = sum(map(len, bodies))
    print(f"{args.messages:,} flight payloads, {size / len(bodies):.0f} bytes on average; "
          f"egress partition_count {args.partitions} × {pool} connections = {pool * args.partitions}, "
          f"raw phases {concurrency} connections", flush=True)

    with tempfile.TemporaryDirectory(prefix="egress-bench-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        target: Target = NginxTarget(nginx, work) if nginx is not None else ReceiverTarget()
        results: dict[str, PhaseResult] = {}
        try:
            for phase in phases:
                target.start()
                print(f"{phase}: POSTing to {target.url} ({target.name}) ...", flush=True)
                if phase == "egress":
                    result = run_egress(target, bodies, args.partitions, pool, work, args.timeout)
                elif phase == "pycurl":
                    result = run_pycurl(target, bodies, keys, concurrency, args.timeout)
                else:
                    result = run_aiohttp(target, bodies, keys, concurrency, args.timeout)
                results[result.name] = result
                print("  " + describe(result), flush=True)
                for note in result.notes:
                    print(f"    {note}", flush=True)
        except RuntimeError as error:  # a phase that could not finish: no figure to compare
            print(f"FAILED: {error}", flush=True)
            return 1
        finally:
            target.stop()

    print()
    for result in results.values():
        print(describe(result))
    egress = results.get("egress")
    if egress is not None:
        for name in ("raw pycurl", "bare aiohttp"):
            if name in results:
                other = results[name].rate
                in_run = egress.stats.get("in_run_rate", 0) / other if other else 0.0
                print(f"egress/{name}: {ratio(egress, results[name])} (wall time), "
                      f"{in_run:.2f} (in-run figure)")
    lost = [r.name for r in results.values() if not r.complete]
    if lost:
        print(f"FAILED: messages lost in {', '.join(lost)}")
    print(summary(results))
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
