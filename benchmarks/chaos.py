"""Chaos harness (issue 15): pipelines run under randomly injected faults, then an audit.

Two pipelines run side by side as real ``egress run --until-drained`` processes on their own state
directories:

* ``flights``: the demo's flights pipeline (``examples/http_delivery``, its first ``--rows`` rows)
  delivering to the receiver of ``egress receiver --record`` (``egress.receiver.app``, started
  without the CLI's imports so that a restart is quick) through a fault-injecting HTTP proxy on loopback
  (:class:`FaultProxy`, in this process). With ``--cluster`` it runs as ``--workers`` worker
  processes on a nats-server (``--engine nats://…``) instead of the embedded SQLite engine.
* ``retryable``: the retryable async request example (``examples/retryable_async_request``, the
  simulated variant, retry delay 1 s) on ``--events`` random events: its external ``total_length``
  per key must come out exactly as computed here (internal state exactly once).

Faults are drawn from ``random.Random(seed)`` (the seed is printed; ``--seed`` replays a run's
schedule: kinds, moments and durations, though not the processes' own timing), one every 0.2 to
1.2 s, each of a kind that applies at that moment, and only on a process that has shown progress
since its start (a request at the proxy, a commit in its state). Faults overlap: a stop, a receiver
outage or a burst goes on while the next ones land, and every outage (a 5xx or 429 burst, the
receiver down) is followed by a SIGKILL of the flights process at a random moment from inside it to
1.5 s after it, while its failed attempts wait to be retried:

=================  ===========================================================================
``egress_kill``    SIGKILL of an egress process (flights or retryable), then restart at once
``egress_stop``    SIGSTOP of an egress process for 0.2 to 1.5 s, then SIGCONT
``receiver_kill``  SIGKILL of the receiver, down for 0.2 to 1.5 s, restarted on its record file
``http_5xx``       30 to 100 % of the requests answered 500, 502 or 503 by the proxy for 0.3 to 2 s
``http_429``       30 to 100 % answered 429 (half of them with ``Retry-After: 1``) for 0.3 to 2 s
``slow``           every response held 50 to 500 ms for 1 to 3 s
``stall``          the next 1 to 8 responses held past the sink's attempt timeout (after the
                   receiver recorded them: the sink gives up and sends again)
``reset``          the next 1 to 20 connections reset: half while the request is read (the receiver
                   never sees it), half after the response head and 1 byte of body
``worker_kill``    (``--cluster``) SIGKILL of a flights worker, then restart with its worker id
``nats_restart``   (``--cluster``) SIGKILL of the nats-server, down 0.2 to 1 s, restarted on its store
=================  ===========================================================================

When a pipeline drains before the faults are used up, a new round starts (fresh state directories
and record); the last round ends when its processes exit 0 after the last fault. Each round is then
audited:

* every non-null flight delivered (a 2xx recorded under its idempotency key, the keys computed
  here from the CSV and the message id layout), nothing else, one body per key;
* every duplicate attributed: a delivery whose 2xx never reached the sink whole (the proxy reset,
  stalled or lost it: ``network``), an attempt slower than the attempt timeout (``timeout``), a
  SIGKILL while the key was committed and unacknowledged in the outbox (``kill``, read from the
  dead process's state), a SIGSTOP in between (``stop``); in cluster mode a change of hands of the
  key's ``to_json`` partition in between (``handover``: the leases polled by the cluster tests'
  ``LeaseWatch``) or a nats-server restart (``nats``); any other duplicate is ``unexplained`` and
  fails the audit;
* the retryable example's totals exact and no request left in retry state;
* ``PRAGMA integrity_check`` ``ok`` on every SQLite file of the killed process's state directory
  after every kill (before the restart), and of every state directory at the end.

The last line is the summary; exit 1 when the audit fails (the work directory is kept then).

    python benchmarks/chaos.py --faults 100            # make chaos
    python benchmarks/chaos.py --faults 10 --rows 8000 --seed 7
    python benchmarks/chaos.py --faults 30 --cluster
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import ctypes
import gzip
import hashlib
import itertools
import logging
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.test_exactly_once import totals  # noqa: E402
from tests.e2e.test_exactly_once import write_pipeline as write_retryable  # noqa: E402
from tests.e2e.test_kill_restart import read_in_flight  # noqa: E402

from egress.cli.state import state_lines  # noqa: E402
from egress.keys import encode_key, partition_of  # noqa: E402

FLIGHTS = ROOT / "examples" / "http_delivery"
FLIGHTS_DATA = FLIGHTS / "data" / "flights-2013-01.csv.gz"
RETRYABLE = ROOT / "examples" / "retryable_async_request"
FLIGHTS_SOURCE, FLIGHTS_COMPUTATION, FLIGHTS_SINK = "flights_csv", "to_json", "http"
RUN_HEADER = "X-Chaos-Run"
ATTEMPT_HEADER = "X-Chaos-Attempt"
ATTEMPT_TIMEOUT = 3.0  # the sink's attempt_timeout here: a stall outlasts it
STALL = ATTEMPT_TIMEOUT + 1.0
TIMEOUT_SHARE = 0.8  # an attempt this share of the attempt timeout long may have been given up on
FAULT_GAP = (0.2, 1.2)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:  # looked up here, not in the forked child (which shares the harness's threads' locks)
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _prctl = None
LEASE_TTL = 2.0  # seconds, --lease-ttl of the cluster workers
IN_FLIGHT_SLACK = 0.5  # seconds: a request sent before a change may be recorded just after it
DRAIN_TIMEOUT = 240.0
FIRST_REQUEST_TIMEOUT = 90.0
NETWORK_KINDS = ("receiver_kill", "http_5xx", "http_429", "slow", "stall", "reset")
PROCESS_KINDS = ("egress_kill", "egress_stop")
CLUSTER_KINDS = ("worker_kill", "nats_restart")
DYNAMIC_SPEC = {"computations": {FLIGHTS_COMPUTATION: {"sinks": {FLIGHTS_SINK: {"parameters": {
    "request_timeout": "10m", "attempt_timeout": f"{ATTEMPT_TIMEOUT:g}s", "retry_initial_delay": "50ms",
    "retry_minimum_delay": "50ms", "retry_maximum_delay": "1s", "max_attempt_count": 100,
    "retry_after_maximum_delay": "1s"}}}}}}
"""Retries that outlast every fault here: 100 attempts at most 1 s apart, 10 minutes per message."""


# -- the fault-injecting proxy ------------------------------------------------------------------


@dataclass
class Attempt:
    """One request the proxy handled: its outcome and how long it took (seconds)."""

    outcome: str  # passed | injected | reset_request | reset_response | stalled | upstream_lost
    seconds: float = 0.0


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of the receiver, in a thread of its own, that injects the
    network faults the harness asks for. Every forwarded request gets an ``X-Chaos-Attempt`` header
    (recorded by the receiver) whose :class:`Attempt` says what the sink got back."""

    def __init__(self, seed: int) -> None:
        self.upstream_port = 0
        self.attempts: dict[int, Attempt] = {}
        self.runs_seen: set[str] = set()  # X-Chaos-Run values: the runs that have sent something
        self.last_request = 0.0  # monotonic time of the latest request
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._statuses: tuple[int, ...] = ()
        self._statuses_until = 0.0
        self._share = 1.0
        self._slow_until = 0.0
        self._stalls = 0
        self._resets = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start within 30 s")

    # faults, set from the harness thread
    def answer(self, statuses: tuple[int, ...], seconds: float, share: float) -> None:
        """For ``seconds``, answer ``share`` of the requests (at random) with one of ``statuses``."""
        with self._lock:
            self._statuses, self._statuses_until = statuses, time.monotonic() + seconds
            self._share = share

    def slow_down(self, seconds: float) -> None:
        with self._lock:
            self._slow_until = time.monotonic() + seconds

    def stall(self, count: int) -> None:
        with self._lock:
            self._stalls += count

    def reset(self, count: int) -> None:
        with self._lock:
            self._resets += count

    def clear(self) -> None:
        with self._lock:
            self._statuses_until = self._slow_until = 0.0
            self._stalls = self._resets = 0

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    # the proxy itself
    def _take(self) -> tuple[str, float, int]:
        """The fault for the next request: (kind, delay seconds, status)."""
        with self._lock:
            now = time.monotonic()
            delay = self._random.uniform(0.05, 0.5) if now < self._slow_until else 0.0
            if now < self._statuses_until and self._random.random() < self._share:
                return "status", delay, self._random.choice(self._statuses)
            if self._resets:
                self._resets -= 1
                return self._random.choice(("reset_request", "reset_response")), delay, 0
            if self._stalls:
                self._stalls -= 1
                return "stall", delay, 0
            return "", delay, 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with ClientSession(connector=TCPConnector(limit=256), timeout=ClientTimeout(total=30),
                                 auto_decompress=False) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", lambda request: self._handle(session, request))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    async def _handle(self, session: ClientSession, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        number = next(self._numbers)
        self.runs_seen.add(request.headers.get(RUN_HEADER, ""))
        self.last_request = started
        kind, delay, status = self._take()
        attempt = self.attempts[number] = Attempt("passed")
        try:
            return await self._respond(session, request, number, attempt, kind, delay, status)
        finally:
            attempt.seconds = time.monotonic() - started

    async def _respond(self, session: ClientSession, request: web.Request, number: int, attempt: Attempt,
                       kind: str, delay: float, status: int) -> web.StreamResponse:
        if kind == "reset_request":
            attempt.outcome = "reset_request"
            await request.content.read(1)
            return self._abort(request)
        body = await request.read()
        if kind == "status":
            attempt.outcome = "injected"
            await asyncio.sleep(delay)
            retry_after = {"Retry-After": "1"} if status == 429 and self._random.random() < 0.5 else {}
            return web.Response(status=status, text="injected by the chaos proxy\n", headers=retry_after)
        headers = {name: value for name, value in request.headers.items()
                   if name.lower() not in ("host", "content-length", "connection", "transfer-encoding")}
        headers[ATTEMPT_HEADER] = str(number)
        try:
            async with session.request(request.method, f"http://127.0.0.1:{self.upstream_port}{request.path_qs}",
                                       data=body, headers=headers) as upstream:
                status, payload = upstream.status, await upstream.read()
        except (ClientError, TimeoutError, OSError):
            attempt.outcome = "upstream_lost"
            return web.Response(status=502, text="the receiver is down\n")
        await asyncio.sleep(delay)
        if kind == "stall":
            attempt.outcome = "stalled"
            await asyncio.sleep(STALL)
        if kind == "reset_response":
            attempt.outcome = "reset_response"
            response = web.StreamResponse(status=status)
            response.content_length = len(payload) + 64
            await response.prepare(request)
            await response.write(b"o")
            return self._abort(request, response)
        return web.Response(status=status, body=payload)

    @staticmethod
    def _abort(request: web.Request, response: web.StreamResponse | None = None) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        return response if response is not None else web.Response(status=499)


# -- processes -----------------------------------------------------------------------------------


def die_with_the_harness() -> None:
    """In a child before it runs (``preexec_fn``): SIGKILL it when the harness dies, even by SIGKILL
    (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing), so that no receiver or egress run outlives it."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGCONT (it may be stopped) and SIGKILL ``process`` if it still runs, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait()


RECEIVER = """
import asyncio, socket, sys
from pathlib import Path
from egress.receiver.app import ReceiverConfig, serve
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
async def main():
    ready = asyncio.Event()
    server = asyncio.create_task(serve(ReceiverConfig(record=Path(sys.argv[1])), "127.0.0.1", port, ready))
    await asyncio.wait({server, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if server.done():
        await server
    print(f"egress receiver listening on http://127.0.0.1:{port}/", flush=True)
    await server
asyncio.run(main())
"""


@dataclass
class ReceiverProcess:
    """``egress receiver --record RECORD`` (its app, :func:`egress.receiver.app.serve`, without the
    CLI's imports: a restart takes a fraction of the time) on a free port, restartable on the same
    record (appended, line by line: a record survives a SIGKILL)."""

    record: Path
    process: subprocess.Popen[str] | None = None
    port: int = 0

    def start(self) -> int:
        self.process = subprocess.Popen([sys.executable, "-c", RECEIVER, str(self.record)], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        preexec_fn=die_with_the_harness)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if not found:
            stop_process(self.process)
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.port = int(found.group(1))
        return self.port

    def kill(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


@dataclass
class EgressRun:
    """One pipeline's ``egress run --until-drained`` process (or cluster worker), restartable;
    ``command(run)`` gives the command line of its ``run``-th start. ``events`` logs the wall
    times of its kills and stops."""

    name: str
    state: Path
    log: Path
    command: Callable[[int], list[str]]
    process: subprocess.Popen[bytes] | None = None
    runs: int = 0
    done: bool = False
    finished: float = 0.0  # monotonic time of its exit 0
    kills: list[Kill] = field(default_factory=list)
    stops: list[tuple[float, float]] = field(default_factory=list)
    progressed: Callable[[EgressRun], bool] = lambda run: True
    stopped: bool = False  # SIGSTOPped, its SIGCONT still to come
    started: float = 0.0  # monotonic time of the current run's start
    started_signature: object = None

    def start(self) -> None:
        self.started_signature = state_signature(self.state)
        self.started = time.monotonic()
        self.stopped = False
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(self.command(self.runs), cwd=ROOT, stdout=output,
                                            stderr=subprocess.STDOUT, preexec_fn=die_with_the_harness)
        self.runs += 1

    @property
    def label(self) -> str:
        """The current run's name in the ``X-Chaos-Run`` header: ``NAME/RUN``."""
        return f"{self.name}/{self.runs - 1}"

    def running(self) -> bool:
        return not self.done and self.process is not None and self.process.poll() is None

    def working(self) -> bool:
        """Running, and this run has shown progress (``progressed``): a fault then lands mid-work,
        not while it starts up."""
        return self.running() and self.progressed(self)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def state_signature(state: Path) -> tuple[tuple[int, int], ...]:
    """Sizes and modification times of a state directory's SQLite files: a change is a commit."""
    found = []
    for name in ("egress.sqlite3", "egress.sqlite3-wal"):
        try:
            status = (state / name).stat()
        except FileNotFoundError:
            continue
        found.append((status.st_size, status.st_mtime_ns))
    return tuple(found)


@dataclass
class Kill:
    """A SIGKILL: when (wall time, reaped), which run, and the flights keys then in flight."""

    time: float
    run: int
    in_flight: set[str] | None  # None: not read (a retryable run, or a cluster worker)


# -- the pipelines and their expectations --------------------------------------------------------


def write_flights(directory: Path, rows: int | None) -> tuple[Path, dict[str, int]]:
    """The flights CSV (its first ``rows`` rows, or all) and the idempotency keys its non-null
    messages must arrive under: ``blake2b(pipeline 0x1F source id 0x1F path)[:8] || partition u32
    || position u64 || output index u16``, hex (the message id layout of docs/architecture.md), each
    with the ``to_json`` partition that sends it (``origin``, the stream's ``group_by``, hashed)."""
    path = directory / "flights.csv"
    spec = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())
    prefix = hashlib.blake2b("\x1f".join((spec["pipeline"], FLIGHTS_SOURCE, str(path))).encode(),
                             digest_size=8).digest()
    keys: dict[str, int] = {}
    with gzip.open(FLIGHTS_DATA, "rt", newline="") as text, path.open("w", newline="") as out:
        reader = csv.DictReader(text)
        writer = csv.DictWriter(out, fieldnames=list(reader.fieldnames or ()))
        writer.writeheader()
        for position, row in enumerate(itertools.islice(reader, rows)):
            writer.writerow(row)
            if row["dep_time"] not in ("", "NA"):  # FlightToJson's null payload: nothing is sent
                message_id = prefix + (0).to_bytes(4, "big") + position.to_bytes(8, "big") + (0).to_bytes(2, "big")
                keys[message_id.hex().upper()] = partition_of(encode_key([row["origin"]]), spec["partition_count"])
    return path, keys


def flights_spec(directory: Path, data: Path, port: int, label: str) -> Path:
    spec = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())
    spec["sources"][FLIGHTS_SOURCE]["parameters"]["path"] = str(data)
    sink = spec["computations"][FLIGHTS_COMPUTATION]["sinks"][FLIGHTS_SINK]["parameters"]
    sink["url"] = f"http://127.0.0.1:{port}/events"
    sink["headers"][RUN_HEADER] = label  # a static header: changes no message id and no body
    path = directory / f"{label.replace('/', '-run')}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def egress_command(spec: Path, state: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(state), "--quiet",
            "--until-drained", *extra]


def integrity_problems(state: Path) -> list[str]:
    """``PRAGMA integrity_check`` of every SQLite file under ``state``: the files not ``ok``."""
    problems = []
    for path in sorted(state.rglob("*.sqlite3")):
        try:
            database = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
            try:
                result = [row[0] for row in database.execute("PRAGMA integrity_check")]
            finally:
                database.close()
        except sqlite3.Error as error:
            result = [str(error)]
        if result != ["ok"]:
            problems.append(f"{path}: {'; '.join(result)[:300]}")
    return problems


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Options:
    seed: int
    faults: int
    rows: int | None
    events: int
    cluster: bool
    workers: int
    directory: Path


@dataclass
class Audit:
    """What the rounds found, summed."""

    faults: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    integrity_checks: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self, seed: int, seconds: float) -> str:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
        duplicates = ", ".join(f"{kind} {count}" for kind, count in sorted(self.duplicates.items()))
        result = "PASS" if not self.failures else f"FAIL ({'; '.join(self.failures)[:600]})"
        return (f"chaos seed {seed}: {sum(self.faults.values())} faults ({faults}) in {self.rounds} rounds, "
                f"{seconds:.0f} s; delivered {self.delivered} of {self.expected}, lost {self.lost}, "
                f"unexpected {self.unexpected}, duplicates {sum(self.duplicates.values())} ({duplicates or 'none'}); "
                f"retryable state {'exact' if not any('retryable' in f for f in self.failures) else 'WRONG'}; "
                f"integrity {self.integrity_checks} checks "
                f"{'ok' if not any('integrity' in f for f in self.failures) else 'FAILED'}; audit {result}")


class Round:
    """One round: fresh state directories, receiver record and processes, faults until ``budget``
    is used or the pipelines drain, then the audit."""

    def __init__(self, options: Options, number: int, rng: random.Random, proxy: FaultProxy, audit: Audit) -> None:
        self.options, self.rng, self.proxy, self.audit = options, rng, proxy, audit
        self.directory = options.directory / f"round{number}"
        self.directory.mkdir(parents=True)
        self.nats: Any = None
        if options.cluster:  # a fresh server each round: the pipeline's streams start empty
            from tests.nats_server import NatsServer
            self.nats = NatsServer(self.directory / "nats").start()
        self.receiver = ReceiverProcess(self.directory / "received.jsonl")
        self.flights_data, self.expected_keys = write_flights(self.directory, options.rows)
        retryable_spec, self.expected_totals = write_retryable(self.directory, rng, options.events)
        self.nats_restarts: list[tuple[float, float]] = []
        self.first_request = 0.0
        self.recoveries: list[tuple[float, Callable[[], None]]] = []  # (monotonic time, the end of a fault)
        self.inside: float | None = None  # when the next fault is a flights kill inside an outage
        self.lease_watch: Any = None
        self.flights: list[EgressRun] = []
        if options.cluster:
            for number_ in range(1, options.workers + 1):
                self.flights.append(self._flights_run(f"w{number_}", (
                    "--engine", self.nats.url, "--worker-id", f"w{number_}", "--lease-ttl", f"{LEASE_TTL:g}")))
        else:
            self.flights.append(self._flights_run("flights", ()))
        self.retryable = EgressRun(
            "retryable", self.directory / "retryable-state", self.directory / "retryable.log",
            lambda run: egress_command(retryable_spec, self.directory / "retryable-state"),
            progressed=lambda run: state_signature(run.state) != run.started_signature)

    def _flights_run(self, name: str, extra: tuple[str, ...]) -> EgressRun:
        state = self.directory / f"{name}-state"
        dynamic = self.directory / "dynamic.yaml"
        dynamic.write_text(yaml.safe_dump(DYNAMIC_SPEC))
        if self.options.cluster:  # every worker must run the same Spec: one header value, and progress
            # is the cluster's (a request at the proxy since the worker started)
            return EgressRun(name, state, self.directory / f"{name}.log", lambda run: egress_command(
                flights_spec(self.directory, self.flights_data, self.proxy.port, "cluster/0"), state,
                "--dynamic-spec", str(dynamic), *extra), progressed=lambda run: self.proxy.last_request > run.started)
        return EgressRun(name, state, self.directory / f"{name}.log", lambda run: egress_command(
            flights_spec(self.directory, self.flights_data, self.proxy.port, f"{name}/{run}"), state,
            "--dynamic-spec", str(dynamic), *extra), progressed=lambda run: run.label in self.proxy.runs_seen)

    @property
    def runs(self) -> list[EgressRun]:
        return [*self.flights, self.retryable]

    def play(self, budget: int) -> int:
        """Start everything, inject up to ``budget`` faults while something runs; returns how many."""
        self.proxy.upstream_port = self.receiver.start()
        handled = len(self.proxy.attempts)
        if self.options.cluster:  # from the start: the first hand-overs (a worker joining) too
            from tests.e2e.test_cluster_faults import LeaseWatch
            pipeline = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())["pipeline"]
            self.lease_watch = LeaseWatch([self.nats.url], pipeline, FLIGHTS_COMPUTATION)
        for run in self.runs:
            run.start()
        self.wait_for_delivery(handled)
        injected = 0
        while injected < budget and not self._finished():
            inside, self.inside = self.inside, None
            self.sleep(self.rng.uniform(*FAULT_GAP) if inside is None else max(0.0, inside - time.monotonic()))
            if self._finished():
                break
            kind = self._inject(kill_flights=inside is not None)
            if kind:
                self.audit.faults[kind] += 1
                injected += 1
        self.recover(everything=True)
        self.proxy.clear()
        return injected

    def later(self, seconds: float, recovery: Callable[[], None]) -> None:
        """Run ``recovery`` (the end of a fault) ``seconds`` from now, while other faults go on."""
        self.recoveries.append((time.monotonic() + seconds, recovery))

    def recover(self, *, everything: bool = False) -> None:
        """Run the recoveries that are due (all of them with ``everything``), in time order."""
        self.recoveries.sort(key=lambda item: item[0])
        while self.recoveries and (everything or self.recoveries[0][0] <= time.monotonic()):
            self.recoveries.pop(0)[1]()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, ending faults when they are due meanwhile."""
        deadline = time.monotonic() + seconds
        while (now := time.monotonic()) < deadline:
            self.recover()
            due = min([deadline, *(when for when, _ in self.recoveries)])
            time.sleep(max(0.0, due - now))
        self.recover()

    def wait_for_delivery(self, handled: int) -> None:
        """Wait until the proxy got a request of this round: the faults land while flights flow."""
        deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT
        while len(self.proxy.attempts) == handled:
            if self._finished() or time.monotonic() > deadline:
                raise HarnessFailure(f"no flights request within {FIRST_REQUEST_TIMEOUT:g} s:\n"
                                     f"{self.flights[0].tail()}")
            time.sleep(0.01)
        self.first_request = time.monotonic()

    def _finished(self) -> bool:
        """Whether every process ended; one that ended by itself with an error fails the audit."""
        for run in self.runs:
            if not run.done and run.process is not None and run.process.poll() is not None:
                code = run.process.returncode
                if code != 0:
                    raise HarnessFailure(f"{run.name} exited {code} by itself:\n{run.tail()}")
                run.done = True
                run.finished = time.monotonic()
        return all(run.done for run in self.runs)

    def outage(self, seconds: float) -> float:
        """A failure episode of ``seconds`` begins: the next fault is a SIGKILL of the flights process
        at a random moment from inside it to 1.5 s after it (failed attempts waiting to be retried
        while other deliveries are acknowledged and committed: the case at-least-once delivery is
        hardest on). Returns ``seconds``."""
        self.inside = time.monotonic() + self.rng.uniform(0.2 * seconds, seconds + 1.5)
        return seconds

    def _inject(self, *, kill_flights: bool = False) -> str:
        running = [run for run in self.runs if run.working()]
        flights = [run for run in self.flights if run.working()]
        if kill_flights and flights:
            self.kill(self.rng.choice(flights))
            return "worker_kill" if self.options.cluster else "egress_kill"
        kinds = ["egress_kill"] if running else []
        kinds += ["egress_stop"] if any(not run.stopped for run in running) else []
        if any(run.working() for run in self.flights):
            kinds += [kind for kind in NETWORK_KINDS if kind != "receiver_kill" or self.receiver.process is not None]
            if self.options.cluster:
                kinds += CLUSTER_KINDS
        if not kinds:
            return ""
        kind = self.rng.choice(kinds)
        if kind in ("egress_kill", "worker_kill"):
            targets = [run for run in running if kind == "egress_kill" or run in self.flights]
            self.kill(self.rng.choice(targets or running))
        elif kind == "egress_stop":
            self.stop_for_a_while(self.rng.choice([run for run in running if not run.stopped]))
        elif kind == "receiver_kill":
            self.receiver.kill()
            self.later(self.outage(self.rng.uniform(0.2, 1.5)), self.restart_receiver)
        elif kind == "http_5xx":
            self.proxy.answer((500, 502, 503), self.outage(self.rng.uniform(0.3, 2.0)), self.rng.uniform(0.3, 1.0))
        elif kind == "http_429":
            self.proxy.answer((429,), self.outage(self.rng.uniform(0.3, 2.0)), self.rng.uniform(0.3, 1.0))
        elif kind == "slow":
            self.proxy.slow_down(self.rng.uniform(1.0, 3.0))
        elif kind == "stall":
            self.proxy.stall(self.rng.randint(1, 8))
        elif kind == "reset":
            self.proxy.reset(self.rng.randint(1, 20))
        elif kind == "nats_restart":
            started = time.time()
            self.nats.kill()

            def restart_nats() -> None:
                self.nats.start()
                self.nats_restarts.append((started, time.time()))
            self.later(self.rng.uniform(0.2, 1.0), restart_nats)
        return kind

    def stop_for_a_while(self, run: EgressRun) -> None:
        """SIGSTOP ``run``'s process now and SIGCONT it 0.2 to 1.5 s later (unless it was killed since)."""
        process = run.process
        assert process is not None
        started = time.time()
        process.send_signal(signal.SIGSTOP)
        run.stopped = True

        def resume() -> None:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
            if run.process is process:
                run.stopped = False
            run.stops.append((started, time.time()))
        self.later(self.rng.uniform(0.2, 1.5), resume)

    def restart_receiver(self) -> None:
        self.proxy.upstream_port = self.receiver.start()

    def kill(self, run: EgressRun) -> None:
        """SIGKILL ``run``, read what it left in flight, check its state files, restart it."""
        assert run.process is not None
        run.process.send_signal(signal.SIGKILL)
        run.process.wait()
        killed = time.time()
        in_flight = None
        if run.name == "flights" and (run.state / "egress.sqlite3").exists():
            in_flight = read_in_flight(run.state).keys  # the committed, unacknowledged outbox: resent
        run.kills.append(Kill(killed, run.runs - 1, in_flight))
        self.check_integrity(run.state, f"after a kill of {run.name}")
        run.start()

    def check_integrity(self, state: Path, when: str) -> None:
        self.audit.integrity_checks += 1
        for problem in integrity_problems(state):
            self.audit.failures.append(f"integrity {when}: {problem}")

    def drain(self) -> None:
        """Wait for every process to exit 0 (the faults are over)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while not self._finished():
            if time.monotonic() > deadline:
                stuck = [run.name for run in self.runs if not run.done]
                raise HarnessFailure(f"{', '.join(stuck)} did not drain within {DRAIN_TIMEOUT:g} s after the "
                                     f"faults:\n" + "\n".join(run.tail() for run in self.runs if not run.done))
            time.sleep(0.05)

    def stop(self) -> None:
        for run in self.runs:
            if run.process is not None:
                stop_process(run.process)
        self.receiver.kill()
        if self.lease_watch is not None:
            self.lease_watch.stop()
        if self.nats is not None:
            self.nats.stop()

    # -- the audit --

    def check(self) -> None:
        self.audit.rounds += 1
        for run in self.runs:
            self.check_integrity(run.state, f"at the end of round {self.directory.name}")
        self.check_flights()
        self.check_retryable()

    def check_flights(self) -> None:
        audit = self.audit
        records = [orjson.loads(line) for line in self.receiver.record.read_bytes().splitlines() if line]
        delivered = sorted((r for r in records if 200 <= r["status"] <= 299), key=lambda r: r["time"])
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        bodies: dict[str, set[str]] = defaultdict(set)
        for record in delivered:
            by_key[record["idempotency_key"]].append(record)
            bodies[record["idempotency_key"]].add(record["body_sha256"])
        lost = self.expected_keys.keys() - by_key.keys()
        unexpected = by_key.keys() - self.expected_keys.keys()
        audit.expected += len(self.expected_keys)
        audit.delivered += len(self.expected_keys.keys() & by_key.keys())
        audit.lost += len(lost)
        audit.unexpected += len(unexpected)
        if lost:
            audit.failures.append(f"{len(lost)} flights lost in {self.directory.name}, e.g. {sorted(lost)[:3]}")
        if unexpected:
            audit.failures.append(f"{len(unexpected)} unexpected keys, e.g. {sorted(unexpected)[:3]}")
        changed = [key for key, found in bodies.items() if len(found) > 1]
        if changed:
            audit.failures.append(f"{len(changed)} keys sent with several bodies, e.g. {changed[:3]}")
        unexplained = []
        for key, deliveries in by_key.items():
            for before, after in itertools.pairwise(deliveries):
                cause = self.duplicate_cause(key, before, after)
                audit.duplicates[cause] += 1
                if cause == "unexplained":
                    unexplained.append((key, before["headers"].get(RUN_HEADER), after["headers"].get(RUN_HEADER)))
        if unexplained:
            audit.failures.append(f"{len(unexplained)} unexplained duplicates (key, run, later run), "
                                  f"e.g. {unexplained[:3]}")

    def duplicate_cause(self, key: str, before: dict[str, Any], after: dict[str, Any]) -> str:
        """Why ``key`` was delivered again after ``before``: the first fault that explains it."""
        attempt = self.proxy.attempts.get(int(before["headers"].get(ATTEMPT_HEADER, 0)))
        if attempt is None or attempt.outcome != "passed":
            return "network"  # the sink never got this 2xx whole
        if attempt.seconds >= TIMEOUT_SHARE * ATTEMPT_TIMEOUT:
            return "timeout"
        first, again = before["time"], after["time"]
        (name, first_run), (again_name, again_run) = (
            (label.split("/")[0], int(label.split("/")[1])) for label in (before["headers"][RUN_HEADER],
                                                                            after["headers"][RUN_HEADER]))
        for run in self.flights:
            # a kill of a run from the first delivery's on, before the second's, with the key in flight
            if name == again_name == run.name and any(
                    kill.in_flight is not None and first_run <= kill.run < again_run and key in kill.in_flight
                    for kill in run.kills):
                return "kill"
            if any(stopped <= again and resumed >= first for stopped, resumed in run.stops):
                return "stop"
        if self.lease_watch is not None:  # its partition changed hands in between (a lease taken over or handed on)
            partition = self.expected_keys.get(key)
            if any(changed == partition and first - IN_FLIGHT_SLACK <= changed_before and changed_after <= again
                   for changed_after, changed_before, changed in self.lease_watch.changes):
                return "handover"
        if any(stopped <= again and restarted >= first - IN_FLIGHT_SLACK for stopped, restarted in self.nats_restarts):
            return "nats"
        return "unexplained"

    def check_retryable(self) -> None:
        state = self.retryable.state
        found = totals(state)
        if found != dict(self.expected_totals):
            wrong = {key: (found.get(key), value) for key, value in self.expected_totals.items()
                     if found.get(key) != value}
            self.audit.failures.append(f"retryable totals wrong in {self.directory.name} (key: found, expected): "
                                       f"{dict(list(wrong.items())[:3])}")
        left = list(state_lines(state, internal=True, external=False))
        if left:
            self.audit.failures.append(f"retryable: {len(left)} requests left in retry state")


class HarnessFailure(Exception):
    """A run failed in a way that ends the round (exited by itself, did not drain)."""


def run_chaos(options: Options) -> Audit:
    """Inject ``options.faults`` faults over as many rounds as it takes; the audit of them all."""
    rng = random.Random(options.seed)
    audit = Audit()
    proxy = FaultProxy(rng.randrange(2**32))
    try:
        injected, number = 0, 0
        while injected < options.faults or number == 0:
            round_ = Round(options, number, rng, proxy, audit)
            try:
                started = time.monotonic()
                injected += round_.play(options.faults - injected)
                faulted = time.monotonic()
                round_.drain()
                ends = ", ".join(f"{run.name} {run.finished - started:.1f} s" for run in round_.runs)
                outcomes = Counter(attempt.outcome for attempt in proxy.attempts.values())
                print(f"round {number}: first request after {round_.first_request - started:.1f} s, "
                      f"faults until {faulted - started:.1f} s; drained: {ends}; proxy (all rounds): "
                      f"{dict(outcomes)}", flush=True)
                round_.check()
            except HarnessFailure as failure:
                audit.failures.append(str(failure))
                print(str(failure), file=sys.stderr)
                break
            finally:
                round_.stop()
            print(f"round {number}: {injected} faults so far, {audit.delivered} flights delivered, "
                  f"{sum(audit.duplicates.values())} duplicates, failures: {len(audit.failures)}", flush=True)
            number += 1
    finally:
        proxy.close()
    return audit


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: random)")
    parser.add_argument("--faults", type=int, default=100, help="faults to inject in all (default 100)")
    parser.add_argument("--rows", type=int, default=None, help="flights rows per round (default: all 27,004)")
    parser.add_argument("--events", type=int, default=20_000, help="retryable events per round (default 20,000)")
    parser.add_argument("--cluster", action="store_true", help="flights on NATS workers; worker and nats faults")
    parser.add_argument("--workers", type=int, default=2, help="flights workers with --cluster (default 2)")
    parser.add_argument("--directory", type=Path, default=None, help="work directory (default: a temporary one)")
    return parser.parse_args(argv)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    seed = arguments.seed if arguments.seed is not None else random.SystemRandom().randrange(2**31)
    directory = arguments.directory or Path(tempfile.mkdtemp(prefix="egress-chaos-"))
    directory.mkdir(parents=True, exist_ok=True)
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, _exit_on_signal)  # as Ctrl-C: every process started is stopped on the way out
    print(f"chaos: seed {seed}, {arguments.faults} faults, work directory {directory}", flush=True)
    options = Options(seed, arguments.faults, arguments.rows, arguments.events, arguments.cluster,
                      arguments.workers, directory)
    started = time.monotonic()
    audit = run_chaos(options)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(audit.summary(seed, time.monotonic() - started), flush=True)
    if audit.failures:
        print(f"work directory kept: {directory}; replay with --seed {seed}", file=sys.stderr)
        return 1
    if arguments.directory is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
